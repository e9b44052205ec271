"""status / list / logs / cancel over run folders and the registry, for every executor.

Status for many runs asks each executor once for all its runs (``refresh``), so SLURM
status over N jobs costs one scheduler query, not N.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from pathlib import Path

from orchestrator.errors import OrchestratorError, RunNotFoundError
from orchestrator.executors import get_executor
from orchestrator.records import TERMINAL, RunRecord, registered_runs, resolve_run

#: `logs -f` on a run that has not started yet waits this long for its first line, then says so.
FOLLOW_START_TIMEOUT_S = 600.0


def _records(refs: list[str]) -> list[RunRecord]:
    """Explicit refs must all resolve; over the whole registry, a damaged run is reported and
    skipped so the others are still listed."""
    if refs:
        return [RunRecord.load(resolve_run(r)) for r in refs]
    records = []
    for entry in registered_runs():
        d = Path(entry["run_dir"])
        try:
            if (d / "record.json").is_file():
                records.append(RunRecord.load(d))
        except (OrchestratorError, OSError) as exc:
            print(f"warning: skipping {entry['run_id']!r}: {exc}", file=sys.stderr)
    return records


def refresh(records: list[RunRecord]) -> list[RunRecord]:
    by_executor: dict[str, list[RunRecord]] = defaultdict(list)
    for rec in records:
        by_executor[rec.executor].append(rec)
    fresh: dict[str, RunRecord] = {}
    for name, recs in by_executor.items():
        for rec in get_executor(name).refresh(recs):
            fresh[rec.run_dir] = rec
    return [fresh[r.run_dir] for r in records]


def status(refs: list[str], as_json: bool = False) -> int:
    records = refresh(_records(refs))
    if as_json:
        print(json.dumps([vars(r) for r in records], indent=2, default=str))
        return 0
    if not records:
        print("no runs registered yet; start one with 'orchestrator run SPEC'")
        return 0
    for rec in records:
        ids = ",".join(rec.job_ids) if len(rec.job_ids) <= 3 else f"{rec.job_ids[0]}..{rec.job_ids[-1]} ({len(rec.job_ids)})"
        print(f"{rec.run_id:40} {rec.state:14} {rec.executor:6} jobs={ids or '-'} ranks={rec.world_size}")
        if rec.state not in ("COMPLETED", "RUNNING", "PENDING") and rec.error:
            print("    " + rec.error.strip().splitlines()[0])
        if rec.point_states:
            print_grid(rec, rec.point_states)
    return 0


def print_grid(rec: RunRecord, points: dict[str, str]) -> None:
    """The sweep grid: counts by state, then each point's arguments and state."""
    counts: dict[str, int] = defaultdict(int)
    for state in points.values():
        counts[state] += 1
    print("    sweep: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    plan_path = Path(rec.run_dir) / "plan.json"
    sweep = json.loads(plan_path.read_text()).get("sweep", []) if plan_path.exists() else []
    for point in sweep:
        state = points.get(str(point["index"]), "UNKNOWN")
        args = " ".join(f"{k}={v}" for k, v in point["args"].items())
        print(f"    {point['index']:4d} {state:12} {args}")


def list_runs(as_json: bool = False) -> int:
    return status([], as_json=as_json)


def logs(ref: str, rank: int, follow: bool, point: int | None = None,
         start_timeout_s: float = FOLLOW_START_TIMEOUT_S) -> int:
    rec = RunRecord.load(resolve_run(ref))
    if rank < 0 or rank >= max(1, rec.world_size):
        raise RunNotFoundError(f"rank {rank} is not in {rec.run_id} (ranks 0-{max(1, rec.world_size) - 1})")
    if point is not None and not 0 <= point < max(1, rec.sweep_size):
        raise RunNotFoundError(f"point {point} is not in {rec.run_id}"
                               + (f" (points 0-{rec.sweep_size - 1})" if rec.sweep_size else " (it is not a sweep)"))
    executor = get_executor(rec.executor)
    path = executor.log_path(rec, rank, point)
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
        elif not follow:
            print(f"no log for rank {rank} yet at {path}", file=sys.stderr)
            return 1
        if not follow:
            return 0
        rec = executor.refresh([RunRecord.load(rec.run_dir)])[0]
        if rec.state in TERMINAL and (not path.exists() or path.stat().st_size == offset):
            if not path.exists():
                print(f"{rec.run_id} ended {rec.state} without a log for rank {rank} at {path}", file=sys.stderr)
                return 1
            return 0
        if not path.exists() and time.monotonic() - started > start_timeout_s:
            print(f"{rec.run_id} is {rec.state} and rank {rank} has written nothing in {start_timeout_s:.0f}s; "
                  f"try again later, or check 'orchestrator status {rec.run_id}'", file=sys.stderr)
            return 1
        time.sleep(0.3)


def cancel(ref: str) -> int:
    rec = RunRecord.load(resolve_run(ref))
    rec = get_executor(rec.executor).cancel(rec)
    print(f"{rec.run_id}: {rec.state}")
    return 0
