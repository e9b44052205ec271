"""``<run>/errors/rank-N.json``: what a failing rank recorded about its exception, as one typed
record with one writer (``write``: the rank's launcher, or ``slurm_rank`` for a rank that failed
before its entrypoint) and one reader (``read``: status, the local supervisor, the SLURM agent).
Read as hostile input: a rank's file could hold anything; a field of the wrong type makes the
file no record (it is skipped), never a crash. Standard library only (ranks write it).
"""

from __future__ import annotations

import math
from pathlib import Path

from orchestrator.core.lean_record import as_dict, record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a rank imports this module)
if TYPE_CHECKING:
    from typing import Any, Iterable, Optional


#: The most of one text field kept from the file (a traceback is kilobytes; a damaged file may be anything).
MAX_TEXT = 1 << 20


@record
class RankError:
    """One rank's exception: its ``type`` and ``message``, the full ``traceback`` and the user's
    part of it (``user_traceback``: frames of ours cut), when (``time``) and in which attempt."""

    rank: int
    time: float
    attempt: int
    type: str
    message: str
    traceback: str
    user_traceback: str = ""

    def said(self) -> str:
        """As the run's record says it: the rank, the exception, and the traceback (the user's part
        when the rank trimmed one)."""
        return f"rank {self.rank} raised {self.type}: {self.message}\n{self.user_traceback or self.traceback}"

    def headline(self) -> str:
        """The first line of ``said``: what a recovery records as the failure's why."""
        return f"rank {self.rank} raised {self.type}: {self.message}".splitlines()[0]

    @classmethod
    def from_json(cls, data: Any) -> Optional[RankError]:
        if not isinstance(data, dict):
            return None
        rank, when, attempt = data.get("rank"), data.get("time"), data.get("attempt", 0)
        kind, message, full, user = (data.get(k) for k in ("type", "message", "traceback", "user_traceback"))
        if not (isinstance(rank, int) and _whole(rank) and isinstance(attempt, int) and _whole(attempt)
                and isinstance(when, (int, float)) and not isinstance(when, bool) and math.isfinite(when)
                and isinstance(kind, str) and isinstance(message, str) and isinstance(full, str)):
            return None
        return cls(rank=rank, time=float(when), attempt=attempt, type=kind[:200], message=message[:MAX_TEXT],
                   traceback=full[:MAX_TEXT], user_traceback=user[:MAX_TEXT] if isinstance(user, str) else "")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def write(path: str | Path, error: RankError) -> None:
    """The record, replaced whole (a reader sees the old file or the new one)."""
    from orchestrator.core.atomic_files import write_json_atomic

    write_json_atomic(path, as_dict(error))


def read(path: str | Path) -> Optional[RankError]:
    """The record at ``path``; None when missing, unreadable (a FIFO, a link, too big) or no record."""
    from orchestrator.core import safe_read

    try:
        return RankError.from_json(safe_read.read_json(Path(path)))
    except (safe_read.Unreadable, OSError):
        return None


def earliest(paths: Iterable[Path]) -> Optional[RankError]:
    """The first exception recorded among ``paths`` (by its time)."""
    found = [e for e in (read(p) for p in paths) if e is not None]
    return min(found, key=lambda e: e.time) if found else None
