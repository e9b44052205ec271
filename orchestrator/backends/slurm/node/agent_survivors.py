"""``recovery.survivors: keep`` in a SLURM job (issue 50): a failed rank starts again as a step of
its own beside the ranks' step, whose other tasks run on with their state.

The ranks' step runs with ``--kill-on-bad-exit=0`` (planned so for ``survivors: keep``): SLURM
leaves the survivors alone when a task fails, and srun says which task ended and how ("srun:
error: node2: task 1: Exited with exit code 1"; the agent's relay keeps them in
``AgentState.task_ends``). When ``orchestrator.core.rejoins.Rejoins`` allows it, the attempt ends
as a restart and the next begins at once: the generation is announced, and the lost rank runs
again on its node as

    srun --overlap --mem=0 --nodes=1 --ntasks=1 --nodelist=NODE --output=ITS_LOG --open-mode=append
         ... slurm_rank PAYLOAD --stand-in R --step-nodes NODE1,NODE2

``--overlap`` and ``--mem=0`` because the ranks' step still holds the node's CPUs and memory (22.05
refuses the step otherwise: "Memory required by task is not available"); ``slurm_task.stand_in``
gives it rank R's place and the SLURM variables the ranks' step set for R. Checked on 22.05
before building this: the survivors' tasks run on, and the new step starts tens of milliseconds
after its srun. A failure that cannot be rejoined (a script without ``jobs.Healer``, no restart
left) ends every rank, as ``--kill-on-bad-exit=1`` would have, and the agent recovers as with
``survivors: restart``. Standard library only.
"""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Mapping, Sequence

from orchestrator.backends.slurm.node.agent_standby import Forked, Standbys, beside_step, stand_in_args
from orchestrator.backends.slurm.node import slurm_controller
from orchestrator.backends.slurm.node.agent_state import AgentContext
from orchestrator.node.chaos_node import SENT
from orchestrator.core import rank_error
from orchestrator.core.interpreter import lean_module_argv
from orchestrator.core.recovery import HARDWARE_SIGNALS, Failure
from orchestrator.core.rejoins import Rejoins
from orchestrator.core.run_folder import RunFolder
from orchestrator.core.states import FailureKind
from orchestrator.node.rank_env import OrchVar


def stand_in_argv(rank_argv: Sequence[str], rank: int, host: str, log: str, step_hosts: Sequence[str]) -> list[str]:
    """The srun that starts rank ``rank`` again on ``host`` beside the ranks' step, appending to its log."""
    head, program = beside_step(rank_argv, host, f"--output={log}", "--open-mode=append")
    return [*head, *program, *stand_in_args(rank, step_hosts)]


#: The bound on the srun that kills a straggler on its node (a busy controller takes its time).
KILL_SRUN_TIMEOUT_S = 20.0


def exit_code_of(step_code: int, codes: list[int | None], replaced: bool) -> int:
    """The attempt's exit code: the ranks' step's (``step_code``), unless ranks were replaced: then 0
    when every rank's last process (``codes``, by rank) ended 0, else the first failure's code."""
    return next((code for code in codes if code), 0) if replaced else step_code


def spare_hosts(ctx: AgentContext) -> list[str]:
    """The job's nodes that run no rank and may take a lost node's place (none lost or excluded)."""
    avoid = set(ctx.rank_hosts) | ctx.state.lost_nodes | set(ctx.history.excluded)
    return [host for host in ctx.slurm.hosts if host not in avoid]


