"""What the job's agent learns about stops: jobs.StopFlag's notes (whether the ranks listen for a
stop and whether they stopped), and the time SLURM kept the job suspended."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from orchestrator.core.run_folder import stop_flag_note


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


def test_the_time_a_job_spent_suspended_comes_from_its_start_and_run_time() -> None:
    import time

    from orchestrator.backends.slurm.node.agent_decisions import suspended_s

    start = time.mktime(time.strptime("2026-11-27T10:00:00", "%Y-%m-%dT%H:%M:%S"))
    job = {"JobState": "RUNNING", "StartTime": "2026-11-27T10:00:00", "RunTime": "00:01:40"}
    assert suspended_s(job, start + 400) == 300.0
    assert suspended_s({**job, "RunTime": "1-00:00:00"}, start + 86400) == 0.0
    assert suspended_s({**job, "RunTime": "00:10:00"}, start + 300) == 0.0  # clocks apart: never negative
    for bad in ({}, {**job, "StartTime": "Unknown"}, {**job, "RunTime": "INVALID"}, {**job, "RunTime": "1-2:3"}):
        assert suspended_s(bad, start + 400) is None


def test_an_agent_that_was_stopped_asks_about_the_suspension_though_no_verdict_is_near(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SLURM stops the agent with its job. Once resumed, the ranks may report again before the
    watchdog's next look, and the suspension would never be asked about (nor said). The agent's
    loop sees its own gap (``stopped_seen``) and the next look asks the controller at once."""
    import time
    from types import SimpleNamespace

    from orchestrator.backends.slurm.node import agent_watch
    from orchestrator.backends.slurm.node.agent_state import AgentState

    start = time.time() - 400
    job = {"JobState": "RUNNING", "StartTime": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start)),
           "RunTime": "00:01:40"}
    asked: list[str] = []
    monkeypatch.setattr(agent_watch.slurm_controller, "show_job", lambda job_id: asked.append(job_id) or job)
    said: list[str] = []
    state = AgentState()
    watch = agent_watch.AgentWatch(SimpleNamespace(state=state, job_id="45", say=said.append), {})
    watch.watch = SimpleNamespace(stalled=lambda now: [], never_joined=lambda now: [])  # no verdict near
    now = time.time()
    assert watch._running_clock(now) == now and asked == []  # nothing to ask
    state.stopped_seen = True
    adjusted = watch._running_clock(now)
    assert asked == ["45"] and not state.stopped_seen
    assert adjusted is not None and 298 < now - adjusted < 302, now - adjusted
    assert said and said[0].startswith("job 45 was suspended for 30"), said
