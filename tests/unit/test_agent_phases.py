"""The SLURM job agent's lifecycle (orchestrator.backends.slurm.node.slurm_job.Phase) and its exit code: the moves it
may make and the state SLURM records for each way an attempt ends. The agent itself runs under
real SLURM in tests/cluster/ and against a real srun stand-in in tests/integration/test_slurm_agent.py."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.backends.slurm.node.agent_decisions import UNFINISHED_EXIT, exit_code
from orchestrator.backends.slurm.node.agent_state import MOVES, AgentState, Phase


def test_every_phase_is_reachable_from_running_and_final_phases_are_final() -> None:
    reached, frontier = {Phase.RUNNING}, [Phase.RUNNING]
    while frontier:
        for nxt in MOVES[frontier.pop()]:
            if nxt not in reached:
                reached.add(nxt)
                frontier.append(nxt)
    assert reached == set(Phase)
    assert {p for p in Phase if not MOVES[p]} == {Phase.REQUEUED, Phase.NOT_REQUEUED, Phase.RESTARTING}
    assert MOVES[Phase.ENDING] == {Phase.REQUEUEING, Phase.RESTARTING}  # a hang may restart (recovery), nothing else


@given(st.lists(st.sampled_from(list(Phase)), max_size=6))
def test_enter_refuses_every_move_the_table_does_not_name(moves: list[Phase]) -> None:
    state = AgentState()  # the phase machine only; no payload, no srun
    assert state.phase is Phase.RUNNING
    for phase in moves:
        before = state.phase
        if phase in MOVES[before]:
            state.enter(phase)
            assert state.phase is phase
        else:
            with pytest.raises(RuntimeError, match=f"from {before.value} to {phase.value}"):
                state.enter(phase)
            assert state.phase is before


@pytest.mark.parametrize("phase,code,early", list(itertools.product(list(Phase), [0, 1, 137, -9, -15], [False, True])))
def test_exit_code(phase: Phase, code: int, early: bool) -> None:
    result = exit_code(phase, code, early)
    if phase is Phase.ENDING:
        assert result == 1  # a watchdog verdict is a failure whatever the ranks returned
    elif phase is Phase.REQUEUED:
        assert result == 0  # SLURM runs the next attempt
    elif code == 0 and early:
        assert result is None  # unfinished: reported as UNFINISHED_EXIT, never COMPLETED
    elif code < 0:
        assert result == 128 - code  # killed by a signal: as a shell reports it
    else:
        assert result == code
    assert result != 0 or phase is Phase.REQUEUED or (code == 0 and not early)
    assert UNFINISHED_EXIT != 0


def test_srun_names_the_task_a_signal_ended() -> None:
    from orchestrator.backends.slurm.node.agent_decisions import srun_signal_death

    assert srun_signal_death("srun: error: orch-node2: task 3: Killed\n") == ("orch-node2", 3, "Killed")
    assert srun_signal_death("srun: error: n1: tasks 4,6: Segmentation fault (core dumped)") == \
        ("n1", 4, "Segmentation fault (core dumped)")
    assert srun_signal_death("srun: error: n1: tasks 0-1: Exited with exit code 1") is None
    assert srun_signal_death("srun: Job step aborted: Waiting up to 32 seconds for job step to finish.") is None


def test_a_sigterm_is_a_preemption_when_the_controller_says_so() -> None:
    from orchestrator.backends.slurm.node.agent_decisions import preempted

    assert preempted({"JobState": "RUNNING", "PreemptTime": "2026-11-24T18:01:02"})
    assert preempted({"JobState": "PREEMPTED", "PreemptTime": "None"})
    assert not preempted({"JobState": "CANCELLED", "PreemptTime": "None"})  # scancel
    assert not preempted({"JobState": "TIMEOUT"}) and not preempted({})  # the time limit; no answer
