"""``recovery.on: [straggler]`` (issue 51, item 3), for both backends: the straggler over a window
(``orchestrator.core.stragglers.Persistent``: a rank's time outside collectives, from the rank
API's progress files, averaged over ``watchdog.straggler_window_s``, at least
``watchdog.straggler_factor`` times the others' median) is a failure of kind ``straggler``. The
job's agent then ends the attempt with the straggler's node blamed (on SLURM a spare takes its
place inside the job); the local supervisor restarts every rank. Read once a second, by the
caller's look. Standard library only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from orchestrator.core.states import FailureKind
from orchestrator.core.stragglers import Persistent, Straggler, this_attempts_busy

if TYPE_CHECKING:
    from orchestrator.core.payload import Payload


class StragglerWatch:
    """The persistent straggler of one attempt, when the spec asks to act on it."""

    def __init__(self, payload: Payload, world_size: int) -> None:
        self.world_size = world_size
        self.factor = payload.watchdog.straggler_factor
        self.persistent = Persistent(payload.watchdog.straggler_window_s, self.factor)
        self.enabled = (FailureKind.STRAGGLER.value in payload.recovery.on and payload.recovery.max_restarts > 0
                        and world_size >= 2)

    def look(self, run_dir: str | Path, since: float, now: float) -> Optional[Straggler]:
        """The straggler over the window (reports from ``since``, the attempt's start, only), else None."""
        if not self.enabled:
            return None
        from orchestrator.core.progress import read_progress

        return self.persistent.observe(now, this_attempts_busy(read_progress(run_dir, self.world_size), since))

    def message(self, found: Straggler, node: Optional[str] = None) -> str:
        what = "its node is blamed" if node else "every rank restarts"
        return f"{self.persistent.message(found, node)}: {what}"
