"""Rank runtime and local executor against their peers, side by side in one run.

Run: .venv/bin/python tests/benchmarks/bench_runtime.py [--repeat 3] [--only launch|throughput|allreduce]

1. launch: wall time from starting the launcher to the first all_reduce done on every rank, for
   N = 2 and 4, interleaved: the floor (N parallel processes importing torch, timed to the end
   of the import), `torchrun --standalone`, and `orchestrator run` (local executor). The rank
   code is the same torchrun-style script for both launchers. Also reported: start to the
   launcher and every rank exited (the floor: its interpreters exited), which includes what
   each rank spends ending.
   Targets: <= 1.1x the floor, <= 0.6x torchrun.
2. throughput: jobs.train (2 ranks via `orchestrator run`) against a hand-written DDP loop with
   the same model, data, batch and optimizer, launched by torchrun. Target >= 0.98x.
3. allreduce: jobs.allreduce at 64 MB (2 ranks via `orchestrator run`) against a bare
   torch.distributed loop. Target >= 0.95x.
4. threads: the embedded demo with the defaults a user gets against the same demo with
   OMP_NUM_THREADS set by hand (1, cores/4, cores/2, cores). Target <= 1.15x the best.

Nothing here sets an environment variable a user would not set, on either side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PY = sys.executable
ORCH = [PY, "-m", "orchestrator"]
TORCHRUN = [PY, "-m", "torch.distributed.run", "--standalone"]
#: The sizes of one round; ``--smoke`` shrinks them to prove the benchmark still runs (the suite's
#: tests/integration/test_benchmarks_smoke.py), its figures then meaning nothing.
SIZES = {"launch_ranks": (2, 4), "epochs": 15, "allreduce_mb": 64, "thread_variants": 4, "demo_epochs": 12}
SMOKE = {"launch_ranks": (2,), "epochs": 2, "allreduce_mb": 1, "thread_variants": 1, "demo_epochs": 1}
# What a user's shell gives: nothing set that a user would not set (OMP_NUM_THREADS above all:
# setting it on both sides once hid a default that made the demo 3.3x slower).
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def run_quiet(cmd: list[str], attempts: int = 2, env: dict[str, str] | None = None) -> None:
    """Run a launcher; on failure show its stderr, and retry once (torchrun's standalone
    rendezvous occasionally aborts on this machine right after another torchrun)."""
    for attempt in range(attempts):
        proc = subprocess.run(cmd, env=env or ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if proc.returncode == 0:
            return
        tail = "\n".join(proc.stderr.splitlines()[-8:])
        print(f"[bench] {' '.join(cmd[:4])}... failed (attempt {attempt + 1}):\n{tail}", file=sys.stderr)
    raise RuntimeError(f"{cmd} kept failing")


def _spec(tmp: Path, **fields: object) -> Path:
    path = tmp / f"spec-{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump({"name": "bench", "runs_dir": str(tmp / "runs"), **fields}))
    return path


def _rank_times(out: Path, n: int) -> tuple[float, float]:
    rows = [tuple(map(float, (out / f"rank-{r}.txt").read_text().split())) for r in range(n)]
    return max(r[0] for r in rows), max(r[1] for r in rows)


def launch_once(kind: str, n: int, tmp: Path) -> tuple[float, float]:
    """(start -> first all_reduce done on every rank, start -> the launcher and every rank exited)."""
    out = Path(tempfile.mkdtemp(dir=tmp))
    script = str(HERE / "first_allreduce.py")
    if kind == "floor":
        code = "import time, torch, sys; open(sys.argv[1], 'w').write(f'{time.time()} {time.time()}')"
        t0 = time.time()
        procs = [subprocess.Popen([PY, "-c", code, str(out / f"rank-{r}.txt")], env=ENV) for r in range(n)]
        for p in procs:
            p.wait()
        return _rank_times(out, n)[0] - t0, time.time() - t0
    if kind == "torchrun":
        cmd = [*TORCHRUN, f"--nproc-per-node={n}", script, "--out", str(out)]
    else:
        spec = _spec(tmp, entrypoint=script, cpu_ranks_per_node=n, extra_args=["--out", str(out)])
        cmd = [*ORCH, "run", str(spec)]
    t0 = time.time()
    run_quiet(cmd, attempts=1)
    return _rank_times(out, n)[1] - t0, time.time() - t0


def bench_launch(repeat: int, tmp: Path) -> None:
    print("\n== launch to first all_reduce, and to every process exited (s, median) ==")
    kinds = ("floor", "torchrun", "orchestrator")
    for n in SIZES["launch_ranks"]:
        first: dict[str, list[float]] = {k: [] for k in kinds}
        ended: dict[str, list[float]] = {k: [] for k in kinds}
        for _ in range(repeat):
            for kind in kinds:
                a, b = launch_once(kind, n, tmp)
                first[kind].append(a)
                ended[kind].append(b)
        med = {k: statistics.median(v) for k, v in first.items()}
        end = {k: statistics.median(v) for k, v in ended.items()}
        print(f"N={n}: floor {med['floor']:.2f}  torchrun {med['torchrun']:.2f}  orchestrator {med['orchestrator']:.2f}"
              f"  -> {med['orchestrator'] / med['floor']:.2f}x floor (target <= 1.1), "
              f"{med['orchestrator'] / med['torchrun']:.2f}x torchrun (target <= 0.6)")
        print(f"N={n} to exit: floor {end['floor']:.2f}  torchrun {end['torchrun']:.2f}  "
              f"orchestrator {end['orchestrator']:.2f}  -> {end['orchestrator'] / end['torchrun']:.2f}x torchrun")


def bench_throughput(repeat: int, tmp: Path) -> None:
    print("\n== training throughput, 2 ranks, smallcnn on digits, batch 32/rank (samples/s per rank) ==")
    ours, hand = [], []
    for _ in range(repeat):
        out = Path(tempfile.mkdtemp(dir=tmp))
        run_quiet([*TORCHRUN, "--nproc-per-node=2", str(HERE / "hand_ddp_loop.py"), "--epochs", str(SIZES["epochs"]), "--out", str(out)])
        hand.append(statistics.mean(statistics.mean(json.loads((out / f"hand-{r}.json").read_text())[1:]) for r in range(2)))
        spec = _spec(tmp, entrypoint="jobs.train:main", cpu_ranks_per_node=2,
                     args={"dataset": "digits", "epochs": SIZES["epochs"], "batch-size": 32, "log-every": 1000},
                     checkpoint={"keep_last": 1})
        run_quiet([*ORCH, "run", str(spec)])
        run_dir = max((tmp / "runs").glob("bench-*"), key=lambda p: p.stat().st_mtime)
        rates = []
        for r in range(2):
            rows = [json.loads(line) for line in (run_dir / "metrics" / f"rank-{r}.jsonl").read_text().splitlines()]
            rates.append(statistics.mean([x["samples_per_s"] for x in rows if x["kind"] == "throughput"][1:]))
        ours.append(statistics.mean(rates))
    h, o = statistics.median(hand), statistics.median(ours)
    print(f"hand-written DDP {h:.0f}  jobs.train {o:.0f}  -> {o / h:.3f}x (target >= 0.98)  "
          "[first epoch excluded from both: warm-up]")


def bench_allreduce(repeat: int, tmp: Path) -> None:
    print(f"\n== all-reduce bandwidth at {SIZES['allreduce_mb']} MB, 2 ranks gloo loopback (GB/s algbw, median) ==")
    ours, bare = [], []
    for _ in range(repeat):
        out = Path(tempfile.mkdtemp(dir=tmp))
        run_quiet([*TORCHRUN, "--nproc-per-node=2", str(HERE / "bare_allreduce.py"), "--size-mb", str(SIZES["allreduce_mb"]), "--out", str(out)])
        bare.append(json.loads((out / "bare.json").read_text())["gbps"])
        spec = _spec(tmp, entrypoint="jobs.allreduce:main", cpu_ranks_per_node=2,
                     args={"sizes-mb": [SIZES["allreduce_mb"]], "iters": 10})
        run_quiet([*ORCH, "run", str(spec)])
        run_dir = max((tmp / "runs").glob("bench-*"), key=lambda p: p.stat().st_mtime)
        ours.append(json.loads((run_dir / "allreduce.json").read_text())["rows"][0]["algbw_gbps"])
    b, o = statistics.median(bare), statistics.median(ours)
    print(f"bare loop {b:.3f}  jobs.allreduce {o:.3f}  -> {o / b:.3f}x (target >= 0.95)")


def bench_threads(repeat: int, tmp: Path) -> None:
    """The embedded demo (2 emulated nodes x 2 CPU ranks) with the defaults a user gets, against
    the same demo with OMP_NUM_THREADS set by hand to each sensible value, interleaved."""
    print("\n== demo wall time: defaults vs hand-set OMP_NUM_THREADS (s, median) ==")
    demo = ROOT / "orchestrator" / "examples" / "demo.yaml"
    cores = os.cpu_count() or 1
    variants: dict[str, dict[str, str]] = {"defaults": ENV}
    for n in sorted({1, max(1, cores // 4), max(1, cores // 2), cores})[:SIZES["thread_variants"]]:
        variants[f"OMP_NUM_THREADS={n}"] = {**ENV, "OMP_NUM_THREADS": str(n)}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(repeat):
        for name, env in variants.items():
            t0 = time.monotonic()
            run_quiet([*ORCH, "run", str(demo), "--set", f"runs_dir={tmp / 'runs'}",
                       "--set", f"args.epochs={SIZES['demo_epochs']}", "--fresh"], env=env)
            times[name].append(time.monotonic() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    best = min((v, k) for k, v in med.items() if k != "defaults")
    print("  ".join(f"{k} {v:.1f}" for k, v in med.items()))
    print(f"defaults {med['defaults']:.1f}s vs best hand-set ({best[1]}) {best[0]:.1f}s -> "
          f"{med['defaults'] / best[0]:.2f}x (target <= 1.15)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=["launch", "throughput", "allreduce", "threads"])
    ap.add_argument("--smoke", action="store_true", help="one round at the smallest sizes: does it still run?")
    args = ap.parse_args()
    if args.smoke:
        SIZES.update(SMOKE)
        args.repeat = 1
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.only in (None, "launch"):
            bench_launch(args.repeat, tmp)
        if args.only in (None, "throughput"):
            bench_throughput(args.repeat, tmp)
        if args.only in (None, "allreduce"):
            bench_allreduce(args.repeat, tmp)
        if args.only in (None, "threads"):
            bench_threads(args.repeat, tmp)


if __name__ == "__main__":
    main()
