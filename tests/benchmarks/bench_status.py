"""`orchestrator status` over many registered SLURM runs: its wall time and its scheduler calls.

Run: .venv/bin/python tests/benchmarks/bench_status.py [--runs 1000] [--repeat 3]

N runs are registered as `submit` leaves them (a record naming its job, state RUNNING, in a run
folder of its own), in a registry of their own. SLURM's `sacct` and `squeue` are stand-ins on
PATH that log each call and answer as a cluster would: half of the jobs COMPLETED, half still
RUNNING. Measured, each as a fresh process (what a user pays), interleaved:

- `status` with every run still open (the first look: each job is asked about),
- `status` again (the ended half was recorded: only the running half is asked about),
- the floor: `status RUN` of one run, the same interpreter and imports for one line.

Printed: seconds (median), the scheduler calls each made, and the ratio to the floor.
Target (issue 36): status of 1,000 runs <= 1 s, with one scheduler query.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

#: The stand-in sacct: every job id asked about, one row each (even ids COMPLETED, odd RUNNING);
#: each call is logged.
SACCT = r"""#!/usr/bin/env python3
import os, sys
with open(os.environ["BENCH_CALLS"], "a") as f:
    f.write("sacct\n")
ids = sys.argv[sys.argv.index("-j") + 1].split(",") if "-j" in sys.argv else []
for job in ids:
    print(f"{job}|{'COMPLETED' if int(job) % 2 == 0 else 'RUNNING'}")
"""
#: The stand-in squeue: lists nothing (the jobs are known to accounting), logged.
SQUEUE = r"""#!/usr/bin/env python3
import os
with open(os.environ["BENCH_CALLS"], "a") as f:
    f.write("squeue\n")
"""


def make_runs(base: Path, n: int) -> tuple[dict[str, str], str]:
    """N registered SLURM runs and the stand-in scheduler; the environment to run the CLI in and
    one run's id (for the floor)."""
    from orchestrator.core.records import RunRecord, register

    bin_dir, home, runs = base / "bin", base / "home", base / "runs"
    for d in (bin_dir, home, runs):
        d.mkdir(parents=True, exist_ok=True)
    for name, text in (("sacct", SACCT), ("squeue", SQUEUE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "ORCHESTRATOR_HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "BENCH_CALLS": str(base / "calls"), "PYTHONPATH": str(ROOT)}
    os.environ["ORCHESTRATOR_HOME"] = str(home)
    first = ""
    for i in range(n):
        run_id = f"bench-{i:05d}"
        folder = runs / run_id
        folder.mkdir()
        record = RunRecord(run_id=run_id, run_dir=str(folder), executor="slurm", state="RUNNING",
                           job_ids=[str(1000 + i)], world_size=8)
        record.save()
        register(record)
        first = first or run_id
    return env, first


def timed(cmd: list[str], env: dict[str, str], calls: Path) -> tuple[float, int]:
    calls.unlink(missing_ok=True)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[2:])} exited {done.returncode}:\n{done.stderr[-2000:]}")
    n = len(calls.read_text().splitlines()) if calls.exists() else 0
    return took, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    orch = [sys.executable, "-m", "orchestrator"]
    rows: dict[str, list[tuple[float, int]]] = {"first": [], "again": [], "floor": []}
    for _ in range(args.repeat):
        base = Path(tempfile.mkdtemp(prefix="bench-status-", dir=os.environ.get("BENCH_DIR")))
        try:
            env, one = make_runs(base, args.runs)
            calls = base / "calls"
            rows["floor"].append(timed([*orch, "status", one], env, calls))
            rows["first"].append(timed([*orch, "status"], env, calls))
            rows["again"].append(timed([*orch, "status"], env, calls))
        finally:
            shutil.rmtree(base, ignore_errors=True)
    floor = statistics.median(t for t, _ in rows["floor"])
    print(f"status over {args.runs} registered SLURM runs (half ended, half running), "
          f"median of {args.repeat}, each a fresh process")
    print(f"{'case':<44} {'seconds':>8} {'scheduler calls':>16} {'x floor':>8}")
    labels = {"first": f"status, {args.runs} runs all open (first look)",
              "again": f"status again ({args.runs // 2} still running)",
              "floor": "floor: status of one run"}
    for key in ("first", "again", "floor"):
        t = statistics.median(x for x, _ in rows[key])
        n = max(c for _, c in rows[key])
        print(f"{labels[key]:<44} {t:8.3f} {n:16d} {t / floor:8.2f}")


if __name__ == "__main__":
    main()
