"""Progress reports (the rank API's heartbeat): one small JSON file per rank, one format.

Standard library only. A rank writes ``<run>/progress/rank-N.json`` through ``ProgressWriter``
(at most once per ``min_interval_s``, atomically, so a shared filesystem sees one small rename a
second per rank at most); the orchestrator reads them for the live progress line, the stall
watchdog (which rank stopped advancing) and ``status``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


def progress_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / "progress" / f"rank-{rank}.json"


@dataclass(frozen=True)
class Progress:
    rank: int
    time: float  # wall clock of the report (time.time())
    step: int
    total: Optional[int]
    samples_per_s: Optional[float]
    attempt: int

    def as_json(self) -> dict:
        return {"rank": self.rank, "time": self.time, "step": self.step, "total": self.total,
                "samples_per_s": self.samples_per_s, "attempt": self.attempt}


class ProgressWriter:
    """Writes one rank's reports; calls between two writes only update what the next one says."""

    def __init__(self, run_dir: str | Path, rank: int, attempt: int = 0, min_interval_s: float = 1.0) -> None:
        self.path = progress_path(run_dir, rank)
        self.rank, self.attempt, self.min_interval_s = rank, attempt, min_interval_s
        self._last_write = 0.0
        self._last_step: Optional[int] = None
        self._last_time = 0.0

    def report(self, step: int, total: Optional[int] = None, samples: Optional[int] = None,
               force: bool = False) -> bool:
        """Record that this rank reached ``step`` (``samples``: how many samples one step is, for the
        rate). Returns whether a file was written."""
        now = time.time()
        if not force and now - self._last_write < self.min_interval_s:
            return False
        rate = None
        if samples and self._last_step is not None and step > self._last_step and now > self._last_time:
            rate = samples * (step - self._last_step) / (now - self._last_time)
        self._last_step, self._last_time, self._last_write = step, now, now
        report = Progress(rank=self.rank, time=now, step=int(step), total=total, samples_per_s=rate,
                          attempt=self.attempt)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(report.as_json()), encoding="utf-8")
        os.replace(tmp, self.path)
        return True


def read_progress(run_dir: str | Path, world_size: int) -> list[Optional[Progress]]:
    """Every rank's latest report (None where a rank has sent none, or its file is unreadable)."""
    out: list[Optional[Progress]] = []
    for rank in range(world_size):
        try:
            d = json.loads(progress_path(run_dir, rank).read_text(encoding="utf-8"))
            out.append(Progress(rank=int(d["rank"]), time=float(d["time"]), step=int(d["step"]),
                                total=d.get("total"), samples_per_s=d.get("samples_per_s"),
                                attempt=int(d.get("attempt", 0))))
        except (OSError, ValueError, KeyError, TypeError):
            out.append(None)
    return out
