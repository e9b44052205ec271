"""status / list / logs / cancel as the CLI prints them, over the Python API (api.py).

Status for many runs asks each executor once for all its runs (``api.refresh``), so SLURM
status over N jobs costs one scheduler query, not N.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

from orchestrator import api
from orchestrator.api import Run, registered
from orchestrator.records import TERMINAL, RunRecord
from orchestrator.stacks import wait_lines
from orchestrator.run_folder import RunFolder

#: `logs -f` on a run that has not started yet waits this long for its first line, then says so.
FOLLOW_START_TIMEOUT_S = 600.0


def _runs(refs: list[str]) -> list[Run]:
    """Explicit refs must all resolve; over the whole registry, a damaged run is reported and
    skipped so the others are still listed."""
    if refs:
        return [Run.get(r) for r in refs]
    return registered(on_damaged=lambda run_id, exc: print(f"warning: skipping {run_id!r}: {exc}", file=sys.stderr))


def refresh(records: list[RunRecord]) -> list[RunRecord]:
    """The records, refreshed with one query per executor."""
    return [run.record for run in api.refresh([Run(rec) for rec in records])]


def status(refs: list[str], as_json: bool = False) -> int:
    records = [run.record for run in api.refresh(_runs(refs))]
    if as_json:
        print(json.dumps([asdict(r) for r in records], indent=2, default=str))
        return 0
    if not records:
        print("no runs registered yet; start one with 'orchestrator run SPEC'")
        return 0
    for rec in records:
        ids = ",".join(rec.job_ids) if len(rec.job_ids) <= 3 else f"{rec.job_ids[0]}..{rec.job_ids[-1]} ({len(rec.job_ids)})"
        print(f"{rec.run_id:40} {rec.state:14} {rec.executor:6} jobs={ids or '-'} ranks={rec.world_size}")
        if rec.state not in ("COMPLETED", "RUNNING", "PENDING") and rec.error:
            print("    " + rec.error.strip().splitlines()[0])
        if rec.state not in ("COMPLETED", "RUNNING", "PENDING") and rec.waits:
            for line in wait_lines(rec.waits):
                print(f"    {line}")
        if rec.warning:
            print(f"    warning: {rec.warning}")
        if rec.point_states:
            print_grid(rec, rec.point_states)
    return 0


def print_grid(rec: RunRecord, points: dict[str, str]) -> None:
    """The sweep grid: counts by state, then each point's arguments and state."""
    counts: dict[str, int] = defaultdict(int)
    for state in points.values():
        counts[state] += 1
    print("    sweep: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    plan_path = RunFolder.of(rec.run_dir).plan
    sweep = json.loads(plan_path.read_text()).get("sweep", []) if plan_path.exists() else []
    for point in sweep:
        state = points.get(str(point["index"]), "UNKNOWN")
        args = " ".join(f"{k}={v}" for k, v in point["args"].items())
        print(f"    {point['index']:4d} {state:12} {args}")


def list_runs(as_json: bool = False) -> int:
    return status([], as_json=as_json)


def logs(ref: str, rank: int, follow: bool, point: int | None = None,
         start_timeout_s: float = FOLLOW_START_TIMEOUT_S) -> int:
    run = Run.get(ref)
    path = run.log_path(rank, point)
    if not follow:
        if not path.exists():
            print(f"no log for rank {rank} yet at {path}", file=sys.stderr)
            return 1
        sys.stdout.write(run.logs(rank, point))
        sys.stdout.flush()
        return 0
    return _follow(run, path, rank, start_timeout_s)


def _follow(run: Run, path: Path, rank: int, start_timeout_s: float) -> int:
    """Print the log as it grows until the run ends; give up if it never starts."""
    offset = 0
    started = time.monotonic()
    while True:
        if path.exists():
            with open(path, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
            offset += len(chunk)
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()
        state = run.status()
        if state in TERMINAL and (not path.exists() or path.stat().st_size == offset):
            if not path.exists():
                print(f"{run.id} ended {state} without a log for rank {rank} at {path}", file=sys.stderr)
                return 1
            return 0
        if not path.exists() and time.monotonic() - started > start_timeout_s:
            print(f"{run.id} is {state} and rank {rank} has written nothing in {start_timeout_s:.0f}s; "
                  f"try again later, or check 'orchestrator status {run.id}'", file=sys.stderr)
            return 1
        time.sleep(0.3)


def cancel(ref: str) -> int:
    run = Run.get(ref)
    print(f"{run.id}: {run.cancel()}")
    return 0

