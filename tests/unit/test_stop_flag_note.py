"""jobs.StopFlag notes for the job's agent whether the ranks listen for a stop and whether they
stopped: the agent's evidence that ranks ending after a time-limit notice had finished their work."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from orchestrator.run_folder import stop_flag_note


def test_rank_zero_notes_listening_then_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.preemption import StopFlag

    marker = tmp_path / "requeue" / "checkpointed-77-0"
    monkeypatch.setenv("ORCH_REQUEUE_MARKER", str(marker))
    monkeypatch.setenv("RANK", "0")
    note = Path(stop_flag_note(str(marker)))
    with StopFlag((signal.SIGUSR2,)) as stop:
        assert note.read_text().strip() == "listening"
        assert not stop.should_stop()
        assert note.read_text().strip() == "listening"
        signal.raise_signal(signal.SIGUSR2)
        assert stop.should_stop()
        assert note.read_text().strip() == "stopped"
        assert not marker.exists()  # stopping is not checkpointing: checkpointed() marks that


def test_other_ranks_and_runs_outside_a_job_note_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.preemption import StopFlag, note_stop_state

    marker = tmp_path / "requeue" / "checkpointed-77-0"
    monkeypatch.setenv("ORCH_REQUEUE_MARKER", str(marker))
    monkeypatch.setenv("RANK", "1")
    with StopFlag((signal.SIGUSR2,)):
        pass
    assert not Path(stop_flag_note(str(marker))).exists()
    monkeypatch.delenv("ORCH_REQUEUE_MARKER")
    monkeypatch.setenv("RANK", "0")
    assert note_stop_state("listening") is False
