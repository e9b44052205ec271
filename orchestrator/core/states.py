"""The lifecycle states of a run: one type, one place. Standard library only (ranks import it
through records.py).

A ``State`` is a ``str``: it compares equal to its name (``State.COMPLETED == "COMPLETED"``),
hashes like it, prints and formats as it, and is written to record.json as it, so records on
disk and any comparison with a plain string keep working. SLURM's own words (sacct, squeue) are
mapped onto these in one table, ``executors.slurm.STATE_MAP``.

The other words that records and decisions use are here too, as ``StrEnum`` (so recovery.json,
end.json and comparisons with plain strings keep working): how an attempt ended (``Outcome``), a
failure's kind (``FailureKind``), what an attempt led to (``Action``), why a job ended
(``EndReason``, end.json's ``reason``), and where the SLURM job agent's attempt stands (``Phase``).
"""

from __future__ import annotations

import enum

try:
    from enum import StrEnum as _StrEnum
except ImportError:  # Python 3.10 (slurm.python may be older than ours): StrEnum as 3.11 defines it

    class _StrEnum(str, enum.Enum):  # type: ignore[no-redef]
        def __str__(self) -> str:
            return str.__str__(self)

        def __format__(self, spec: str) -> str:
            return str.__format__(str(self), spec)


class State(_StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    PREEMPTED = "PREEMPTED"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    REQUEUED = "REQUEUED"
    UNKNOWN = "UNKNOWN"

    @property
    def terminal(self) -> bool:
        """The run has ended (in any way): nothing will change its state but a new attempt."""
        return self in TERMINAL

    @classmethod
    def parse(cls, value: object) -> State:
        """A state from its name (or a State). Anything else raises ValueError naming the value
        and the known states: a record that holds one is damaged, never silently UNKNOWN."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls(value)
            except ValueError:
                pass
        raise ValueError(f"unknown state {str(value)[:40]!r} (known: {', '.join(s.value for s in cls)})")


#: The states a run ends in.
TERMINAL: frozenset[State] = frozenset({State.COMPLETED, State.FAILED, State.CANCELLED, State.TIMEOUT,
                                        State.PREEMPTED, State.NODE_FAIL, State.OUT_OF_MEMORY})


#: When a run has several parts (a sweep's points, a SLURM array's tasks), the most telling state
#: wins (``combine``). Every State is here.
PRIORITY: list[State] = [State.NODE_FAIL, State.OUT_OF_MEMORY, State.FAILED, State.TIMEOUT, State.PREEMPTED,
                         State.CANCELLED, State.REQUEUED, State.RUNNING, State.PENDING, State.UNKNOWN,
                         State.COMPLETED]


def combine(states: list[State]) -> State:
    """The run's state from its parts': the most telling (``PRIORITY``); UNKNOWN for none."""
    return State(min(states, key=PRIORITY.index)) if states else State.UNKNOWN


class FailureKind(_StrEnum):
    """What ended an attempt that failed (``recovery.Failure.kind``), which recovery decides on."""

    CRASH = "crash"  # a rank raised, or a signal killed it
    NODE_FAILURE = "node_failure"  # a node was lost (srun said so, or SLURM's node state)
    HANG = "hang"  # the watchdog's verdict: a rank never joined, or no rank progressed
    UNHEALTHY = "unhealthy"  # the health gate failed before any rank started
    STRAGGLER = "straggler"  # a rank named the straggler for watchdog.straggler_window_s (recovery.on lists it)


class Outcome(_StrEnum):
    """How one attempt ended (``recovery.Attempt.outcome`` in recovery.json): a failure's kind
    (``FailureKind``, same words) or one of these."""

    COMPLETED = "completed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    PREEMPTED = "preempted"
    REQUEUED = "requeued"
    NOT_REQUEUED = "not_requeued"  # stopped early, and no requeue followed
    FAILED = "failed"
    LOST = "lost"  # its agent never recorded the end (killed, or its node lost)
    CRASH = FailureKind.CRASH.value
    NODE_FAILURE = FailureKind.NODE_FAILURE.value
    HANG = FailureKind.HANG.value
    UNHEALTHY = FailureKind.UNHEALTHY.value
    STRAGGLER = FailureKind.STRAGGLER.value

    @classmethod
    def of_failure(cls, kind: FailureKind) -> Outcome:
        return cls(kind.value)


class Action(_StrEnum):
    """What an attempt led to (``recovery.Attempt.action``): nothing yet (''), a requeue (time
    limit, preemption), a restart (recovery after a failure), or the job's stop."""

    NONE = ""
    REQUEUE = "requeue"
    RESTART = "restart"
    STOP = "stop"

    @property
    def done(self) -> str:
        """The action as status says it happened: restarted, requeued, stopped ('' for none)."""
        return {"restart": "restarted", "requeue": "requeued", "stop": "stopped"}.get(self.value, "")


class EndReason(_StrEnum):
    """Why a job (or its attempt) ended, as end.json's ``reason`` (``forensics.write_end``),
    which status shows: a failure's kind (``FailureKind``, same words) or one of these."""

    INIT_DEADLINE = "init_deadline"  # a rank never joined its process group in time (watchdog)
    STALL = "stall"  # no rank progressed for watchdog.stall_s
    TIME_LIMIT = "time_limit"  # the time limit's notice with no requeue to follow (stacks saved)
    DID_NOTHING = "did_nothing"  # the ranks ended without ever joining (a warning)
    RANK_KILLED = "rank_killed"  # a signal ended a rank, which left no traceback
    NO_PORT = "no_port"  # no free port for the ranks' rendezvous
    CANCELLED = "cancelled"
    NOT_REQUEUED = "not_requeued"
    PREEMPTED = "preempted"  # preempted where the site's PreemptMode ends the job: SLURM's end, no requeue
    NO_PROGRESS = "no_progress"  # recovery stopped: failures without progress
    NOT_ENOUGH_NODES = "not_enough_nodes"  # recovery stopped: too few nodes left
    CRASH = FailureKind.CRASH.value
    NODE_FAILURE = FailureKind.NODE_FAILURE.value
    HANG = FailureKind.HANG.value
    UNHEALTHY = FailureKind.UNHEALTHY.value
    STRAGGLER = FailureKind.STRAGGLER.value


class Phase(enum.Enum):
    """Where one attempt of the agent stands. Every attempt starts RUNNING and makes at most one
    decision (``agent_state.AgentState.enter`` refuses any other move,
    by ``agent_state.MOVES``):

    RUNNING ─┬─> REQUEUEING ─┬─> REQUEUED       scontrol accepted; the next attempt is SLURM's
             │        ^      └─> NOT_REQUEUED   no requeue left, or scontrol refused
             ├─> ENDING ┘                        the watchdog ended the ranks (init deadline, stall);
             │     │                             recovery may restart the job from there (a hang)
             └─────┴─> RESTARTING                recovery restarts the ranks' step inside the job
                                                 (recovery.in_allocation): the same agent runs the
                                                 next attempt, no requeue

    A cancel (SIGTERM from scancel, or ``orchestrator cancel``'s request) is a fact the agent
    received, not a phase: from RUNNING it only rules out a requeue and a watchdog verdict. A
    SIGTERM that is a preemption (``preempted``) is a notice instead, like the time limit's."""

    RUNNING = "running"
    REQUEUEING = "requeueing"
    REQUEUED = "requeued"
    NOT_REQUEUED = "not_requeued"
    ENDING = "ending"
    RESTARTING = "restarting"
