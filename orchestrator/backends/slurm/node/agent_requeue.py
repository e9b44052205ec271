"""The SLURM job agent's requeue and cancel protocol (``slurm.requeue``, ``orchestrator cancel``,
preemption): it gathers the evidence (the notice, the rank API's marker, the controller's word on
a preemption), takes the decisions of ``orchestrator.backends.slurm.node.agent_decisions``, and acts through
``orchestrator.backends.slurm.node.slurm_controller`` (scontrol requeue, scancel). Standard library only.
"""

from __future__ import annotations

import json
import os
import time

from orchestrator.backends.slurm.node import slurm_controller
from orchestrator.backends.slurm.node.agent_decisions import (ALWAYS, AUTO, UNFINISHED_EXIT, cancelled, no_requeue_left, notice_at,
                                                               preempted, requeue_evidence, requeue_why, requeues_used)
from orchestrator.backends.slurm.node.agent_state import AgentContext, Phase
from orchestrator.backends.slurm.node.agent_stop import StopCause, cancel_requested, cancel_sent, is_preemption, told_apart
from orchestrator.core.run_folder import RunFolder, stop_flag_note
from orchestrator.core.states import Action, EndReason, State

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

#: scontrol requeue (and the agent's scancel) may take this long, retries included.
SCONTROL_RETRY_S = 30.0


