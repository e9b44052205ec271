"""The report marks where each later attempt resumed training, and why (recovery.json)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.records import RunRecord
from orchestrator.core.recovery import History
from orchestrator.front.report import resumes, write_report
from tests.unit.test_metrics_dedupe import _attempt


def test_restarts_and_requeues_are_marked_where_training_resumed(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _attempt(tmp_path, monkeypatch, 0, range(1, 9), start=(0, 0))
    _attempt(tmp_path, monkeypatch, 1, range(7, 13), start=(6, 0))  # a crash after the step-6 checkpoint
    _attempt(tmp_path, monkeypatch, 2, range(13, 16), start=(12, 0))  # then the time limit
    assert resumes(tmp_path) == [(6, 1), (12, 2)]
    history = History(tmp_path / "recovery.json")
    for number, outcome, action in ((1, "crash", "restart"), (2, "requeued", "requeue"), (3, "completed", "")):
        history.finish(history.begin(number, ["n1"], tmp_path / "ckpt"), outcome, action=action)
    RunRecord(run_id="r", run_dir=str(tmp_path), executor="local", attempts=3).save()
    summary = write_report(str(tmp_path))
    assert "attempt 2 resumed at step 6 (restart after crash)" in summary
    assert "attempt 3 resumed at step 12 (requeue)" in summary
    assert [p.stat().st_size > 0 for p in (tmp_path / "report").glob("*.png")] == [True]


def test_a_run_that_never_restarted_has_no_marks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _attempt(tmp_path, monkeypatch, 0, range(1, 5), start=(0, 0))
    assert resumes(tmp_path) == []
    RunRecord(run_id="r", run_dir=str(tmp_path), executor="local").save()
    assert "resumed" not in write_report(str(tmp_path))
