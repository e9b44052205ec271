"""Metrics as JSON lines, one file per rank under <run>/metrics/ (no shared-file appends), in the
records ``orchestrator report`` plots: ``train`` (loss by step) and ``eval`` (accuracy and loss
by epoch) from rank 0, ``throughput`` (samples/s by epoch) from every rank.

Across attempts (a requeue, a resume) the file is appended to, never rewritten: a resumed attempt
retrains the steps between its checkpoint and the end of the previous attempt, so the file holds
those steps twice, the older records describing training that was rolled back. The writer records
what only the rank knows: every record's attempt (``ORCH_ATTEMPT``), and where an attempt starts,
a ``start`` record (``MetricsWriter(start_step=...)``: the step it resumed from, 0 on a fresh start).
The readers (``orchestrator.report.read_metrics``) apply the rule: a ``start`` record voids the
earlier records of later steps (and, for records without a step, such as ``throughput``, of the
epoch it names and later ones); then one record per step (``train``) or epoch (``eval``, and
``throughput`` per rank), the one written last. Why at read time, from facts written at write
time: rewriting the file when a rank resumes could lose records to a crash mid-rewrite, on a
shared filesystem with nodes writing; appending stays atomic per line, keeps what the rolled-back
attempt saw for forensics, and a file written by an older writer still reads (latest record wins).
"""

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
    directory) and RANK, as the orchestrator and torchrun set them.

    After a resume, give ``start_step`` (the checkpoint's step, ``resumed.step``; 0 on a fresh
    start) and ``start_epoch`` (the epoch it continues, as your ``throughput`` records count them),
    on every rank: ``report`` then shows each step once, as this attempt trained it, and drops
    what the previous attempt logged past the checkpoint. Without them, a step logged again
    still replaces its earlier record; steps the new attempt never logs again stay.
    """

    def __init__(self, run_dir: str | Path | None = None, rank: int | None = None,
                 start_step: int | None = None, start_epoch: int | None = None) -> None:
        run_dir = run_dir if run_dir is not None else os.environ.get(OrchVar.RUN_DIR, os.getcwd())
        self.rank = rank if rank is not None else int(os.environ.get("RANK", "0"))
        self.attempt = _attempt()
        self.path = RunFolder.of(run_dir).metrics_file(self.rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", buffering=1, encoding="utf-8")
        if start_step is not None:
            self.start(start_step, start_epoch)

    def log(self, kind: str, **values: Any) -> None:
        """Any record; ``report`` reads the kinds written by the methods below."""
        record = {"time": time.time(), "rank": self.rank, "kind": kind, **values}
        if self.attempt is not None:
            record.setdefault("attempt", self.attempt)
        self._fh.write(json.dumps(record, default=_plain_number) + "\n")

    def start(self, step: int, epoch: int | None = None) -> None:
        """This attempt trains on from ``step`` (and ``epoch``): what earlier attempts logged for
        later steps (and, without a step, for this epoch and later ones) was rolled back."""
        self.log("start", step=step, **({} if epoch is None else {"epoch": epoch}))

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


def _attempt() -> int | None:
    """ORCH_ATTEMPT (0 on the first attempt), or None where it is unset or not a number (torchrun)."""
    try:
        return int(os.environ[OrchVar.ATTEMPT])
    except (KeyError, ValueError):
        return None


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
