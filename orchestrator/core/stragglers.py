"""Which rank is a straggler (issue 51, item 2): pure, standard library only.

In a synchronous DDP job every rank's step rate falls to the slowest rank's pace, so rates cannot
tell the culprit. The time a rank spends *outside* its collectives can: the slow rank does its own
work (data, forward) slowly and then waits least, while the others wait for it inside the
all-reduce. The rank API measures that time per step (``jobs.heartbeat(..., busy_s=)``; ``jobs.train``
does, from the end of one step to the start of ``backward``) and smooths it over recent steps
(``core.progress.BUSY_WEIGHT``). A rank is the straggler when its figure is at least ``factor``
times the median of the other ranks' (``watchdog.straggler_factor``, 1.5 by default).

Why this and not DDP's communication hook or the process group's timings: the hook sees when a
bucket is ready, not how long the rank computed before it, and the group's timings need NCCL's
flight recorder or a wrapper around every collective; two clock reads a step need neither, and
they work for gloo and NCCL alike. Scripts without the rank API's ``busy_s`` get no straggler
named (their stacks, ``orchestrator stacks``, show where a rank is).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Mapping, Optional

#: Below this many seconds a step's own work is too short to compare (clock noise).
MIN_BUSY_S = 0.002


@dataclass(frozen=True)
class Straggler:
    rank: int
    ratio: float  # its busy time over the median of the others'
    busy_s: float
    median_s: float

    def line(self, node: str | None = None) -> str:
        where = f" on {node}" if node else ""
        return (f"straggler: rank {self.rank}{where} spends {self.busy_s * 1000:.0f} ms a step outside collectives, "
                f"{self.ratio:.1f}x the other ranks' median ({self.median_s * 1000:.0f} ms)")


def straggler(busy: Mapping[int, Optional[float]], factor: float) -> Optional[Straggler]:
    """The rank whose time outside collectives is at least ``factor`` times the median of the
    others' (the slowest such rank), or None: fewer than two ranks measured, or none that slow."""
    known = {rank: b for rank, b in busy.items() if b is not None and b >= 0}
    if len(known) < 2:
        return None
    worst = max(sorted(known), key=lambda r: known[r])
    others = [b for r, b in known.items() if r != worst]
    median = statistics.median(others)
    if known[worst] < MIN_BUSY_S or known[worst] < factor * max(median, MIN_BUSY_S / factor):
        return None
    return Straggler(rank=worst, ratio=known[worst] / median if median > 0 else float("inf"), busy_s=known[worst],
                     median_s=median)
