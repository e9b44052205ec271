"""Run one benchmark against two checkouts of this project, interleaved, to compare a change with
the code before it on the same machine in the same hour.

Run: .venv/bin/python tests/benchmarks/side_by_side.py --base DIR [--rounds 2] BENCH.py [ARGS...]

``DIR`` is another checkout (e.g. ``git worktree add /tmp/base <commit>``). Each round runs
``DIR/tests/benchmarks/BENCH.py ARGS`` with ``PYTHONPATH=DIR``, then this checkout's, in turns
(the order flips every round, so neither side always runs on a warmer machine), and prints each
run's output under a header. Both sides use this interpreter and its installed packages; only
the project's own code differs. Nothing else is set in the environment.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]


def run_one(tree: Path, bench: str, args: list[str]) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH")) if p)}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, str(tree / "tests" / "benchmarks" / bench), *args], cwd=tree, env=env,
                         capture_output=True, text=True)
    text = out.stdout + (f"\n[stderr, exit {out.returncode}]\n{out.stderr[-3000:]}" if out.returncode else "")
    return time.monotonic() - t0, text


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, type=Path, help="the other checkout")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("bench", help="a file in tests/benchmarks/, e.g. bench_cli.py")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    sides = {"base": a.base.resolve(), "this": HERE}
    for round_ in range(a.rounds):
        order = ["base", "this"] if round_ % 2 == 0 else ["this", "base"]
        for side in order:
            wall, text = run_one(sides[side], a.bench, a.args)
            print(f"===== round {round_ + 1}: {side} ({sides[side]}), {wall:.0f} s =====\n{text}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
