"""Progress reports (the rank API's heartbeat): one small JSON file per rank, one format.

Standard library only. A rank writes ``<run>/progress/rank-N.json`` through ``ProgressWriter``
(at most once per ``min_interval_s``, atomically, so a shared filesystem sees at most one small
rename a second per rank); the orchestrator reads them for the live progress line
(``summarize``), the stall watchdog (which rank stopped advancing) and ``status``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional


def progress_path(run_dir: str | Path, rank: int) -> Path:
    from orchestrator.run_folder import RunFolder

    return RunFolder.of(run_dir).progress(rank)


@dataclass(frozen=True)
class Progress:
    rank: int
    time: float  # wall clock of the report (time.time())
    step: int
    total: Optional[int]
    steps_per_s: Optional[float]  # since the previous report
    samples_per_s: Optional[float]  # steps_per_s x the samples of one step, when the rank said
    attempt: int


class ProgressWriter:
    """Writes one rank's reports; calls between two writes cost a clock read."""

    def __init__(self, run_dir: str | Path, rank: int, attempt: int = 0, min_interval_s: float = 1.0) -> None:
        self.path = progress_path(run_dir, rank)
        self.rank, self.attempt, self.min_interval_s = rank, attempt, min_interval_s
        self._last_write = 0.0
        self._last_step: Optional[int] = None

    def report(self, step: int, total: Optional[int] = None, samples: Optional[int] = None,
               force: bool = False) -> bool:
        """Record that this rank reached ``step`` of ``total`` (``samples``: how many samples one
        step is, for the rate). Returns whether a file was written."""
        now = time.time()
        if not force and now - self._last_write < self.min_interval_s:
            return False
        steps_per_s = None
        if self._last_step is not None and step > self._last_step and now > self._last_write:
            steps_per_s = (step - self._last_step) / (now - self._last_write)
        self._last_step, self._last_write = step, now
        report = Progress(rank=self.rank, time=now, step=int(step), total=total, steps_per_s=steps_per_s,
                          samples_per_s=steps_per_s * samples if steps_per_s and samples else None,
                          attempt=self.attempt)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(report)), encoding="utf-8")
        os.replace(tmp, self.path)
        return True


def read_progress(run_dir: str | Path, world_size: int) -> list[Optional[Progress]]:
    """Every rank's latest report (None where a rank has sent none, or its file is unreadable)."""
    out: list[Optional[Progress]] = []
    for rank in range(world_size):
        try:
            d = json.loads(progress_path(run_dir, rank).read_text(encoding="utf-8"))
            out.append(Progress(rank=int(d["rank"]), time=float(d["time"]), step=int(d["step"]),
                                total=d.get("total"), steps_per_s=d.get("steps_per_s"),
                                samples_per_s=d.get("samples_per_s"), attempt=int(d.get("attempt", 0))))
        except (OSError, ValueError, KeyError, TypeError):
            out.append(None)
    return out


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
