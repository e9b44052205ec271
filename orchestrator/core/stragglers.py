"""Which rank is a straggler (issue 51, item 2): pure, standard library only.

In a synchronous DDP job every rank's step rate falls to the slowest rank's pace, so rates cannot
tell the culprit. The time a rank spends *outside* its collectives can: the slow rank does its own
work (data, forward) slowly and then waits least, while the others wait for it inside the
all-reduce. The rank API measures that time per step (``jobs.heartbeat(..., busy_s=)``; ``jobs.train``
does, from the end of one step to the start of ``backward``) and reports its mean over the steps
between two reports (``core.progress``). A rank is the straggler when its figure is at least
``factor`` times the median of the other ranks' (``watchdog.straggler_factor``, 1.5 by default).

Why this and not DDP's communication hook or the process group's timings: the hook sees when a
bucket is ready, not how long the rank computed before it, and the group's timings need NCCL's
flight recorder or a wrapper around every collective; two clock reads a step need neither, and
they work for gloo and NCCL alike. Scripts without the rank API's ``busy_s`` get no straggler
named (their stacks, ``orchestrator stacks``, show where a rank is).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

#: Below this many seconds a step's own work is too short to compare: two alike ranks of a small
#: model on this 2-core machine differ by 1-2 ms a step (clock and scheduler noise), which made 1.7x.
MIN_BUSY_S = 0.005


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


#: Each rank's highest 1/TRIM of the looks in the window are left out of its mean.
TRIM = 4


class Persistent:
    """A straggler over ``window_s`` (``watchdog.straggler_window_s``): what ``recovery.on:
    [straggler]`` acts on. Once the looks cover the whole window, each rank's figures are averaged
    over it, its highest quarter left out (``TRIM``), and the straggler is judged on those means
    (``straggler``), if it is still slower than the others' median at the last look. A slow step, a
    GC, a checkpoint written by one rank (seconds in one look: a plain mean over the window made
    that rank 5x the others, and the first cluster run counted a 4x slow-down after 6 s of a 10 s
    window) is never one; a rank slowed on some steps only (above the factor at one look, below at
    the next: a per-look verdict never held for 30 s at 2x, measured) is judged on its mean. A rank
    measured in fewer than half the looks is not judged."""

    def __init__(self, window_s: float, factor: float) -> None:
        self.window_s, self.factor = window_s, factor
        self.looks: deque[tuple[float, dict[int, Optional[float]]]] = deque()  # (when, each rank's figure)

    def observe(self, now: float, busy: Mapping[int, Optional[float]]) -> Optional[Straggler]:
        """This look's figures (``this_attempts_busy``) at ``now``; the straggler over the window, else None."""
        self.looks.append((now, dict(busy)))
        while len(self.looks) > 1 and self.looks[1][0] <= now - self.window_s:
            self.looks.popleft()  # the oldest kept look is the last one at or before the window's start
        if self.looks[0][0] > now - self.window_s:
            return None
        means: dict[int, Optional[float]] = {}
        for rank in busy:
            seen = sorted(v for _, b in self.looks if (v := b.get(rank)) is not None)
            kept = seen[:len(seen) - len(seen) // TRIM]  # a checkpoint write, a GC: a few looks, left out
            means[rank] = sum(kept) / len(kept) if kept and len(seen) >= len(self.looks) / 2 else None
        found = straggler(means, self.factor)
        last = busy.get(found.rank) if found is not None else None
        others = [b for r, b in busy.items() if found is not None and r != found.rank and b is not None]
        if found is None or last is None or not others or last <= statistics.median(others):
            return None
        return found

    def message(self, found: Straggler, node: Optional[str] = None) -> str:
        return (f"{found.line(node)} over {self.window_s:g}s (watchdog.straggler_window_s); "
                "recovery.on lists straggler")


def this_attempts_busy(reports: Sequence[Optional[object]], since: float) -> dict[int, Optional[float]]:
    """Each rank's ``busy_s`` (``core.progress.Progress``) from reports written since ``since`` (the
    attempt's start): an earlier attempt's figures say nothing about the ranks now."""
    busy: dict[int, Optional[float]] = {}
    for rank, report in enumerate(reports):
        at, value = getattr(report, "time", None), getattr(report, "busy_s", None)
        busy[rank] = value if isinstance(at, (int, float)) and at >= since else None
    return busy
