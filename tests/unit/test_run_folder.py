"""An attempt's failures are its own: the next attempt starts with none, and the earlier ones stay
readable under <run>/attempts/K/."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.executors.base import first_error
from orchestrator.core.run_folder import RunFolder


def _fail(run: RunFolder, rank: int, attempt: int) -> None:
    run.errors.mkdir(parents=True, exist_ok=True)
    run.error(rank).write_text(json.dumps({"rank": rank, "attempt": attempt, "time": 1.0, "type": "E", "message": "m"}))


def test_each_attempts_failures_are_kept_apart(tmp_path: Path) -> None:
    run = RunFolder(tmp_path)
    _fail(run, 1, attempt=0)
    run.end.write_text(json.dumps({"reason": "stall"}))
    run.forget_attempt()
    assert first_error(tmp_path) is None and not run.end.exists()  # the new attempt shows none
    kept = run.attempts / "1"  # counted from 1, as status counts attempts
    assert json.loads((kept / "errors" / "rank-1.json").read_text())["rank"] == 1
    assert json.loads((kept / "end.json").read_text())["reason"] == "stall"
    _fail(run, 0, attempt=1)
    run.forget_attempt()
    run.forget_attempt()  # nothing new to keep: nothing moves, nothing is lost
    assert sorted(p.name for p in run.attempts.iterdir()) == ["1", "2"]
    assert (run.attempts / "2" / "errors" / "rank-0.json").is_file()


def test_a_failure_record_without_an_attempt_is_kept_too(tmp_path: Path) -> None:
    run = RunFolder(tmp_path)
    run.errors.mkdir()
    run.error(0).write_text("not json")
    run.forget_attempt()
    run.errors.mkdir()
    run.error(0).write_text("{}")
    run.forget_attempt()
    assert sorted(p.name for p in run.attempts.iterdir()) == ["earlier", "earlier.1"]
