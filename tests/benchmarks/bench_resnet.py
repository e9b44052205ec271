"""Training throughput with the runtime's defaults: resnet18, CIFAR-sized data, 2 CPU ranks, gloo.

Run: .venv/bin/python tests/benchmarks/bench_resnet.py [--repeat 3] [--steps 20] [--batch 64] [--tune]

Side by side in one run, interleaved in each repeat (samples/s per rank = batch / the first
quartile of the step times after warm-up, so that steps slowed by other processes on a shared
machine do not count; the median over repeats):
1. runtime: a training loop on the rank API (``jobs.process_group`` + ``jobs.wrap_model`` with its
   defaults, exactly what a user script and ``jobs.train`` get), launched as users do:
   ``orchestrator run SPEC`` (local executor, 1 node x 2 CPU ranks).
2. hand: the same loop with a hand-written ``init_process_group("gloo")`` and a plain
   ``DistributedDataParallel(model)``, launched by ``torchrun --standalone --nproc-per-node 2``.
3. bound: the same loop in 2 processes that never communicate (no process group, no DDP),
   launched by the same torchrun: what 2 ranks could do with free communication.

``--tune`` then compares DDP options given to wrap_model on top of its defaults
(gradient_as_bucket_view, static_graph, bucket_cap_mb, batched_grad_copy, and plain DDP) paired
in one launch through the orchestrator: one DDP model per candidate, stepped in turns, so that
other load on the machine slows every candidate alike (separate launches of each option differed
by more than the options do).

Each line also shows the ranks' page faults per timed step and peak RSS: the runtime's ranks get
the C heap defaults (``orchestrator.node.malloc``), so freed activations are kept for the next step
instead of being handed back to the kernel and faulted in again.

Every variant runs the same model (torchvision resnet18, num_classes=10), the same in-memory
batches (64 x 3x32x32 per rank, generated, nothing downloaded), SGD with momentum. Nothing here
sets an environment variable a user would not set: the orchestrator gives each rank its default
thread count (cores / local ranks) and heap settings, torchrun sets OMP_NUM_THREADS=1 itself.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
PY = sys.executable
TORCHRUN = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
# What a user's shell gives, plus finding this checkout.
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
BATCH = 64  # per rank; --batch sets it (the suite's smoke run takes a small one)

# name -> DDP options given to wrap_model on top of its defaults (None: the defaults as they are).
TUNE: dict[str, dict[str, Any]] = {
    "plain DDP (no options)": {"gradient_as_bucket_view": False, "static_graph": False},
    "gradient_as_bucket_view": {"gradient_as_bucket_view": True, "static_graph": False},
    "static_graph": {"gradient_as_bucket_view": False, "static_graph": True},
    "bucket_view+static_graph": {"gradient_as_bucket_view": True, "static_graph": True},
    "bucket_cap_mb=5": {"bucket_cap_mb": 5},
    "bucket_cap_mb=50": {"bucket_cap_mb": 50},
    "bucket_cap_mb=100": {"bucket_cap_mb": 100},
    "batched_grad_copy": {"batched_grad_copy": True},
}


def _set_batch(n: int) -> None:
    global BATCH
    BATCH = n


# ---------------------------------------------------------------- on every rank
def _batches(n: int = 4) -> list[tuple[Any, Any]]:
    import torch

    g = torch.Generator().manual_seed(int(os.environ.get("RANK", "0")))
    return [(torch.randn(BATCH, 3, 32, 32, generator=g), torch.randint(0, 10, (BATCH,), generator=g))
            for _ in range(n)]


def _loop(model: Any, warmup: int, steps: int) -> tuple[list[float], float]:
    """Seconds of each of ``steps`` training steps after ``warmup`` untimed ones, and the page
    faults per timed step (memory the C heap handed back to the kernel and took again)."""
    import resource

    import torch

    batches = _batches()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    times = []
    faults = 0
    for i in range(warmup + steps):
        if i == warmup:
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        x, y = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps


def _max_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def tune_worker(rounds: int, out: str) -> None:
    """Paired comparison in one launch (through the orchestrator, on jobs.wrap_model): one DDP model
    per candidate, stepped in turns (3 steps each, ``rounds`` times), so that whatever else runs on
    the machine slows every candidate alike. Writes each candidate's step times."""
    import torch
    from torchvision.models import resnet18

    import jobs

    with jobs.process_group() as ctx:
        models = {}
        accepted = inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
        for name, options in {"wrap_model defaults": {}, **TUNE}.items():
            if not set(options) <= set(accepted):
                continue  # an option this torch does not have (batched_grad_copy before 2.14)
            torch.manual_seed(0)
            models[name] = jobs.wrap_model(resnet18(num_classes=10), ctx, **options)
        batches = _batches()
        opts = {k: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for k, m in models.items()}
        times: dict[str, list[float]] = {k: [] for k in models}
        for r in range(rounds + 1):  # round 0: warm-up (DDP lays its buckets out in the first steps)
            for name, model in models.items():
                for i in range(3):
                    t0 = time.perf_counter()
                    x, y = batches[i % len(batches)]
                    opts[name].zero_grad(set_to_none=True)
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                    opts[name].step()
                    if r:
                        times[name].append(time.perf_counter() - t0)
        Path(out, f"tune-{ctx.rank}.json").write_text(json.dumps(times))


