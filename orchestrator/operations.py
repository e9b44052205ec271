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

from orchestrator.executors import get_executor
from orchestrator.records import TERMINAL, RunRecord, registered_runs, resolve_run


def _records(refs: list[str]) -> list[RunRecord]:
    dirs = [resolve_run(r) for r in refs] if refs else [Path(e["run_dir"]) for e in registered_runs()]
    return [RunRecord.load(d) for d in dirs if (d / "record.json").is_file()]


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


def logs(ref: str, rank: int, follow: bool) -> int:
    rec = RunRecord.load(resolve_run(ref))
    executor = get_executor(rec.executor)
    path = executor.log_path(rec, rank)
    offset = 0
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
        if rec.state in TERMINAL and path.exists() and path.stat().st_size == offset:
            return 0
        time.sleep(0.3)


def cancel(ref: str) -> int:
    rec = RunRecord.load(resolve_run(ref))
    rec = get_executor(rec.executor).cancel(rec)
    print(f"{rec.run_id}: {rec.state}")
    return 0
