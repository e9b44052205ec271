"""What `framework:` costs next to the framework's own launcher (issue 22), side by side.

Run: .venv/bin/python tests/benchmarks/bench_frameworks.py [--rounds 3] [--ranks 2]

The same unmodified scripts, on one machine, CPU ranks with gloo, each started as its users
start it, alternated round by round, wall clock from the command's start to its exit:

- accelerate: its own shipped ``test_utils/scripts/test_sync.py``, by ``accelerate launch --cpu
  --num_processes N`` (the peer) and by ``orchestrator run`` of a spec with ``framework:
  accelerate`` and ``cpu_ranks_per_node: N``;
- transformers: the Trainer script of the tests (``tests/integration/scripts/fw_trainer.py``, a
  one-layer BERT on random data, 2 steps), by ``torchrun --nproc_per_node N ... --use_cpu`` (the
  peer; ``--use_cpu`` is what a Trainer user passes on a CPU machine) and by ``orchestrator run``
  with ``framework: transformers``.

Both sides write their logs; ours also writes its run folder, code snapshot, metrics and
failure report. Each figure is the median of the rounds; the ratio is ours over the peer's.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TRAINER = ROOT / "tests" / "integration" / "scripts" / "fw_trainer.py"


def accelerate_script() -> Path:
    found = importlib.util.find_spec("accelerate")
    assert found is not None and found.origin
    return Path(found.origin).parent / "test_utils" / "scripts" / "test_sync.py"


def timed(argv: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return took


def trainer_args(out: Path) -> list[str]:
    return ["--output_dir", str(out), "--max_steps", "2", "--per_device_train_batch_size", "2", "--report_to", "none",
            "--save_strategy", "no", "--disable_tqdm", "true"]


def ours(work: Path, name: str, ranks: int, entry: Path, args: dict[str, object]) -> list[str]:
    out = work / f"out-{name}-{time.monotonic_ns()}"
    out.mkdir()
    if "output_dir" in args:
        args = {**args, "output_dir": str(out)}
    spec = {"name": f"bench-{name}", "entrypoint": str(entry), "framework": name, "cpu_ranks_per_node": ranks,
            "runs_dir": str(work / "runs"), "args": args, **({"bool_args": "value"} if name == "transformers" else {})}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return [str(BIN / "orchestrator"), "run", "--fresh", str(path)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--only", choices=["accelerate", "transformers"], action="append",
                        help="these cases alone (default: all)")
    parser.add_argument("--smoke", action="store_true",
                        help="one round, no page-cache warm-up: does it still run? (its figures mean nothing)")
    opts = parser.parse_args()
    if opts.smoke:
        opts.rounds = 1
    work = Path(tempfile.mkdtemp(prefix="bench-fw-"))
    n = opts.ranks
    cases = {
        "accelerate": (
            lambda: [str(BIN / "accelerate"), "launch", "--cpu", "--num_processes", str(n), "--num_machines", "1",
                     "--mixed_precision", "no", "--dynamo_backend", "no", str(accelerate_script())],
            lambda: ours(work, "accelerate", n, accelerate_script(), {}),
        ),
        "transformers": (
            lambda: [str(BIN / "torchrun"), "--nproc_per_node", str(n), str(TRAINER),
                     *trainer_args(work / f"peer-{time.monotonic_ns()}"), "--use_cpu", "true"],
            lambda: ours(work, "transformers", n, TRAINER,
                         {"output_dir": "", "max_steps": 2, "per_device_train_batch_size": 2, "report_to": "none",
                          "save_strategy": "no", "disable_tqdm": True}),
        ),
    }
    print(f"{n} CPU ranks, {opts.rounds} rounds, {os.cpu_count()} cores; medians")
    print(f"{'case':<14}{'peer':>10}{'ours':>10}{'ours/peer':>11}")
    try:
        for name, (peer, orch) in cases.items():
            if opts.only and name not in opts.only:
                continue
            times: dict[str, list[float]] = {"peer": [], "ours": []}
            if not opts.smoke:
                timed(peer(), work)  # warm the page cache for both sides
            for _ in range(opts.rounds):
                times["peer"].append(timed(peer(), work))
                times["ours"].append(timed(orch(), work))
            p, o = statistics.median(times["peer"]), statistics.median(times["ours"])
            print(f"{name:<14}{p:>9.2f}s{o:>9.2f}s{o / p:>10.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