def worker(mode: str, warmup: int, steps: int, out: str, ddp: dict[str, Any]) -> None:
    import torch
    from torchvision.models import resnet18

    torch.manual_seed(0)
    net = resnet18(num_classes=10)
    if mode == "runtime":
        import jobs

        with jobs.process_group() as ctx:
            times, faults = _loop(jobs.wrap_model(net, ctx, **ddp), warmup, steps)
    elif mode == "hand":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
        times, faults = _loop(DistributedDataParallel(net), warmup, steps)
        dist.destroy_process_group()
    else:  # bound: no process group, no DDP
        times, faults = _loop(net, warmup, steps)
    rank = os.environ.get("RANK", "0")
    # The first quartile of the step times: steps slowed by other processes on this shared machine
    # do not count, and no single lucky step decides.
    fast = statistics.quantiles(times, n=4)[0]
    Path(out, f"rank-{rank}.json").write_text(json.dumps({"samples_per_s": BATCH / fast,
                                                          "threads": torch.get_num_threads(),
                                                          "faults_per_step": faults,
                                                          "max_rss_mb": _max_rss_mb()}))


# ---------------------------------------------------------------- the driver
def _run(cmd: list[str]) -> None:
    for attempt in range(2):  # torchrun's standalone rendezvous occasionally aborts right after another
        proc = subprocess.run(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if proc.returncode == 0:
            return
        tail = "\n".join(proc.stderr.splitlines()[-10:])
        print(f"[bench] {' '.join(cmd[:5])}... failed (attempt {attempt + 1}):\n{tail}", file=sys.stderr)
    raise RuntimeError(f"{cmd} kept failing; its stderr is above")


def measure(kind: str, args: argparse.Namespace, tmp: Path, ddp: dict[str, Any] | None = None) -> tuple[float, int, float, float]:
    """Mean samples/s per rank of one launch, the ranks' thread count, page faults per step and
    peak RSS (MB)."""
    out = Path(tempfile.mkdtemp(dir=tmp))
    rank_args = ["worker", "--mode", kind, "--warmup", str(args.warmup), "--steps", str(args.steps),
                 "--out", str(out), "--ddp", json.dumps(ddp or {}), "--batch", str(BATCH)]
    if kind == "runtime":
        spec = tmp / f"spec-{time.monotonic_ns()}.json"
        spec.write_text(json.dumps({"name": "bench-resnet", "runs_dir": str(tmp / "runs"), "entrypoint": str(HERE),
                                    "cpu_ranks_per_node": 2, "extra_args": rank_args}))
        _run([PY, "-m", "orchestrator", "run", str(spec), "--fresh"])
    else:
        _run([*TORCHRUN, str(HERE), *rank_args])
    rows = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]
    return (statistics.mean(r["samples_per_s"] for r in rows), rows[0]["threads"],
            statistics.mean(r["faults_per_step"] for r in rows), max(r["max_rss_mb"] for r in rows))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per launch")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (DDP's first steps lay buckets out)")
    ap.add_argument("--tune", action="store_true", help="also measure each candidate DDP option, paired in one launch")
    ap.add_argument("--rounds", type=int, default=6, help="--tune: turns of 3 steps per candidate")
    ap.add_argument("--batch", type=int, default=BATCH, help="samples per rank and step")
    args = ap.parse_args()
    _set_batch(args.batch)
    import jobs.parallel

    variants: dict[str, tuple[str, dict[str, Any] | None]] = {
        "runtime (defaults)": ("runtime", None), "hand DDP": ("hand", None), "bound": ("bound", None)}
    rates: dict[str, list[float]] = {k: [] for k in variants}
    threads: dict[str, int] = {}
    faults: dict[str, list[float]] = {k: [] for k in variants}
    rss: dict[str, float] = {}
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory() as d:
        for _ in range(args.repeat):
            for name, (kind, ddp) in variants.items():
                rate, threads[name], f, rss[name] = measure(kind, args, Path(d), ddp)
                rates[name].append(rate)
                faults[name].append(f)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"== resnet18, batch {BATCH}/rank, 3x32x32, 2 CPU ranks, gloo: samples/s per rank, median of "
          f"{args.repeat} (spread min-max), each from the first quartile of {args.steps} step times after {args.warmup} warm-up ==")
    print(f"wrap_model defaults: {jobs.parallel.DDP_DEFAULTS}")
    for name, v in rates.items():
        print(f"  {name:42s} {med[name]:7.1f}  ({min(v):.1f}-{max(v):.1f})  threads/rank {threads[name]}  "
              f"page faults/step {statistics.median(faults[name]):5.0f}  peak RSS {rss[name]:.0f} MB")
    rt, hand, bound = med["runtime (defaults)"], med["hand DDP"], med["bound"]
    print(f"runtime/hand {rt / hand:.3f}x (target >= 0.98)   runtime/bound {rt / bound:.3f}x   "
          f"hand/bound {hand / bound:.3f}x")
    if args.tune:
        tune(args)
    print(f"[{time.monotonic() - t_start:.0f}s wall]")


