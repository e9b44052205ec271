"""A restart inside the job without new interpreters (issue 50, item 2): the next attempt's ranks
are forked from the warm standbys on their nodes (``agent_standby``), not started by a new srun
step in which every rank imports torch again.

The agent holds one standby per node of the ranks and per spare once the ranks train
(``agent_standby.training``); they outlive the attempts inside the job. When a failure restarts
the ranks inside the job and every node of the next attempt has a standby that is ready, the
attempt's ranks are forked from them, each as the rank it is (``slurm_task.stand_in``: the
``SLURM_PROCID/LOCALID/NODEID/NTASKS/STEP_NODELIST`` the ranks' step would have set, the attempt's
own variables and rendezvous port), its output appended to its log. ``ForkedStep`` stands for the
ranks' srun in the agent's loop: it ends when every rank has, says what srun would say of a rank
that ended badly ("srun: error: node2: task 1: Exited with exit code 1", read by the same code as
srun's own words), and does what ``--kill-on-bad-exit`` does (the other ranks are killed) unless
the survivors are kept. Signals (a cancel, the time limit's notice) go to every rank through its
standby. Standard library only.

Not forked (a new step, as before): the job's first attempt; a node without a ready standby (a
spare not yet warm, a lost node's); ranks in a container (the standby runs on the host); an
``nccl`` job (the standby's step holds no GPUs; checked on no GPU cluster yet).
"""

from __future__ import annotations

import signal
import sys
import time
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from orchestrator.backends.slurm.node.agent_srun_messages import note_srun_line
from orchestrator.backends.slurm.node.agent_standby import AFTER_JOIN_S, Forked, Standbys, preload_for, training, wait_for
from orchestrator.backends.slurm.node.agent_state import AgentContext, say

if TYPE_CHECKING:
    from orchestrator.node.watchdog import Watch

#: How long a standby may still be reporting its last set's ends before a new set is forked.
SET_END_WAIT_S = 5.0


def may_fork(ctx: AgentContext, standbys: Standbys, hosts: Sequence[str]) -> str | None:
    """Why this attempt's ranks cannot be forked from the standbys on ``hosts`` (None: they can)."""
    p = ctx.payload
    if not p.recovery.standbys:
        return "recovery.standbys is off"
    if p.container is not None:
        return "the ranks run in a container"
    if p.backend == "nccl":
        return "an nccl job's standbys hold no GPUs"
    if not p.rank_log:
        return "the ranks have no log of their own"
    missing = [host for host in hosts if standbys.on(host) is None]
    if missing:
        return f"no warm standby on {', '.join(missing)}"
    # One still importing is no reason: a rank forked from it starts once its imports are done,
    # sooner than a new interpreter that imports them again beside it.
    busy = [host for host in hosts if (standby := standbys.on(host)) is None or standby.running]
    if busy:
        return f"the standby on {', '.join(busy)} still ends its ranks"
    return None


def forks_ranks(ctx: AgentContext, standbys: Standbys, hosts: Sequence[str] | None) -> bool:
    """Whether an attempt inside the job forks its ranks from the standbys on ``hosts`` (its step's
    nodes), else it starts a new step (and says why)."""
    why_not = may_fork(ctx, standbys, hosts) if hosts else "too few nodes"
    if why_not is not None:
        say(f"the ranks start as a new step: {why_not}")
    return why_not is None


#: How often the ranks' progress is read for the standbys' start.
LOOK_S = 1.0


def warm_up_once_training(ctx: AgentContext, standbys: Standbys, rank_argv: Sequence[str],
                          environ: Callable[[], Mapping[str, str]], watch: Watch | None) -> None:
    """Start the job's standbys on the ranks' nodes and the spares once the ranks are past their
    start (``agent_standby.training``; ``watch``: the attempt's joins and progress; looked at once a
    second): for a restart inside the job, or a rank replaced beside the others (survivors: keep).
    Nothing for a job that restarts no rank inside it."""
    from orchestrator.backends.slurm.node.agent_survivors import spare_hosts
    from orchestrator.core.progress import read_progress

    p = ctx.payload
    keep = p.recovery.survivors == "keep"
    restarts = p.recovery.max_restarts > 0 and p.recovery.in_allocation and p.backend != "nccl"  # (may_fork)
    if not p.recovery.standbys or not (keep or restarts) or ctx.world <= 0 or not ctx.slurm.hosts \
            or p.container is not None or time.monotonic() < standbys.looked_at + LOOK_S:
        return
    standbys.looked_at = time.monotonic()
    hosts = [*ctx.rank_hosts, *spare_hosts(ctx)]
    if all(host in standbys.by_host for host in hosts):
        return
    reported = [report.time if report is not None else None for report in read_progress(ctx.run_dir, ctx.world)]
    if training(reported, past_their_start(watch, ctx.world, time.time()), ctx.state.started, time.time()):
        standbys.warm_up(hosts, rank_argv, environ(), preload_for(p.entrypoint), p.ranks_per_node, p.stop_grace_s)


