"""The SLURM job agent as the job's watchdog: the init deadline and the stall, judged as the
local supervisor judges them (``orchestrator.node.watchdog``) on a clock that leaves out the time
SLURM kept the job suspended; every rank's stacks through ``srun --overlap``
(``orchestrator.backends.slurm.node.stacks_probe``); and, while a cancel's stop is under way, whether the ranks can
still end on their own (``orchestrator.node.stop_judge``). Standard library only.

The watchdog's modules (forensics, join_hook, stacks, watchdog) are imported at its first look, a
second after srun started the ranks: the time to the ranks' first line is the job's start-up
cost, and on a busy node these imports would compete with the ranks' own.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Mapping

from orchestrator.backends.slurm.node import slurm_controller
from orchestrator.backends.slurm.node.agent_decisions import suspended_s
from orchestrator.backends.slurm.node.agent_state import AgentContext
from orchestrator.core.run_folder import RunFolder
from orchestrator.core.states import EndReason

if TYPE_CHECKING:
    from orchestrator.node.stop_judge import StopJudge
    from orchestrator.node.straggler_watch import StragglerWatch
    from pathlib import Path

    from orchestrator.node.watchdog import Dumps, Watch

#: While the watchdog would give a verdict, the controller is asked at most this often whether the
#: job is (or was) suspended.
SUSPEND_CHECK_S = 5.0


class AgentWatch:
    """The watchdog's looks, the stacks it saves, and the stop judge of a cancel."""

    def __init__(self, ctx: AgentContext, logs: dict[int, Path]) -> None:
        self.ctx = ctx
        self.state = ctx.state
        self.logs = logs
        self.watch: Watch | None = None
        self.stop_judge: StopJudge | None = None  # looks at the ranks' stacks while a cancel's stop is under way
        self.stragglers: StragglerWatch | None = None  # recovery.on: [straggler], made at the first look
        self.stragglers_since = 0.0  # the ranks' figures count from here: the attempt's start, or a rejoin's

    def restart(self, ranks: list[int], at: float) -> None:
        """Ranks replaced beside the others at ``at`` (survivors: keep): their stall clocks start
        again (``Watch.restart``) and the straggler looks start afresh (the window held the old
        rank's figures: the replacement would be named for its predecessor's pace)."""
        if self.watch is not None:
            self.watch.restart(ranks, at)
        self.stragglers, self.stragglers_since = None, at

    def look(self) -> str | None:
        """One look (once a second): the verdict's reason (the stacks saved, end.json written),
        or None."""
        from orchestrator.node import forensics, join_hook
        from orchestrator.node.watchdog import Watch, judge

        c, s = self.ctx, self.state
        if c.world <= 0:
            return None
        if self.watch is None:  # made at the first look, a second after srun: off the ranks' start-up
            self.watch = Watch(c.world, s.started, c.payload.watchdog.stall_s, c.payload.init_timeout_s)
        elif self.watch.settled():
            return None
        forensics.look(self.watch, c.run_dir, self.logs)
        now = self._running_clock(time.time())
        if now is None:
            return None
        verdict = judge(self.watch, now, lambda: join_hook.calling_ranks(c.run_dir, c.world), self.capture)
        if verdict is None:
            return None
        self._verdict(verdict.reason, verdict.rank, verdict.message, verdict.dumps)  # a Dumps: its stopped ranks too
        dump = verdict.dumps.get(verdict.rank) if verdict.rank is not None else None
        if dump:  # a straggler outside any collective is stuck on its own: recovery blames its node
            from orchestrator.core import stacks

            s.straggler_outside = stacks.where(dump).collective is None
        return verdict.reason

    def next_look_s(self, interval_s: float) -> float:
        """Seconds to the next look: ``interval_s``, or less when the stall clock runs out sooner
        (``Watch.next_look``, on the clock that leaves out the job's suspensions)."""
        if self.watch is None:
            return interval_s
        return self.watch.next_look(time.time() - self.state.suspended_s, interval_s)

    def straggler(self) -> str | None:
        """The straggler over watchdog.straggler_window_s, when recovery.on lists straggler
        (``orchestrator.node.straggler_watch``): the verdict (end.json), its node blamed
        (``state.straggler_node``); else None."""
        c, s = self.ctx, self.state
        if self.stragglers is None:
            from orchestrator.node.straggler_watch import StragglerWatch

            self.stragglers = StragglerWatch(c.payload, c.world)
        found = self.stragglers.look(c.run_dir, max(s.started, self.stragglers_since), time.time())
        if found is None:
            return None
        s.straggler_node = c.host_of(found.rank) if c.rank_hosts else None
        self._verdict(EndReason.STRAGGLER, found.rank, self.stragglers.message(found, s.straggler_node), {})
        return EndReason.STRAGGLER

    def _running_clock(self, now: float) -> float | None:
        """The watchdog's clock: wall time less the time the job spent suspended, so that ranks
        SLURM only stopped (``scontrol suspend``, a SUSPEND,GANG preemption) are never called
        stalled or late to join for it. The controller is asked only when a verdict is near (at
        most every SUSPEND_CHECK_S), or at once after the agent itself was stopped (``stopped_seen``:
        SLURM stops the agent with its job, so its own loop sees the gap; the ranks may have reported
        again before this look, and the suspension would go unsaid): None while the job is
        suspended (no verdict now)."""
        assert self.watch is not None
        s, c = self.state, self.ctx
        adjusted = now - s.suspended_s
        stopped, s.stopped_seen = s.stopped_seen, False
        if not (stopped or self.watch.stalled(adjusted) or self.watch.never_joined(adjusted)):
            return adjusted
        if not stopped and s.suspend_checked is not None and time.monotonic() < s.suspend_checked + SUSPEND_CHECK_S:
            return adjusted if not s.suspended_now else None
        s.suspend_checked = time.monotonic()
        job = slurm_controller.show_job(c.job_id)
        s.suspended_now = job.get("JobState") == "SUSPENDED"
        if s.suspended_now:
            return None
        total = suspended_s(job, now)
        if total is not None and total > s.suspended_s + 1.0:
            c.say(f"job {c.job_id} was suspended for {total - s.suspended_s:.0f}s: the watchdog's "
                  "clocks (stall_s, init_timeout_s) do not count it")
            s.suspended_s = total
        return now - s.suspended_s

    def capture(self, reason: str, always: bool = False) -> Dumps:
        """Every rank's stacks through ``srun --overlap`` (one probe per node), saved in
        <run>/stacks/. A rank its probe did not ask because it is stopped is saved and returned
        as ``forensics.capture_local`` has it: a file saying why, and ``Dumps.stopped``."""
        from orchestrator.node.watchdog import Dumps

        c = self.ctx
        if not (c.payload.watchdog.stacks_on_failure or always):
            return Dumps()
        from orchestrator.core import stack_files
        from orchestrator.backends.slurm.node.stacks_probe import request_slurm
        from orchestrator.node import stack_requests

        c.say(f"{reason}: saving every rank's stacks in {RunFolder.of(c.run_dir).stacks}")
        dumps, problem = request_slurm(c.run_dir, c.slurm.raw_job_id, c.payload.nodes, c.payload.python, hosts=c.rank_hosts)
        if problem:
            c.say(f"stacks: {problem.splitlines()[-1] if problem.splitlines() else problem}")
        stopped = stopped_ranks(problem)
        if any(dumps.values()) or stopped:
            stack_files.save(c.run_dir, {**dumps, **{r: f"(not asked: {stack_requests.STOPPED})\n" for r in stopped}},
                             reason)
        return Dumps({r: text for r, text in dumps.items() if r not in stopped}, stopped)

    def time_limit_stacks(self) -> None:
        """The time limit's notice with no requeue to follow: save where the ranks are first."""
        c = self.ctx
        dumps = self.capture(f"the time limit ({c.notice.name}) with no requeue left")
        if c.payload.watchdog.stacks_on_failure:
            from orchestrator.node import forensics

            forensics.write_end(c.run_dir, reason=EndReason.TIME_LIMIT, waits=forensics.waits_of(dumps))

    def _verdict(self, reason: str, rank: int | None, message: str, dumps: Mapping[int, str]) -> None:
        from orchestrator.node import forensics

        c = self.ctx
        message = message.replace("<run>", c.run_dir)
        c.say(message)
        forensics.write_end(c.run_dir, reason=reason, failed_rank=rank, error=message,
                            waits=forensics.waits_of(dumps) if any(dumps.values()) else {})

    def stuck_after_cancel(self) -> bool:
        """While a cancel's stop is under way, look at the ranks' stacks now and then (``srun
        --overlap``, as the watchdog does): True when every rank waits in a collective that cannot
        complete (``orchestrator.node.stop_judge``), with end.json saying why and where each rank
        waited; then the agent ends the ranks now, not after stop_grace_s: srun, sent SIGTERM,
        SIGKILLs its tasks at once ("forcing job termination"), as it would under a plain scancel
        while the job still runs. (A plain scancel here would not do: once the job is cancelled,
        slurmd ends its steps itself, SIGTERM then SIGKILL only after KillWait.) The loop then
        sees srun end and scancels the job (CANCELLED)."""
        from orchestrator.node.stop_judge import StopJudge

        c, s = self.ctx, self.state
        assert s.stop is not None  # orchestrator cancel asked: its grace counts from its request
        if self.stop_judge is None:
            self.stop_judge = StopJudge(s.stop.at, c.world)
        if not self.stop_judge.due(time.monotonic()):
            return False
        from orchestrator.backends.slurm.node.stacks_probe import request_slurm

        asked = time.monotonic()
        dumps, _ = request_slurm(c.run_dir, c.slurm.raw_job_id, c.payload.nodes, c.payload.python, hosts=c.rank_hosts)
        stuck = self.stop_judge.look(asked, dumps)
        if stuck is None:
            return False
        from orchestrator.node import forensics
        from orchestrator.core import stack_files

        message = stuck.message(c.payload.stop_grace_s)
        try:  # the job is ended all the same when the shared folder takes no more
            stack_files.save(c.run_dir, dumps, "stuck in collectives after the cancel's SIGTERM")
            forensics.write_end(c.run_dir, reason=EndReason.CANCELLED, error=message, waits=stuck.waits)
        except OSError as exc:
            c.say(f"could not record why in {c.run_dir}: {exc}")
        c.say(f"orchestrator cancel: {message}")
        return True


def stopped_ranks(problem: str) -> list[int]:
    """The ranks that ``stacks_probe.request_slurm``'s complaint says were not asked because they
    are stopped (its lines ``rank N: not asked: WHY``, WHY ``stack_requests.STOPPED``)."""
    from orchestrator.node.stack_requests import STOPPED

    found = []
    for line in problem.splitlines():
        head, said, why = line.partition(": not asked: ")
        number = head.removeprefix("rank ")
        if said and why == STOPPED and number.isascii() and number.isdigit():
            found.append(int(number))
    return found
