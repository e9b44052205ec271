"""The lifecycle states of a run: one type, one place. Standard library only (ranks import it
through records.py).

A ``State`` is a ``str``: it compares equal to its name (``State.COMPLETED == "COMPLETED"``),
hashes like it, prints and formats as it, and is written to record.json as it, so records on
disk and any comparison with a plain string keep working. SLURM's own words (sacct, squeue) are
mapped onto these in one table, ``executors.slurm.STATE_MAP``.
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
