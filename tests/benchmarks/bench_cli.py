"""Wall time of `orchestrator validate` and `plan` on an example spec.

Run: .venv/bin/python tests/benchmarks/bench_cli.py [--repeat 15]
Each command runs as a fresh process (what a user pays), interleaved with a bare
`python -c pass` and `python -c 'import pydantic'` so the ratios hold on a noisy machine.
Targets (issue 2): validate <= 0.3 s, plan <= 0.6 s. At scale (issue 10), a 4096-node x 8-GPU
spec: plan <= 0.6 s, plan --json <= 2 s, with 32,768 ranks.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "orchestrator" / "examples"


def bytecode_state() -> str:
    """Whether the orchestrator's modules have .pyc files. Without them every process (each CLI
    command, a SLURM job's agent, each rank) compiles the modules it imports: ~20-40 ms per
    command here. A regular pip install writes them; an editable install gets them on first
    import unless PYTHONDONTWRITEBYTECODE is set (it is, in this project's sandbox and CI)."""
    import importlib.util
    import os

    sys.path.insert(0, str(EXAMPLES.parents[1]))
    import orchestrator.node.launcher

    cached = importlib.util.cache_from_source(orchestrator.node.launcher.__file__)
    flag = os.environ.get("PYTHONDONTWRITEBYTECODE")
    return (f"{'present' if os.path.exists(cached) else 'absent'} "
            f"(PYTHONDONTWRITEBYTECODE {'set' if flag else 'unset'})")


def wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--spec", default=str(EXAMPLES / "tcp-2x8.yaml"))
    args = ap.parse_args()
    py = sys.executable
    big = Path(tempfile.mkdtemp()) / "big.yaml"
    big.write_text("name: big\nentrypoint: jobs.train:main\nexecutor: slurm\nnodes: 4096\ngpus_per_node: 8\n"
                   "slurm: {assume_shared_paths: true}  # planned only, never run\n"
                   f"runs_dir: {big.parent}\n")
    cases = {
        "python -c pass": [py, "-c", "pass"],
        "python -c 'import pydantic'": [py, "-c", "import pydantic"],
        "orchestrator validate": [py, "-m", "orchestrator", "validate", args.spec],
        "orchestrator plan": [py, "-m", "orchestrator", "plan", args.spec],
        "orchestrator plan --json": [py, "-m", "orchestrator", "plan", "--json", args.spec],
        "plan 4096x8": [py, "-m", "orchestrator", "plan", str(big)],
        "plan --json 4096x8": [py, "-m", "orchestrator", "plan", "--json", str(big)],
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.repeat):
        for name, cmd in cases.items():
            times[name].append(wall(cmd))
    base = statistics.median(times["python -c pass"])
    print(f"orchestrator bytecode: {bytecode_state()}")
    print(f"{'command':32} {'median s':>9} {'min s':>7} {'x bare python':>14}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:32} {med:9.3f} {min(ts):7.3f} {med / base:14.1f}")
    v, p = statistics.median(times["orchestrator validate"]), statistics.median(times["orchestrator plan"])
    print(f"\nvalidate {v:.3f} s (target <= 0.3): {'ok' if v <= 0.3 else 'OVER'}; "
          f"plan {p:.3f} s (target <= 0.6): {'ok' if p <= 0.6 else 'OVER'}")
    bp, bj = statistics.median(times["plan 4096x8"]), statistics.median(times["plan --json 4096x8"])
    print(f"4096 x 8: plan {bp:.3f} s (target <= 0.6): {'ok' if bp <= 0.6 else 'OVER'}; "
          f"plan --json {bj:.3f} s (target <= 2): {'ok' if bj <= 2 else 'OVER'}")


if __name__ == "__main__":
    main()