def tune(args: argparse.Namespace) -> None:
    """Each candidate DDP option against the others, paired in one launch (see tune_worker)."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        out = Path(tempfile.mkdtemp(dir=tmp))
        spec = tmp / "spec-tune.json"
        spec.write_text(json.dumps({"name": "bench-resnet-tune", "runs_dir": str(tmp / "runs"), "entrypoint": str(HERE),
                                    "cpu_ranks_per_node": 2,
                                    "extra_args": ["tune", "--rounds", str(args.rounds), "--out", str(out),
                                                   "--batch", str(BATCH)]}))
        _run([PY, "-m", "orchestrator", "run", str(spec), "--fresh"])
        per_rank = [json.loads((out / f"tune-{r}.json").read_text()) for r in range(2)]
    rate = {k: statistics.mean(BATCH / statistics.median(t[k]) for t in per_rank) for k in per_rank[0]}
    base = rate["plain DDP (no options)"]
    print(f"== DDP options through jobs.wrap_model, paired in one launch (samples/s per rank from the median "
          f"of {3 * args.rounds} steps each, taken in turns) ==")
    for name, value in rate.items():
        print(f"  {name:32s} {value:7.1f}  {value / base:.3f}x plain DDP")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "tune":
        tp = argparse.ArgumentParser()
        tp.add_argument("tune")
        tp.add_argument("--rounds", type=int, required=True)
        tp.add_argument("--out", required=True)
        tp.add_argument("--batch", type=int, default=BATCH)
        t = tp.parse_args()
        _set_batch(t.batch)
        tune_worker(t.rounds, t.out)
    elif len(sys.argv) > 1 and sys.argv[1] == "worker":
        wp = argparse.ArgumentParser()
        wp.add_argument("worker")
        wp.add_argument("--mode", choices=["runtime", "hand", "bound"], required=True)
        wp.add_argument("--warmup", type=int, required=True)
        wp.add_argument("--steps", type=int, required=True)
        wp.add_argument("--out", required=True)
        wp.add_argument("--ddp", default="{}")
        wp.add_argument("--batch", type=int, default=BATCH)
        w = wp.parse_args()
        _set_batch(w.batch)
        worker(w.mode, w.warmup, w.steps, w.out, json.loads(w.ddp))
    else:
        main()
