"""What the job's watchdog costs while a job runs: one look (every rank's log size, heartbeat and
join record, as the SLURM agent and the local supervisor read them once a second), at a number of
ranks, and how many looks a job makes once nothing is left to judge.

Run: .venv/bin/python tests/benchmarks/bench_agent_look.py [--ranks 8192] [--repeat 5]

It writes a run folder of N ranks (each with a log, a heartbeat and a join record) in a temporary
folder on local disk, times ``forensics.look`` and, for a job with the stall watchdog off, counts
the looks left once every rank has joined (``Watch.settled``: none).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from orchestrator import forensics, join_hook
from orchestrator.progress import progress_path
from orchestrator.watchdog import Watch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8192)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        run = Path(d)
        logs = {}
        for r in range(a.ranks):
            log = run / "logs" / f"rank-{r}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("step\n")
            logs[r] = log
            for path in (join_hook.joined_path(run, r), progress_path(run, r)):
                path.parent.mkdir(parents=True, exist_ok=True)
            join_hook.joined_path(run, r).write_text("")
            progress_path(run, r).write_text(json.dumps({"rank": r, "time": time.time(), "step": 1}))
        for stall, name in ((600.0, "stall watchdog on"), (None, "watchdog off (init deadline only)")):
            watch = Watch(a.ranks, time.time() - 1, stall, 300.0)
            times, looks = [], 0
            for _ in range(a.repeat):
                if watch.settled():
                    continue
                t0 = time.perf_counter()
                forensics.look(watch, run, logs)
                times.append(time.perf_counter() - t0)
                looks += 1
            per = f"{statistics.median(times) * 1000:.0f} ms per look" if times else "-"
            print(f"{a.ranks} ranks, {name}: {looks} look(s) of {a.repeat} made, {per}; "
                  f"settled after: {watch.settled()}")


if __name__ == "__main__":
    main()
