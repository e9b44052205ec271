"""``agent_stop``: the job agent's one stop value answers, after any sequence of facts, what the six
flags and timestamps it replaced answered (a cancel, the notice's clock, a cancel's grace, a
preemption), and its moves keep a known cause."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from hypothesis import given, strategies as st

from orchestrator.backends.slurm.node.agent_decisions import cancelled, grace_spent, notice_at
from orchestrator.backends.slurm.node.agent_stop import (Stop, StopCause, cancel_asked, cancel_requested, cancel_sent,
                                                        carried, noticed, terminated, told_apart)

GRACE_S = 30.0


@dataclass
class Flags:
    """The agent's state before the stop value (2026-12-05), moved as the agent moved it."""

    notice_at: Optional[float] = None
    term_at: Optional[float] = None
    preempted: Optional[bool] = None
    cancel_at: Optional[float] = None
    cancel_sent: bool = False

    def cancelled(self) -> bool:
        return self.cancel_at is not None or (self.term_at is not None and self.preempted is False)


FACTS = st.lists(st.tuples(st.sampled_from(["notice", "term", "ask", "cancel", "sent"]), st.booleans(),
                           st.floats(0.1, 50.0)), max_size=8)


@given(FACTS)
def test_any_sequence_of_facts_gives_the_answers_the_flags_gave(facts: list[tuple[str, bool, float]]) -> None:
    flags, stop, asked, now = Flags(), None, False, 0.0
    for fact, preempted, step in facts:
        now += step
        if fact == "notice":
            flags.notice_at = flags.notice_at or now
            stop = noticed(stop, now)
        elif fact == "term":
            flags.term_at = flags.term_at or now
            stop = terminated(stop, now, preemption_denied=asked)  # a "yes" made it a preemption already
        elif fact == "ask" and not asked:  # the controller is asked once an attempt
            asked = True
            flags.preempted = preempted
            if preempted:
                flags.notice_at = flags.notice_at or flags.term_at or now
            stop = told_apart(stop, preempted, "CANCEL" if preempted else "", now)
        elif fact == "cancel" and not flags.cancelled():  # the agent looks for the request while not stopping
            flags.cancel_at = flags.cancel_at or now
            stop = cancel_requested(stop, now)
        elif fact == "sent" and flags.cancel_at is not None:  # only a cancel's grace or its ranks' end scancels
            flags.cancel_sent = True
            stop = cancel_sent(stop, now)
        assert cancelled(stop) == flags.cancelled(), (facts, stop, flags)
        for later in (now, now + GRACE_S - 0.01, now + GRACE_S + 0.01):
            old = flags.cancel_at is not None and not flags.cancel_sent and later >= flags.cancel_at + GRACE_S
            assert grace_spent(stop, later, GRACE_S) == old, (facts, stop, flags)
        if not flags.cancelled():  # what a requeue and an attempt's outcome read
            assert notice_at(stop) == flags.notice_at, (facts, stop, flags)
            assert (stop is not None and stop.cause is StopCause.PREEMPTION) == bool(flags.preempted), (facts, stop)
        assert cancel_asked(stop) == (flags.cancel_at is not None), (facts, stop, flags)


def test_the_next_attempt_inside_the_job_keeps_the_notice_and_asks_again_about_a_sigterm() -> None:
    preempted = told_apart(terminated(noticed(None, 1.0), 2.0), True, "REQUEUE", 3.0)
    assert preempted == Stop(StopCause.PREEMPTION, 1.0, notice_at=1.0, preempt_mode="REQUEUE")
    assert carried(preempted, sigterm_came=True) == Stop(StopCause.SIGTERM, 1.0, notice_at=1.0)
    assert carried(noticed(None, 4.0), sigterm_came=False) == Stop(StopCause.NOTICE, 4.0, notice_at=4.0)
    assert carried(None, sigterm_came=False) is None
    scancel = told_apart(terminated(None, 5.0), False, "", 6.0)
    assert scancel is not None and scancel.cause is StopCause.SCANCEL and scancel.cancelling


def test_a_preemption_the_controller_names_before_any_signal_starts_its_clock_when_asked() -> None:
    assert told_apart(None, True, "", 7.0) == Stop(StopCause.PREEMPTION, 7.0, notice_at=7.0)
    assert told_apart(None, False, "", 7.0) is None


def test_a_notice_handled_while_the_loop_replaces_the_stop_is_not_lost() -> None:
    """The signal handler only hands its fact over; the loop folds it in at its next read. A
    handler that replaced the value itself, run inside the loop's own replace (a handler runs
    between any two bytecodes), was overwritten by it: the notice, and its requeue, lost."""
    import os
    import signal

    from orchestrator.backends.slurm.node.agent_state import NOTICE_FACT, SIGTERM_FACT, AgentState

    state = AgentState()
    previous = signal.signal(signal.SIGUSR2, lambda *_: state.signalled(NOTICE_FACT, 9.0))
    try:
        def move(stop: Stop | None) -> Stop | None:
            os.kill(os.getpid(), signal.SIGUSR2)  # handled inside this move
            for _ in range(100):
                if state.stop_facts:
                    break
                time.sleep(0.01)
            return cancel_requested(stop, 5.0)

        state.update_stop(move)
        assert state.stop_facts and state.stop == Stop(StopCause.CANCEL, 5.0, notice_at=9.0)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    state = AgentState(preemption_asked=True)  # the controller said: no preemption
    state.signalled(SIGTERM_FACT, 3.0)
    assert state.stop == Stop(StopCause.SCANCEL, 3.0) and cancelled(state.stop)
