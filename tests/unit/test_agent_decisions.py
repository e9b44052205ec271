"""The SLURM job agent's decisions (orchestrator.backends.slurm.node.agent_decisions), without processes: when a
requeue is due, a cancel's grace, whether an end is a failure, the attempt's outcome and the exit
code. The agent that acts on them runs against stand-ins in tests/integration/test_slurm_agent.py."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.backends.slurm.node.agent_decisions import (ALWAYS, AUTO, NEVER, UNFINISHED_EXIT, a_failure, attempt_outcome, cancelled,
                                          failed_exit, grace_spent, hang_blamed, no_requeue_left, requeue_deadline,
                                          requeue_evidence, requeue_why, requeues_used, stacks_before_notice)
from orchestrator.backends.slurm.node.agent_state import AgentState, Phase
from orchestrator.backends.slurm.node.agent_stop import Stop, StopCause, cancel_requested, cancel_sent, noticed, terminated, told_apart
from orchestrator.core.states import Action, FailureKind, Outcome


def test_always_waits_for_the_ranks_until_the_margin_is_nearly_spent() -> None:
    assert requeue_deadline(100.0, 60.0) == 145.0  # a 15 s reserve
    assert requeue_deadline(100.0, 10.0) == 105.0  # half of a short margin
    args = dict(policy=ALWAYS, notice_name="USR2", notice_at=100.0, marker=False, margin_s=60.0)
    assert requeue_why(**args, ranks_ended=False, now=120.0) is None  # the ranks are cleaning up
    assert "margin nearly spent" in (requeue_why(**args, ranks_ended=False, now=145.0) or "")
    assert requeue_why(**args, ranks_ended=True, now=101.0) == "USR2 (time limit or preemption), slurm.requeue: always"
    assert requeue_why(**{**args, "notice_at": None}, ranks_ended=True, now=101.0) is None


def test_auto_requeues_on_the_rank_apis_marker_only() -> None:
    assert requeue_why(AUTO, "USR2", 100.0, False, True, 200.0, 60.0) is None
    assert "slurm.requeue: auto" in (requeue_why(AUTO, "USR2", None, True, False, 0.0, 60.0) or "")
    assert requeue_why(NEVER, "USR2", 100.0, True, True, 200.0, 60.0) is None
    assert requeue_evidence(AUTO, None, True) and requeue_evidence(ALWAYS, 1.0, False)
    assert not requeue_evidence(NEVER, 1.0, True) and not requeue_evidence(ALWAYS, None, True)


def test_requeues_are_counted_apart_from_restarts_and_bounded() -> None:
    assert requeues_used(history_requeues=1, restart_count=3, history_restarts=1) == 2
    assert requeues_used(history_requeues=2, restart_count=0, history_restarts=0) == 2  # a resubmission
    assert no_requeue_left(2, 3) == "" and "no requeues left (3 of 3 used" in no_requeue_left(3, 3)
    assert stacks_before_notice(True, NEVER, 0, 3) and stacks_before_notice(True, ALWAYS, 3, 3)
    assert not stacks_before_notice(True, AUTO, 0, 3) and not stacks_before_notice(False, NEVER, 0, 3)


def test_a_cancel_is_a_request_or_a_sigterm_that_is_no_preemption() -> None:
    assert cancelled(Stop(StopCause.CANCEL, 5.0))
    assert cancelled(told_apart(terminated(None, 5.0), False, "", 6.0))
    assert not cancelled(told_apart(terminated(None, 5.0), True, "", 6.0))  # a preemption is a notice
    assert not cancelled(terminated(None, 5.0))  # not asked: nothing known
    assert not cancelled(None) and not cancelled(noticed(None, 1.0))
    asked = cancel_requested(None, 10.0)
    assert grace_spent(asked, 40.0, 30.0) and not grace_spent(asked, 39.0, 30.0)
    assert not grace_spent(cancel_sent(asked, 41.0), 1e9, 30.0)  # scancel was sent once: never again
    assert not grace_spent(None, 1e9, 30.0) and not grace_spent(told_apart(terminated(None, 1.0), False, "", 2.0), 1e9, 30.0)


@pytest.mark.parametrize("phase,code,stopping,notice", list(itertools.product(
    list(Phase), [0, 1, -9], [False, True], [None, 1.0])))
def test_only_an_unasked_end_is_a_failure(phase: Phase, code: int, stopping: bool, notice: float | None) -> None:
    result = a_failure(code, phase, stopping, notice)
    assert result == ((code != 0 or phase is Phase.ENDING) and phase in (Phase.RUNNING, Phase.ENDING)
                      and not stopping and notice is None)
    expected = 1 if phase is Phase.ENDING or code == 0 else (code if code > 0 else 128 - code)
    assert failed_exit(phase, code) == expected and failed_exit(phase, None) == 1


@given(cancel=st.booleans(), failure=st.none() | st.sampled_from(list(FailureKind)),
       action=st.sampled_from(list(Action)), phase=st.sampled_from(list(Phase)), preempted=st.none() | st.booleans(),
       code=st.none() | st.sampled_from([0, 1, UNFINISHED_EXIT, 137]))
def test_every_attempt_has_one_outcome(cancel: bool, failure: FailureKind | None, action: Action, phase: Phase,
                                       preempted: bool | None, code: int | None) -> None:
    outcome = attempt_outcome(was_cancelled=cancel, failure=failure, action=action, phase=phase, preempted=preempted,
                              code=code)
    assert isinstance(outcome, Outcome)
    if cancel:
        assert outcome is Outcome.CANCELLED
    elif failure is not None and action in (Action.RESTART, Action.STOP):
        assert outcome == failure
    elif phase is Phase.REQUEUED:
        assert outcome is Outcome.REQUEUED
    if outcome is Outcome.COMPLETED:
        assert code == 0 and not cancel and not preempted


def test_a_hang_blames_the_stragglers_node_only_outside_a_collective() -> None:
    hosts = ("n1", "n2")
    assert hang_blamed(3, hosts, 2, True) == ("n2",)
    assert hang_blamed(9, hosts, 2, True) == ("n2",)  # past the last node: the last
    assert hang_blamed(3, hosts, 2, False) == () and hang_blamed(None, hosts, 2, True) == ()


def test_the_state_is_one_dataclass_without_sentinels() -> None:
    state = AgentState()
    assert state.phase is Phase.RUNNING and state.stop is None and not state.preemption_asked
    assert state.suspend_checked is None and state.action is Action.NONE
    assert all(v != float("inf") for v in vars(state).values() if isinstance(v, float))