class Requeuer:
    """Requeue when it is due, at most once an attempt; tell a cancel from a preemption."""

    def __init__(self, ctx: AgentContext) -> None:
        self.ctx = ctx
        self.state = ctx.state

    # -- the evidence -------------------------------------------------------------------------
    def used(self) -> int:
        c = self.ctx
        return requeues_used(c.history.requeues(), c.slurm.restart, c.history.restarts_by_requeue())

    def marker(self) -> bool:
        return os.path.exists(self.ctx.marker)

    def stopping(self) -> bool:
        """Cancelled: by scancel (SIGTERM to this shell, not a preemption) or by ``orchestrator
        cancel`` (its request)."""
        s = self.state
        if s.stop is not None and s.stop.cause is StopCause.SIGTERM:
            self.term_is_preemption()  # a scancel or a preemption: asked once
        return cancelled(s.stop)

    def term_is_preemption(self) -> bool:
        """SIGTERM to this shell is a scancel, the time limit, or a preemption (SLURM's GraceTime:
        SIGTERM first, then the job is requeued or cancelled). Asked once, of the controller: a
        preempted job has a PreemptTime (or is PREEMPTED already). A preempted job is handled as
        at the time-limit notice: requeued by slurm.requeue, never counted as a cancel. (SLURM
        22.05 signals only the job's steps on preemption, not this shell: then the ranks' end
        under ``always`` is when it is asked.)"""
        s, c = self.state, self.ctx
        if not s.preemption_asked:
            s.preemption_asked = True
            job = slurm_controller.show_job(c.job_id)
            answer = preempted(job)
            mode = slurm_controller.partition_preempt_mode(job.get("Partition", "")) if answer else ""
            s.update_stop(lambda stop: told_apart(stop, answer, mode, time.monotonic()))
            if answer:
                shown = f" (partition PreemptMode={mode})" if mode else ""
                c.say(f"job {c.job_id} is being preempted{shown} (SIGTERM, then SLURM's GraceTime): the ranks "
                      f"got SIGTERM; slurm.requeue: {c.policy} decides the requeue")
        return is_preemption(self.state.stop)

    def finished_after_notice(self) -> bool:
        """The ranks ended having finished their work, though a notice came: they listened for a
        stop through the rank API (``jobs.StopFlag``) and never stopped on one, and rank 0's
        entrypoint returned in this attempt (its result.json). A script that does not use the
        rank API gives no such evidence: under ``always`` it is requeued after the notice, and
        resumes from its own snapshot."""
        try:
            with open(stop_flag_note(self.ctx.marker), encoding="utf-8") as fh:
                listening = fh.read().strip() == "listening"
            with open(RunFolder.of(self.ctx.run_dir).result, encoding="utf-8") as fh:
                finished = json.load(fh).get("finished")
        except (OSError, ValueError, AttributeError):
            return False
        return (listening and isinstance(finished, (int, float)) and finished >= self.state.started
                and not self.marker())

    def stopped_early(self) -> bool:
        """The ranks ended because they were told to stop, not because the work was done: the rank
        API checkpointed after a stop signal (its marker), or, under ``always``, a script that
        snapshots itself left on the time limit's notice."""
        return self.marker() or (self.ctx.policy == ALWAYS and notice_at(self.state.stop) is not None
                                 and not self.finished_after_notice())

    # -- the decisions, acted on --------------------------------------------------------------
    def if_due(self, ranks_ended: bool, work_done: bool = False) -> None:
        s, c = self.state, self.ctx
        if s.phase is not Phase.RUNNING or self.stopping():  # scancel / orchestrator cancel: never
            return
        if ranks_ended and work_done and notice_at(s.stop) is not None:
            c.say(f"{c.notice.name} came, but the ranks finished their work before stopping for it "
                  "(the rank API's stop flag never stopped them): the job is complete, not requeued")
            return
        if ranks_ended and c.policy == ALWAYS and notice_at(s.stop) is None:
            self.term_is_preemption()  # did the ranks end because the job is being preempted?
        marker = c.policy == AUTO and self.marker()
        if requeue_evidence(c.policy, notice_at(s.stop), marker) and os.path.lexists(c.cancel_request):
            s.update_stop(lambda stop: cancel_requested(stop, time.monotonic()))  # the ranks checkpointed on a cancel's SIGTERM
            return
        why = requeue_why(c.policy, c.notice.name, notice_at(s.stop), marker, ranks_ended, time.monotonic(),
                          c.payload.signal_margin_s)
        if why is not None:
            self.requeue(why)

    def requeue(self, why: str) -> None:
        """A requeue for the time limit or a preemption (slurm.requeue), bounded by slurm.max_requeues
        (recovery's restarts are counted apart)."""
        s, c = self.state, self.ctx
        s.enter(Phase.REQUEUEING)
        limit, used = c.payload.max_requeues, self.used()
        refused = no_requeue_left(used, limit)
        # SLURM 22.05 signals only the ranks' step on preemption: ask (once)
        if not refused and self.term_is_preemption() and s.stop is not None \
                and site_ends_preempted(s.stop.preempt_mode):
            refused = (f"preempted under the partition's PreemptMode={s.stop.preempt_mode}: the site's policy "
                       "ends the job (SLURM records it PREEMPTED), so it is not requeued; submit the spec "
                       "again to resume from the checkpoint")
        if refused:
            s.not_requeued = refused
            c.say(f"{why}; {refused}")
            s.enter(Phase.NOT_REQUEUED)
            return
        c.say(f"{why}: requeueing {c.job_id} (requeue {used + 1} of {limit})")
        self.scontrol_requeue()
        if s.phase is Phase.REQUEUED:
            s.action = Action.REQUEUE
            s.requeued_why = why

    def scontrol_requeue(self, exclude: list[str] | None = None) -> None:
        """``scontrol requeue``, retried within a bound; then, for a restart, the job's excluded
        nodes (ExcNodeList can only change while the job pends, which it does from the requeue
        until this agent has ended: the job is COMPLETING until then, so it cannot start yet)."""
        s, c = self.state, self.ctx
        answer = slurm_controller.requeue(c.job_id, SCONTROL_RETRY_S,
                                          on_retry=lambda a: c.say(f"scontrol requeue {c.job_id} failed: {a.complaint}"))
        if answer.ok:
            s.enter(Phase.REQUEUED)
            if exclude:
                self.exclude(exclude)
            return
        c.say(f"scontrol requeue {c.job_id} failed: {answer.complaint}")
        s.not_requeued = f"scontrol requeue failed: {answer.complaint}"
        s.enter(Phase.NOT_REQUEUED)

    def exclude(self, nodes: list[str]) -> None:
        """Add ``nodes`` to the job's ExcNodeList (keeping what the spec's slurm.exclude named)."""
        c = self.ctx
        # Both asked again on a failure: the requeue's SIGTERM can kill either scontrol, and an answer
        # lost here would drop what slurm.exclude named (or the exclusion itself).
        job = slurm_controller.show_job(c.job_id, SCONTROL_RETRY_S, persist=True)
        names = sorted(set(slurm_controller.controller_hosts(job.get("ExcNodeList", ""))) | set(nodes))
        problem = slurm_controller.set_excluded(c.job_id, names, SCONTROL_RETRY_S).complaint
        c.say(f"the next attempt excludes {', '.join(names)}" if not problem else
              f"could not exclude {', '.join(names)} from the next attempt: {problem}")

    def end_cancelled(self, why: str) -> int:
        """``orchestrator cancel`` asked, and the ranks ended (or their grace ran out): scancel this
        job, which SLURM records CANCELLED. If scancel fails, the job still never ends COMPLETED."""
        c = self.ctx
        c.say(f"orchestrator cancel: {why}; scancel {c.job_id}")
        problem = slurm_controller.scancel(c.job_id, timeout_s=SCONTROL_RETRY_S).complaint
        if problem:
            from orchestrator.node import forensics

            forensics.write_end(c.run_dir, reason=EndReason.CANCELLED, error=f"cancelled; scancel failed: {problem}")
        self.state.update_stop(lambda stop: cancel_sent(stop, time.monotonic()))  # asked once; SLURM ends the job (and this agent)
        return UNFINISHED_EXIT

    def site_ends_it(self) -> bool:
        """The job is preempted where the partition's PreemptMode ends it (SLURM records PREEMPTED)."""
        stop = self.state.stop
        return is_preemption(stop) and stop is not None and site_ends_preempted(stop.preempt_mode)

    def unfinished(self) -> int:
        """A stop that no requeue follows is not a completed job: end non-zero (SLURM records
        FAILED, not COMPLETED) with the reason in end.json, which status shows. A job preempted
        where the site's PreemptMode cancels it ends as SLURM decides: end.json says preempted,
        and the agent leaves the end to SLURM (``wait_for_site_end``)."""
        from orchestrator.node import forensics

        c = self.ctx
        if self.site_ends_it():
            forensics.write_end(c.run_dir, reason=EndReason.PREEMPTED, error=self.state.not_requeued)
            return UNFINISHED_EXIT
        why = self.state.not_requeued or f"slurm.requeue: {c.policy}"
        message = (f"the ranks stopped before their work was done (a stop signal, then a checkpoint) and the job "
                   f"was not requeued: {why}; submit the spec again to resume from the checkpoint")
        c.say(message)
        forensics.write_end(c.run_dir, reason=EndReason.NOT_REQUEUED, error=message)
        return UNFINISHED_EXIT


