"""The interface every executor implements, and the run-folder set-up they share."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterator, Protocol

from orchestrator import procs
from orchestrator.errors import SubmissionError
from orchestrator.plan import LaunchPlan
from orchestrator.run_folder import RunFolder
from orchestrator.records import TERMINAL, RunRecord, register, write_json_atomic, write_text_atomic

#: A run recorded PENDING with no supervisor this long after it was created never started.
NEVER_STARTED_S = 60.0


class Executor(Protocol):
    def submit(self, launch: LaunchPlan, detach: bool = True) -> RunRecord: ...
    def run(self, launch: LaunchPlan) -> RunRecord: ...
    def wait(self, record: RunRecord, follow: bool = False) -> RunRecord: ...
    def refresh(self, records: list[RunRecord]) -> list[RunRecord]: ...
    def cancel(self, record: RunRecord) -> RunRecord: ...
    def log_path(self, record: RunRecord, rank: int, point: int | None = None) -> Path: ...


def refresh_by_supervisor(rec: RunRecord) -> RunRecord:
    """For runs supervised on this machine (local, debug): one whose supervisor is gone without
    writing an end state is FAILED, and one that never got a supervisor is FAILED after a while."""
    if rec.state in TERMINAL:
        return rec
    if rec.supervisor_pid:
        if procs.same_process(rec.supervisor_pid, rec.supervisor_start) or (
                rec.supervisor_start is None and procs.alive(rec.supervisor_pid)):
            return rec
        why = f"the supervisor (pid {rec.supervisor_pid}) ended without recording an end state"
    elif time.time() - rec.created > NEVER_STARTED_S:
        why = "the run never started (no supervisor was recorded)"
    else:
        return rec
    latest = RunRecord.load(rec.run_dir)  # the supervisor may have recorded its end meanwhile
    if latest.state in TERMINAL or latest.supervisor_pid != rec.supervisor_pid:
        return latest
    return latest.update(state="FAILED", ended=time.time(), error=latest.error or why)


def _point_dirs(run_dir: Path) -> Iterator[RunFolder]:
    yield RunFolder(run_dir)
    points = run_dir / "points"
    if points.is_dir():
        yield from (RunFolder(p) for p in sorted(points.iterdir()) if p.is_dir())


def rank_log_path(record: RunRecord, rank: int, point: int | None = None) -> Path:
    """``<run>/logs/rank-N.log``; in a sweep, that of the point asked for, else of the latest point
    that has one (points run in order)."""
    run = RunFolder.of(record.run_dir)
    if record.sweep_size and point is None:
        for index in reversed(range(record.sweep_size)):
            path = run.point(index).log(rank)
            if path.exists():
                return path
        point = 0
    return (run.point(point) if record.sweep_size and point is not None else run).log(rank)


def prepare_run_dir(launch: LaunchPlan) -> RunRecord:
    """Create (or reuse, to resume) the run folder and write what it will run.

    A run folder whose record is still active is refused: two launches of the same spec
    would write the same checkpoints.
    """
    run_dir = Path(launch.run_dir)
    attempts = 1
    run = RunFolder(run_dir)
    if run.record.is_file():
        old = RunRecord.load(run_dir)
        if old.state not in TERMINAL:
            raise SubmissionError(
                f"run {launch.run_id} is still {old.state} in {run_dir}; follow it with "
                f"'orchestrator status {launch.run_id}' or stop it with 'orchestrator cancel {launch.run_id}'"
            )
        attempts = old.attempts + 1
    run_dir.mkdir(parents=True, exist_ok=True)
    import yaml

    write_text_atomic(run_dir / "spec.yaml", yaml.safe_dump(launch.spec, sort_keys=False))
    write_json_atomic(run.plan, json.loads(launch.model_dump_json()))
    write_json_atomic(run.payload, launch.payload)
    for folder in _point_dirs(run_dir):  # a rerun must never report an earlier attempt's outcome
        folder.result.unlink(missing_ok=True)
        for err in folder.errors.glob("rank-*.json") if folder.errors.is_dir() else []:
            err.unlink()
    record = RunRecord(run_id=launch.run_id, run_dir=str(run_dir), executor=launch.executor,
                       world_size=launch.world_size, attempts=attempts, sweep_size=len(launch.sweep))
    record.save()
    register(record)
    return record


def first_error(run_dir: str | Path) -> dict | None:
    """The earliest traceback written by a failing rank of the run or of any sweep point."""
    errors = []
    for folder in _point_dirs(Path(run_dir)):
        d = folder.errors
        for path in d.glob("rank-*.json") if d.is_dir() else []:
            try:
                err = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                continue
            if isinstance(err, dict) and isinstance(err.get("rank"), int):
                errors.append(err)
    return min(errors, key=lambda e: e.get("time", 0) if isinstance(e.get("time"), (int, float)) else 0) if errors else None


def move_aside(run_dir: str | Path) -> Path | None:
    """Rename an existing, finished run folder to <run_dir>.<n> so a fresh run can start."""
    src = Path(run_dir)
    if not src.exists():
        return None
    if (src / "record.json").is_file() and RunRecord.load(src).state not in TERMINAL:
        raise SubmissionError(f"{src} belongs to a run that is still active; cancel it first")
    n = 1
    while (dst := src.with_name(f"{src.name}.{n}")).exists():
        n += 1
    src.rename(dst)
    return dst
