"""``<run>/end.json``: the job agent's verdict on how its job ended, as one typed record with one
writer (``orchestrator.node.forensics.write_end``) and one reader (``forensics.read_end``), read
as hostile input (a rank, or anyone who can write the run folder, could have put anything there):
a field of the wrong type is dropped, never trusted, and a file that is no verdict reads as none.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional

#: The most of one text field kept from the file (a message is a few lines; a damaged file may be anything).
MAX_TEXT = 64 << 10


@dataclass(frozen=True)
class EndVerdict:
    """Why the job (or its attempt) ended. ``reason``: an ``EndReason`` value (or a failure's kind);
    ``error``: the message status shows; ``failed_rank``: the rank blamed; ``waits``: where each
    rank was (rank -> its innermost frame) when the stacks were taken; ``warning``: said of a job
    that completed (it did nothing); ``unhealthy``: node -> why the health gate refused it."""

    reason: str
    time: float = 0.0
    error: str = ""
    failed_rank: Optional[int] = None
    waits: Mapping[str, str] = field(default_factory=dict)
    warning: str = ""
    unhealthy: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: Any) -> Optional[EndVerdict]:
        """The verdict in ``data`` (end.json's JSON), None when it is no verdict of ours (no text
        reason); each other field of the wrong type reads as absent."""
        if not isinstance(data, dict) or not isinstance(data.get("reason"), str):
            return None
        when, rank = data.get("time"), data.get("failed_rank")
        return cls(reason=data["reason"][:MAX_TEXT],
                   time=float(when) if isinstance(when, (int, float)) and not isinstance(when, bool)
                   and math.isfinite(when) else 0.0,
                   error=_text(data.get("error")), warning=_text(data.get("warning")),
                   failed_rank=rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else None,
                   waits=_texts(data.get("waits")), unhealthy=_texts(data.get("unhealthy")))


def _text(value: Any) -> str:
    return value[:MAX_TEXT] if isinstance(value, str) else ""


def _texts(value: Any) -> dict[str, str]:
    """A mapping of text to text (keys as JSON has them: text), anything else dropped."""
    if not isinstance(value, dict):
        return {}
    return {str(k)[:200]: v[:MAX_TEXT] for k, v in list(value.items())[:4096] if isinstance(v, str)}
