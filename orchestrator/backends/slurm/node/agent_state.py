"""The SLURM job agent's state, explicit: its ``Phase`` (defined with the other states in
``orchestrator.core.states``; the moves it may make are here) and every fact it has gathered during
one attempt (``AgentState``), plus what its parts share (``AgentContext``). Standard library only
(the agent runs it on the job's first node).

The decisions on this state are pure functions in ``orchestrator.backends.slurm.node.agent_decisions``; the agent's
loop (``orchestrator.backends.slurm.node.slurm_job``) and its parts (``agent_requeue``, ``agent_recovery``,
``agent_watch``) gather the facts and act on the decisions.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from orchestrator.core.payload import Payload
from orchestrator.core.recovery import Attempt, Failure, History
from orchestrator.backends.slurm.node.agent_stop import Stop, noticed, terminated
from orchestrator.backends.slurm.node.slurm_task import SlurmJob
from orchestrator.core.states import Action, Phase


MOVES: dict[Phase, frozenset[Phase]] = {
    Phase.RUNNING: frozenset({Phase.REQUEUEING, Phase.ENDING, Phase.RESTARTING}),
    Phase.REQUEUEING: frozenset({Phase.REQUEUED, Phase.NOT_REQUEUED}),
    Phase.REQUEUED: frozenset(), Phase.NOT_REQUEUED: frozenset(),
    Phase.ENDING: frozenset({Phase.REQUEUEING, Phase.RESTARTING}), Phase.RESTARTING: frozenset(),
}

#: The facts a signal handler hands the agent's loop (``AgentState.signalled``).
NOTICE_FACT, SIGTERM_FACT = "notice", "sigterm"

#: srun's first message about a task that ended badly: (host, task, what), the what of a signal.
Killed = tuple[str, int, str]


@dataclass
class AgentState:
    """Everything one attempt of the agent knows: its phase, what it received and when (monotonic
    times), and what the attempt led to. Nothing else of the agent changes during an attempt."""

    phase: Phase = Phase.RUNNING
    received: list[str] = field(default_factory=list)  # the signals that came, by name
    started: float = 0.0  # wall time srun started the ranks
    _stop: Stop | None = None  # read as ``stop``
    stop_facts: list[tuple[str, float]] = field(default_factory=list)  # the signal handler's (kind, monotonic time)
    facts_folded: int = 0  # how many of ``stop_facts`` ``stop`` holds
    preemption_asked: bool = False  # the controller was asked whether the job is preempted (once an attempt)
    notice_pending: bool = False  # stacks first, then the notice is forwarded (a rank may end on it)
    not_requeued: str = ""  # why a requeue that was due did not happen (Phase.NOT_REQUEUED)
    requeued_why: str = ""  # why this attempt requeued the job (the time limit, a preemption)
    action: Action = Action.NONE  # what this attempt led to
    failure: Failure | None = None  # what ended this attempt, for recovery.decide
    over_limit: str = ""  # SLURM requeued the job after a node failure with no restart left
    first_end: str | None = None  # srun's line about the first task that ended badly
    killed: Killed | None = None  # that task, if a signal ended it
    task_ends: dict[int, int] = field(default_factory=dict)  # every task of the ranks' step that ended badly: its code
    lost_nodes: set[str] = field(default_factory=set)  # nodes srun said the step lost
    straggler_node: str | None = None  # the node of a straggler that ended the attempt (recovery.on: straggler)
    straggler_outside: bool = False  # the watchdog's straggler was not inside a collective
    suspended_s: float = 0.0  # the job's time suspended so far (the watchdog's clock leaves it out)
    suspended_now: bool = False
    suspend_checked: float | None = None  # the controller was last asked about a suspension
    stopped_seen: bool = False  # the agent's loop saw a gap: it was stopped (a suspension), not yet asked
    step_waiting_since: float | None = None  # srun said the step's creation waits (busy nodes), not yet created

    @property
    def stop(self) -> Stop | None:
        """Why and since when the job is being stopped from outside (``agent_stop``), with the
        signals that came folded in first. Only the agent's loop folds and replaces the value; a
        signal handler only appends its fact (``signalled``): a handler runs between any two
        bytecodes of the loop, so one that replaced the value itself could be overwritten by the
        loop's replace under way (a notice lost, and with it the requeue)."""
        while self.facts_folded < len(self.stop_facts):
            kind, at = self.stop_facts[self.facts_folded]
            self.facts_folded += 1
            self._stop = noticed(self._stop, at) if kind == NOTICE_FACT else \
                terminated(self._stop, at, preemption_denied=self.preemption_asked)
        return self._stop

    def signalled(self, kind: str, at: float) -> None:
        """The signal handler's one write: ``NOTICE_FACT`` or ``SIGTERM_FACT`` came at ``at``."""
        self.stop_facts.append((kind, at))

    def update_stop(self, move: Callable[[Stop | None], Stop | None]) -> None:
        """``stop`` replaced by ``move(stop)``: from the agent's loop only."""
        self._stop = move(self.stop)

    def enter(self, phase: Phase) -> None:
        """Move to ``phase``; any move ``MOVES`` does not name is a bug, refused."""
        if phase not in MOVES[self.phase]:
            raise RuntimeError(f"the job's agent cannot go from {self.phase.value} to {phase.value}")
        self.phase = phase


def say(text: str) -> None:
    """The agent's own lines in the batch log."""
    print(f"[launcher] {text}", file=sys.stderr, flush=True)


@dataclass
class AgentContext:
    """What the agent's parts share: the payload, the job, the attempts' history, the state."""

    payload: Payload
    slurm: SlurmJob
    history: History
    state: AgentState
    marker: str  # the rank API's checkpoint marker (ORCH_REQUEUE_MARKER)
    cancel_request: Path  # `orchestrator cancel`'s request in the run folder
    notice: signal.Signals  # the time limit's notice (slurm.signal)
    attempt: Attempt | None = None
    say: Callable[[str], None] = say
    #: The nodes the ranks' step runs on this attempt, in rank order (empty: the whole allocation).
    #: A job with spares (recovery.spares), or one that lost a node inside the job, uses some of its nodes.
    step: tuple[str, ...] = ()

    @property
    def rank_hosts(self) -> tuple[str, ...]:
        """The ranks' nodes: node i holds ranks i*ranks_per_node..."""
        return self.step or self.slurm.hosts

    def host_of(self, rank: int) -> str:
        """The node of rank ``rank`` (block placement over ``rank_hosts``; the last node past its end)."""
        hosts = self.rank_hosts
        return hosts[min(len(hosts) - 1, rank // max(1, self.payload.ranks_per_node))]

    @property
    def job_id(self) -> str:
        return self.slurm.job_id

    @property
    def run_dir(self) -> str:
        return self.payload.run_dir

    @property
    def policy(self) -> str:
        return self.payload.requeue

    @property
    def world(self) -> int:
        return self.payload.world_size