def past_their_start(watch: Watch | None, world: int, now: float) -> list[bool]:
    """Each rank past its own start, as far as the watchdog can say: with ``watchdog.stall_s`` it
    reads the ranks' output, and new output AFTER_JOIN_S after a rank's join says so (a join alone
    does not: the standbys' imports would compete with the rest of its start, DDP's included, and
    the stall clock runs from the join); without it the watchdog stops reading once every rank has
    joined, no stall clock can be misled, and the join and AFTER_JOIN_S say so."""
    if watch is None:
        return [False] * world
    if watch.stall_s:
        return [watch.progressed_since_join(rank, AFTER_JOIN_S) for rank in range(world)]
    return [rank in watch.joined and now >= watch.joined[rank] + AFTER_JOIN_S for rank in range(world)]


class ForkedStep:
    """The attempt's ranks forked from the standbys, seen by the agent as its srun (``poll``,
    ``send_signal``, ``wait``, ``kill``; no ``stderr``: its messages are noted as they happen)."""

    stderr = None

    def __init__(self, ctx: AgentContext, standbys: Standbys, rank_argv: Sequence[str], environ: Mapping[str, str],
                 kill_on_bad_exit: bool) -> None:
        self.ctx = ctx
        self.kill_on_bad_exit = kill_on_bad_exit
        self.ranks: dict[int, Forked] = {}
        self.hosts: dict[int, str] = {}
        self.seen: dict[int, int] = {}  # rank -> its exit, once noted
        self.killed = False
        for rank in range(ctx.world):
            host = ctx.host_of(rank)
            standby = standbys.on(host)
            if standby is None:
                raise OSError(f"the standby on {host} is gone")
            deadline = time.monotonic() + SET_END_WAIT_S
            while standby.running and time.monotonic() < deadline:  # its last set's ends still coming
                time.sleep(0.02)
            log = str(ctx.slurm.rank_log(ctx.payload.rank_log or "", rank))
            self.ranks[rank] = standby.fork(rank, rank_argv, ctx.rank_hosts, environ, log)
            self.hosts[rank] = host
        cold = sorted({h for h in self.hosts.values() if not standbys.by_host[h].ready})
        say(f"{ctx.world} rank(s) forked from the warm standbys on {','.join(dict.fromkeys(self.hosts.values()))} "
            "(no new step, no new interpreter)" + (f"; {', '.join(cold)} still importing: its ranks start once done"
                                                   if cold else ""))

    def poll(self) -> int | None:
        """None while a rank runs; then srun's code: the first rank's failure, else 0."""
        codes = {rank: forked.poll() for rank, forked in self.ranks.items()}
        for rank, code in codes.items():
            if code is None or rank in self.seen:
                continue
            self.seen[rank] = code
            if code != 0:
                words = srun_words(self.hosts[rank], rank, code)
                print(words, file=sys.stderr, flush=True)  # as srun's own would be, in the batch log
                note_srun_line(words, self.ctx.state)
                if self.kill_on_bad_exit and not self.killed:
                    self.killed = True  # as --kill-on-bad-exit: the others go at once
                    self.kill()
        if any(code is None for code in codes.values()):
            return None
        return next((code for code in self.seen.values() if code != 0), 0)

    def send_signal(self, signum: int) -> None:
        """To every rank still running (each standby passes it to the ranks it forked)."""
        for standby in {id(f.standby): f.standby for f in self.ranks.values()}.values():
            if standby.running:
                standby.send({"signal": int(signum)})

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        return wait_for(self.poll, timeout, "the forked ranks")


def srun_words(host: str, rank: int, code: int) -> str:
    """What srun says of a task that ended badly (``agent_decisions.SRUN_TASK_ENDED`` reads it)."""
    if code > 128 and code - 128 in signal.valid_signals():
        what = signal.strsignal(code - 128) or f"signal {code - 128}"
    else:
        what = f"Exited with exit code {code}"
    return f"srun: error: {host}: task {rank}: {what}"