#: How long the agent of a job preempted under PreemptMode=CANCEL waits for SLURM to end it after
#: its ranks have ended (the partition's GraceTime has run from the preemption's SIGTERM already):
#: an agent that exited first would have SLURM record FAILED instead of PREEMPTED.
SITE_END_WAIT_S = 300.0


def site_ends_preempted(preempt_mode: str) -> bool:
    """Whether the partition's PreemptMode ends a preempted job (CANCEL, also in CANCEL,GANG):
    then the site's policy wins and the agent never requeues it."""
    return "CANCEL" in preempt_mode.upper().split(",")


def wait_for_site_end(say: Callable[[str], None], job_state: Callable[[], str], wait_s: float = SITE_END_WAIT_S,
                      pause_s: float = 2.0) -> str:
    """Wait (bounded) until SLURM has ended this preempted job (its state no longer RUNNING: it
    then records PREEMPTED whatever the agent's exit); returns the last state seen ('' if none)."""
    say(f"waiting up to {wait_s:g}s for SLURM to end the preempted job (PreemptMode=CANCEL)")
    deadline = time.monotonic() + wait_s
    state = ""
    while time.monotonic() < deadline:
        state = job_state()
        if state and state not in (State.RUNNING, "SUSPENDED"):  # SLURM ends it: PREEMPTED, COMPLETING...
            say(f"SLURM ended the job: {state}")
            return state
        time.sleep(pause_s)
    return state
