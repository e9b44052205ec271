"""The live progress line of a run (the console's "step 120/900  3,100 samples/s  ETA 4m10s
slowest rank 3"), from the ranks' latest reports (``orchestrator.core.progress``). Standard library only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from orchestrator.core.progress import Progress


@dataclass(frozen=True)
class Summary:
    """The live progress line's numbers, over every rank's latest report."""

    step: int  # the slowest reporting rank's step: the job is as far as its slowest rank
    total: Optional[int]
    samples_per_s: Optional[float]  # summed over the ranks that report a rate
    eta_s: Optional[float]  # at the slowest rank's pace
    slowest_rank: int
    reporting: int
    world_size: int

    def line(self) -> str:
        parts = [f"step {self.step}/{self.total}" if self.total else f"step {self.step}"]
        if self.samples_per_s is not None:
            parts.append(f"{self.samples_per_s:,.0f} samples/s")
        if self.eta_s is not None:
            parts.append(f"ETA {_duration(self.eta_s)}")
        if self.world_size > 1:
            parts.append(f"slowest rank {self.slowest_rank}")
        if self.reporting < self.world_size:
            parts.append(f"{self.reporting}/{self.world_size} ranks reporting")
        return "  ".join(parts)


def summarize(reports: list[Optional[Progress]], since: Optional[float] = None) -> Optional[Summary]:
    """None while no rank has reported (since the wall-clock time ``since``, if given: an earlier
    attempt's reports in the same run folder do not count)."""
    live = [r for r in reports if r is not None and (since is None or r.time >= since)]
    if not live:
        return None
    slowest = min(live, key=lambda r: (r.step, r.time))
    rates = [r.samples_per_s for r in live if r.samples_per_s]
    total = max((r.total for r in live if r.total), default=None)
    eta = None
    if total and slowest.steps_per_s:
        eta = max(0.0, (total - slowest.step) / slowest.steps_per_s)
    return Summary(step=slowest.step, total=total, samples_per_s=sum(rates) if rates else None, eta_s=eta,
                   slowest_rank=slowest.rank, reporting=len(live), world_size=len(reports))


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s" if m else f"{sec}s"
