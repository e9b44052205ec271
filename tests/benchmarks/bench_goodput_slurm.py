"""Goodput of a SLURM job that keeps its survivors through a series of failures (issue 50's
acceptance): ``jobs.train`` for about ``--minutes`` on 2 nodes x 1 rank and 1 spare node,
``recovery.survivors: keep``, ``watchdog.stall_s: 10``, and on a schedule ``orchestrator chaos``:
``--kill-rank`` twice, ``--node-down`` once (rank 1's node: its rank moves to the spare), and
``--stop-rank`` once (a hang the watchdog finds; the straggler alone is replaced). Reported: the
job's state, its SLURM job and restart count (``scontrol``: Restarts=0 means never requeued), each
attempt, and ``orchestrator status``'s goodput line. Nothing is asserted: the figures are for
docs/PERFORMANCE.md. ``--smoke``: under a minute, no spare, one ``--kill-rank`` (the 2-node test cluster).

    deploy/cluster.sh up --nodes 3 --cpus 2 --profile site --dir /var/tmp/orch-exp
    SLURM_CONF=/var/tmp/orch-exp/slurm.conf .venv/bin/python tests/benchmarks/bench_goodput_slurm.py \\
        --runs-dir /srv/exp/runs --minutes 10
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench_slurm import compile_package  # this folder is on sys.path: the benchmarks run as scripts

from orchestrator import api
from orchestrator.core.recovery import History, describe
from orchestrator.front.chaos import Injection, inject

#: (fraction of the run, what): rank 1's node is set down, so its rank moves to the spare.
SCHEDULE = ((0.2, "kill-rank 1"), (0.4, "node-down"), (0.6, "stop-rank 0"), (0.8, "kill-rank 0"))
#: ``--smoke`` (the 2-node test cluster, no spare: tests/cluster/test_benchmarks_smoke.py): one kill.
SMOKE = ((0.5, "kill-rank 1"),)
STEPS_PER_EPOCH = 1437 // 2 // 16


def _training(run_dir: str) -> bool:
    """Every rank has recorded itself and reported a step of the running attempt."""
    from orchestrator.core.progress import read_progress

    ranks = Path(run_dir) / "ranks"
    reports = read_progress(run_dir, 2)
    return all((ranks / f"rank-{r}.json").exists() for r in range(2)) and all(p is not None for p in reports)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs-dir", default="/srv/exp/runs")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--step-delay", type=float, default=0.2)
    ap.add_argument("--smoke", action="store_true", help="under a minute, no spare, one kill (the test cluster)")
    a = ap.parse_args()
    if a.smoke:
        a.minutes = 0.75
    else:
        compile_package()  # as a pip install leaves it (bench_slurm.compile_package says why)
    epochs = max(2, round(a.minutes * 60 / (STEPS_PER_EPOCH * (a.step_delay + 0.05))))
    spec = {"name": f"bench-goodput-{int(time.time())}", "entrypoint": "jobs.train:main", "executor": "slurm",
            "nodes": 2, "cpu_ranks_per_node": 1, "runs_dir": a.runs_dir,
            "args": {"dataset": "digits", "model": "smallcnn", "batch-size": 16, "lr": 0.05, "momentum": 0.9,
                     "epochs": epochs, "log-every": 10, "step-delay": a.step_delay},
            "checkpoint": {"interval_steps": 100}, "watchdog": {"stall_s": 10},
            "recovery": {"max_restarts": 8, "survivors": "keep", "spares": 0 if a.smoke else 1},
            "slurm": {"time": f"00:{int(a.minutes * 3) + 5}:00"}}
    run = api.submit(spec)
    run_dir = run.record.run_dir
    print(run_dir, f"({epochs} epochs)", flush=True)
    started = time.monotonic()
    downed: str | None = None
    try:
        for fraction, what in SMOKE if a.smoke else SCHEDULE:
            while time.monotonic() - started < fraction * a.minutes * 60 or not _training(run_dir):
                time.sleep(1)  # on schedule, once every rank trains (a slow start under load: never refused)
            action, _, rank = what.partition(" ")
            if action == "node-down":
                downed = json.loads((Path(run_dir) / "ranks" / "rank-1.json").read_text())["host"]
                said = inject(run_dir, Injection("node-down", node=downed))
            else:
                said = inject(run_dir, Injection(action, rank=int(rank)))
            print(f"{time.monotonic() - started:6.0f}s {said.splitlines()[0]}", flush=True)
        run.wait(timeout=a.minutes * 60 * 2, attempts=False)
    finally:
        if downed:
            subprocess.run(["scontrol", "update", f"nodename={downed}", "state=resume"], capture_output=True)
    record = run.record
    job = History.load(run_dir).attempts[0].job
    restarts = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True).stdout
    restarts = next((w for w in restarts.split() if w.startswith("Restarts=")), "Restarts=? (job forgotten)")
    print(f"state {record.state}, SLURM job {job}, {restarts}")
    print("\n".join(describe(History.load(run_dir))))
    status = subprocess.run([sys.executable, "-m", "orchestrator", "status", run_dir], capture_output=True,
                            text=True).stdout
    print(status)


if __name__ == "__main__":
    main()
