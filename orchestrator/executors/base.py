"""The interface every executor implements, and the run-folder set-up they share."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from orchestrator.errors import SubmissionError
from orchestrator.plan import LaunchPlan
from orchestrator.records import TERMINAL, RunRecord, register, write_json_atomic, write_text_atomic


class Executor(Protocol):
    def submit(self, launch: LaunchPlan, detach: bool = True) -> RunRecord: ...
    def run(self, launch: LaunchPlan) -> RunRecord: ...
    def wait(self, record: RunRecord, follow: bool = False) -> RunRecord: ...
    def refresh(self, records: list[RunRecord]) -> list[RunRecord]: ...
    def cancel(self, record: RunRecord) -> RunRecord: ...
    def log_path(self, record: RunRecord, rank: int) -> Path: ...


def prepare_run_dir(launch: LaunchPlan) -> RunRecord:
    """Create (or reuse, to resume) the run folder and write what it will run.

    A run folder whose record is still active is refused: two launches of the same spec
    would write the same checkpoints.
    """
    run_dir = Path(launch.run_dir)
    attempts = 1
    if (run_dir / "record.json").is_file():
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
    write_json_atomic(run_dir / "plan.json", json.loads(launch.model_dump_json()))
    write_json_atomic(run_dir / "payload.json", launch.payload)
    for stale in ("result.json",):
        (run_dir / stale).unlink(missing_ok=True)
    for err in (run_dir / "errors").glob("rank-*.json") if (run_dir / "errors").is_dir() else []:
        err.unlink()
    record = RunRecord(run_id=launch.run_id, run_dir=str(run_dir), executor=launch.executor,
                       world_size=launch.world_size, attempts=attempts, sweep_size=len(launch.sweep))
    record.save()
    register(record)
    return record


def first_error(run_dir: str | Path) -> dict | None:
    """The earliest traceback written by a failing rank, if any."""
    errors = []
    d = Path(run_dir) / "errors"
    for path in d.glob("rank-*.json") if d.is_dir() else []:
        try:
            errors.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError):
            continue
    return min(errors, key=lambda e: e.get("time", 0)) if errors else None


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
