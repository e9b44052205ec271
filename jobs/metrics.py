"""Metrics as JSON lines: one file per rank under <run>/metrics/ (no shared-file appends)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


class MetricsWriter:
    def __init__(self, run_dir: str | Path, rank: int) -> None:
        self.path = Path(run_dir) / "metrics" / f"rank-{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self._fh = open(self.path, "a", buffering=1, encoding="utf-8")

    def log(self, kind: str, **values: Any) -> None:
        record = {"time": time.time(), "rank": self.rank, "kind": kind, **values}
        self._fh.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()

