"""Why the SLURM job is being stopped from outside, as one value (``Stop``): its cause and since
when, replaced as each fact comes (the time limit's notice, a SIGTERM, the controller's answer on
a preemption, ``orchestrator cancel``'s request, the agent's own scancel). The agent's state holds
``stop`` (None: nobody asked) where it held six flags and timestamps that had to agree.

The moves, each a pure function of the value before and the fact: ``noticed``, ``terminated``,
``told_apart``, ``cancel_requested``, ``cancel_sent`` and ``carried`` (into the next attempt
inside the job). Times are monotonic. Standard library only.
"""

from __future__ import annotations

from enum import Enum

from orchestrator.core.lean_record import record, replace


class StopCause(Enum):
    """Who asked the job to stop, as far as the agent knows."""

    NOTICE = "the time limit's notice"  # slurm.signal: the ranks checkpoint; slurm.requeue decides
    SIGTERM = "a SIGTERM"  # to the batch shell, not told apart yet: a preemption or a scancel (asked once)
    PREEMPTION = "a preemption"  # handled as the notice: requeued by slurm.requeue, never a cancel
    SCANCEL = "a scancel"  # a SIGTERM that is no preemption: SLURM ends the job
    CANCEL = "orchestrator cancel"  # its request: the ranks have stop_grace_s, then the agent ends the job


#: The causes that end the job without a requeue or a restart.
CANCELLING = frozenset({StopCause.SCANCEL, StopCause.CANCEL})


@record
class Stop:
    """``cause`` since ``at``. ``notice_at``: when the notice (or the preemption's SIGTERM) came,
    kept through later causes: the requeue's deadline counts from it. ``preempt_mode``: the
    preempting partition's PreemptMode. ``sent``: the agent asked SLURM to end the job (once)."""

    cause: StopCause
    at: float
    notice_at: float | None = None
    preempt_mode: str = ""
    sent: bool = False

    @property
    def cancelling(self) -> bool:
        """A scancel or ``orchestrator cancel``: no requeue, no restart."""
        return self.cause in CANCELLING


def noticed(stop: Stop | None, now: float) -> Stop:
    """The time limit's notice (slurm.signal) came; its first moment counts."""
    if stop is None:
        return Stop(StopCause.NOTICE, now, notice_at=now)
    return stop if stop.notice_at is not None else replace(stop, notice_at=now)


def terminated(stop: Stop | None, now: float, preemption_denied: bool = False) -> Stop:
    """SIGTERM came to the batch shell: a scancel or a preemption, told apart when asked (a scancel
    at once where the controller said already that the job is not preempted). A cause already
    known (a cancel, a preemption, a scancel) stays."""
    cause = StopCause.SCANCEL if preemption_denied else StopCause.SIGTERM
    if stop is None:
        return Stop(cause, now)
    if stop.cause is StopCause.NOTICE:
        return replace(stop, cause=cause, at=now)
    return stop


def told_apart(stop: Stop | None, preempted: bool, preempt_mode: str, now: float) -> Stop | None:
    """The controller's answer on a preemption (asked once an attempt). A preemption is a notice:
    its clock starts at the notice, else at the SIGTERM, else now (SLURM 22.05 may signal only the
    ranks' step). Not preempted: a SIGTERM was a scancel; anything else stays."""
    if preempted:
        if stop is not None and stop.cancelling:
            return stop
        since = stop.notice_at if stop is not None and stop.notice_at is not None else \
            stop.at if stop is not None and stop.cause is StopCause.SIGTERM else now
        return Stop(StopCause.PREEMPTION, since, notice_at=since, preempt_mode=preempt_mode)
    if stop is not None and stop.cause is StopCause.SIGTERM:
        return replace(stop, cause=StopCause.SCANCEL)
    return stop


def cancel_requested(stop: Stop | None, now: float) -> Stop:
    """``orchestrator cancel``'s request was seen: the ranks' grace counts from now."""
    if stop is not None and stop.cause is StopCause.CANCEL:
        return stop
    return Stop(StopCause.CANCEL, now, notice_at=stop.notice_at if stop is not None else None)


def cancel_sent(stop: Stop | None, now: float) -> Stop:
    """The agent scancelled its job for ``orchestrator cancel``: asked once, SLURM ends the rest."""
    return replace(cancel_requested(stop, now), sent=True)


def carried(stop: Stop | None, sigterm_came: bool) -> Stop | None:
    """What the next attempt inside the job starts from: the notice and the SIGTERM go on counting;
    whether that SIGTERM was a preemption is asked again."""
    if stop is None:
        return None
    if sigterm_came:
        return Stop(StopCause.SIGTERM, stop.at, notice_at=stop.notice_at)
    return Stop(StopCause.NOTICE, stop.notice_at, notice_at=stop.notice_at) if stop.notice_at is not None else None


def cancel_asked(stop: Stop | None) -> bool:
    """``orchestrator cancel`` asked (its request was seen)."""
    return stop is not None and stop.cause is StopCause.CANCEL


def is_preemption(stop: Stop | None) -> bool:
    """The controller said the job is being preempted (and no cancel came first)."""
    return stop is not None and stop.cause is StopCause.PREEMPTION
