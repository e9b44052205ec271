"""Metrics as JSON lines, one file per rank under <run>/metrics/ (no shared-file appends), in the
records ``orchestrator report`` plots: ``train`` (loss by step) and ``eval`` (accuracy and loss
by epoch) from rank 0, ``throughput`` (samples/s by epoch) from every rank."""

from __future__ import annotations

import json
import numbers
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from orchestrator.rank_env import OrchVar
from orchestrator.run_folder import RunFolder


class MetricsWriter:
    """This rank's metrics file; run folder and rank default to ORCH_RUN_DIR (or the working
    directory) and RANK, as the orchestrator and torchrun set them."""

    def __init__(self, run_dir: str | Path | None = None, rank: int | None = None) -> None:
        run_dir = run_dir if run_dir is not None else os.environ.get(OrchVar.RUN_DIR, os.getcwd())
        self.rank = rank if rank is not None else int(os.environ.get("RANK", "0"))
        self.path = RunFolder.of(run_dir).metrics_file(self.rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", buffering=1, encoding="utf-8")

    def log(self, kind: str, **values: Any) -> None:
        """Any record; ``report`` reads the kinds written by the methods below."""
        record = {"time": time.time(), "rank": self.rank, "kind": kind, **values}
        self._fh.write(json.dumps(record, default=_plain_number) + "\n")

    def train(self, step: int, loss: float, **values: Any) -> None:
        """The training loss at ``step`` (rank 0 only: ``report`` plots one curve; elsewhere a no-op)."""
        if self.rank == 0:
            self.log("train", step=step, loss=float(loss), **values)

    def evaluation(self, epoch: int, step: int, accuracy: float, loss: float, **values: Any) -> None:
        """Test accuracy and loss after ``epoch`` (counted from 1; rank 0 only)."""
        if self.rank == 0:
            self.log("eval", epoch=epoch, step=step, accuracy=float(accuracy), loss=float(loss), **values)

    def throughput(self, epoch: int, samples: int, seconds: float) -> None:
        """How many samples this rank trained on in ``seconds`` (every rank: ``report`` plots each)."""
        self.log("throughput", epoch=epoch, samples=samples, seconds=seconds,
                 samples_per_s=samples / seconds if seconds > 0 else 0.0)

    def close(self) -> None:
        if self._fh.closed:
            return
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def _plain_number(value: Any) -> Any:
    """numpy's (and any other) integer and real scalars, and one-element tensors, as JSON numbers."""
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if callable(getattr(value, "item", None)):
        item = value.item()
        if isinstance(item, (int, float)):
            return item
    raise TypeError(f"a metric value is a {type(value).__name__}; give numbers or text")