class StandIns:
    """One attempt loop's replaced ranks: their steps, and every rank's exit as far as known."""

    def __init__(self, ctx: AgentContext, rank_argv: Sequence[str], environ: Mapping[str, str],
                 standbys: Standbys | None = None) -> None:
        self.ctx = ctx
        self.rejoins = Rejoins(ctx.payload)
        self.rank_argv = list(rank_argv)
        self.environ = dict(environ)
        self.steps: dict[int, subprocess.Popen[bytes] | Forked] = {}  # rank -> the process now running it
        self.given_up = False  # a failure could not be rejoined: every rank ends, recovery decides
        self.standbys = Standbys() if standbys is None else standbys  # the job's warm interpreters (agent_standby)
        self.hung: dict[int, Failure] = {}  # a straggler killed alone, until its replacement is started
        self.hung_at = 0.0
        self.slow_nodes: set[str] = set()  # a slow rank's node (recovery.on: straggler): its rank moves to a spare

    def codes(self, step_code: int | None) -> list[int | None]:
        """Each rank's exit code (None: running): its replacement's, else its task's in the ranks'
        step (srun names only those that failed; the rest ended 0 once the step has: ``step_code``)."""
        ends, lost = self.ctx.state.task_ends, self.ctx.state.lost_nodes
        codes: list[int | None] = []
        for rank in range(self.ctx.world):
            if rank in self.steps:
                codes.append(self.steps[rank].poll())
            elif self.ctx.host_of(rank) in lost:  # its node is gone (srun need not say so of each task)
                codes.append(ends.get(rank, 128 + signal.SIGKILL))
            else:
                codes.append(ends.get(rank, 0 if step_code is not None else None))
        return codes

    def failed(self, step_code: int | None) -> list[int]:
        return [rank for rank, code in enumerate(self.codes(step_code)) if code not in (None, 0)]

    def running(self) -> bool:
        return any(step.poll() is None for step in self.steps.values())

    def failure(self, failed: list[int], codes: list[int | None]) -> Failure:
        """What the attempt that a rejoin ends is recorded with: the first lost rank's traceback
        (``<run>/errors/rank-N.json``), else how srun saw it end (a hardware-like signal blames its node)."""
        rank = failed[0]
        if rank in self.hung:  # the watchdog's straggler, killed alone: its verdict is the story
            return self.hung[rank]
        gone = sorted({self.ctx.host_of(r) for r in failed} & self.ctx.state.lost_nodes)
        if gone:
            return Failure(FailureKind.NODE_FAILURE, f"lost node(s) {', '.join(gone)}", tuple(gone))
        host = self.ctx.host_of(rank)
        error = rank_error.read(RunFolder.of(self.ctx.run_dir).error(rank))
        if error is not None:
            return Failure(FailureKind.CRASH, error.headline())
        code = codes[rank] or 0
        if code > 128:
            name = signal.Signals(code - 128).name if code - 128 in signal.valid_signals() else f"signal {code - 128}"
            return Failure(FailureKind.CRASH, f"rank {rank} on {host} was killed by a signal ({name})",
                           (host,) if name in HARDWARE_SIGNALS else ())
        return Failure(FailureKind.CRASH, f"rank {rank} on {host} ended with exit code {code}")

    def move_off_lost_nodes(self, failed: list[int]) -> bool:
        """The failed ranks whose node is lost (srun: "Node failure on node2") or slow (a straggler's,
        ``end_straggler``) start again on a spare node of the job: the ranks' nodes (``ctx.step``)
        take the spare in that one's place (for a later restart, the stack probes, the attempt's
        record), the node is excluded as recovery would exclude it. False: the job holds no spare
        left (every rank ends)."""
        c = self.ctx
        gone = [host for host in dict.fromkeys(c.host_of(r) for r in failed)
                if host in c.state.lost_nodes or host in self.slow_nodes]
        free = spare_hosts(c)
        if len(free) < len(gone):
            c.say(f"node(s) {', '.join(gone)} lost and no spare left to take their ranks: every rank ends")
            return False
        step = list(c.rank_hosts)
        for node in gone:
            spare = free.pop(0)
            step[step.index(node)] = spare
            what = "slow" if node in self.slow_nodes else "lost"
            c.say(f"node {node} {what}: its ranks start again on the spare {spare}, beside the others")
        c.step = tuple(step)
        if gone and c.payload.recovery.exclude_failed_nodes:
            c.history.excluded = sorted(set(c.history.excluded) | set(gone))
        c.state.lost_nodes -= set(gone)
        self.slow_nodes -= set(gone)
        return True

    def replace(self, attempt: int) -> list[int]:
        """Announce the next generation (``Rejoins.announce``) and start each lost rank again on its
        node: forked from the node's standby, else as a step of its own; the ranks replaced."""
        c = self.ctx
        assert c.payload.rank_log is not None  # a SLURM payload names its ranks' logs
        logs = [str(c.slurm.rank_log(c.payload.rank_log, rank)) for rank in range(c.world)]
        lost = self.rejoins.announce(logs, attempt)
        env = {**self.environ, OrchVar.HEAL_GENERATION: str(self.rejoins.generation)}
        for rank in lost:
            c.state.task_ends.pop(rank, None)
            self.hung.pop(rank, None)
            host = c.host_of(rank)
            standby = self.standbys.on(host)
            if standby is not None:
                self.steps[rank] = standby.fork(rank, self.rank_argv, c.rank_hosts, env, logs[rank])
                c.say(f"rank {rank}: forked from {host}'s warm standby" + ("" if standby.ready else
                                                                          " (still importing: it starts once done)"))
                continue
            c.say(f"rank {rank}: started as a step of its own on {host} (no warm standby there)")
            argv = stand_in_argv(self.rank_argv, rank, host, logs[rank], c.rank_hosts)
            self.steps[rank] = slurm_controller.start(argv, env)
        return lost

    def end_straggler(self, slow: bool = False) -> bool:
        """After a watchdog verdict that names a rank (the straggler its peers wait for, end.json):
        when it may be replaced beside the others, SIGKILL it alone on its node (``chaos_node``
        through ``srun --overlap``); the rejoin follows its end, recorded as the hang. ``slow``: the
        verdict is a straggler's (``recovery.on: [straggler]``, a rank persistently slower than the
        others): its node is blamed and the rank starts again on a spare, so only when it is its
        node's one rank and a spare is free. True while that is under way (the agent then ends
        nobody, and a later verdict, which would blame a survivor waiting for the replacement,
        changes nothing); False: every rank ends, as without ``keep`` (also when the killed
        straggler's end was not seen within KILL_SRUN_TIMEOUT_S)."""
        from orchestrator.node import forensics

        c = self.ctx
        end = forensics.read_end(c.run_dir)
        rank, message = (end.failed_rank, end.error or end.reason) if end is not None else (None, "watchdog")
        if self.hung:  # a straggler was killed: its peers wait for its replacement, no one else is to blame
            return time.monotonic() < self.hung_at + KILL_SRUN_TIMEOUT_S
        if not isinstance(rank, int) or not 0 <= rank < c.world or \
                not self.rejoins.may_rejoin([rank], self.codes(None), False, True):
            return False
        if slow and (c.payload.ranks_per_node != 1 or not spare_hosts(c)):
            c.say(f"the straggler, rank {rank}, cannot move alone to a spare ("
                  + ("its node holds other ranks" if c.payload.ranks_per_node != 1 else "no spare is free")
                  + "): every rank restarts")
            return False
        node = c.host_of(rank)
        head, program = beside_step(self.rank_argv, node, "--quiet")
        argv = [*head, *lean_module_argv(program[0], "orchestrator.node.chaos_node", c.run_dir,
                                         str(rank), "KILL")]
        done = slurm_controller.run(argv, KILL_SRUN_TIMEOUT_S, env=self.environ, quiet_stdin=True,
                                    done=lambda a: SENT in a.stdout)  # sent: never ask again
        if SENT not in done.stdout:
            c.say(f"the straggler, rank {rank}, could not be killed alone "
                  f"({slurm_controller.one_line(done.complaint or 'no answer')}): every rank ends")
            return False
        if slow:
            self.slow_nodes.add(node)
        self.hung[rank] = Failure(FailureKind.STRAGGLER if slow else FailureKind.HANG, message.splitlines()[0],
                                  (node,) if slow else ())
        self.hung_at = time.monotonic()
        c.say(f"rank {rank}, the straggler, killed alone on {node}: it is replaced beside the others")
        return True

    def signal(self, signum: int) -> None:
        for step in self.steps.values():
            if step.poll() is None:
                step.send_signal(signum)

    def end(self, grace_s: float) -> None:
        """SIGTERM to each replacement (srun or the standby passes it on), SIGKILL after ``grace_s``."""
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for step in self.steps.values():
            try:
                step.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                step.kill()
                step.wait(timeout=10)
