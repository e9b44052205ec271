"""Metrics as JSON lines, one file per rank under <run>/metrics/ (no shared-file appends), in the
records ``orchestrator report`` plots: ``train`` (loss by step) and ``eval`` (accuracy and loss
by epoch) from rank 0, ``throughput`` (samples/s by epoch) from every rank.

Across attempts (a requeue, a resume) the file is appended to, never rewritten: a resumed attempt
retrains the steps between its checkpoint and the end of the previous attempt, so the file holds
those steps twice, the older records describing training that was rolled back. The writer records
what only the rank knows: every record's attempt (``ORCH_ATTEMPT``), and where an attempt starts,
a ``start`` record (``MetricsWriter(start_step=...)``: the step it resumed from, 0 on a fresh start).
The readers (``orchestrator.front.report.read_metrics``) apply the rule: a ``start`` record voids the
earlier records of later steps (and, for records without a step, such as ``throughput``, of the
epoch it names and later ones); then one record per step (``train``) or epoch (``eval``, and
``throughput`` per rank), the one written last. Why at read time, from facts written at write
time: rewriting the file when a rank resumes could lose records to a crash mid-rewrite, on a
shared filesystem with nodes writing; appending stays atomic per line, keeps what the rolled-back
attempt saw for forensics, and a file written by an older writer still reads (latest record wins).

Rank 0's scalars (``train``, ``eval``, and its own ``throughput``) also go to the trackers the
orchestrator set up or the user asked for, each imported only when wanted:

- TensorBoard, when ``ORCH_TENSORBOARD_DIR`` is set (the orchestrator sets it to <run>/tensorboard)
  and tensorboard is installed. ``start(step)`` opens the writer with ``purge_step=step + 1``:
  TensorBoard's own SessionLog START, with which its reader drops what an earlier attempt logged
  after ``step``, so every step shows once (``report``'s rule, applied by TensorBoard's reader: a
  checkpoint at step N holds the model after N updates, whose record, logged at N, stays).
- W&B, when wandb is installed and ``WANDB_MODE`` (online or offline) or ``WANDB_API_KEY`` is set, and
  ``WANDB_MODE`` is not ``disabled``: the explicit switch, as ``wandb login`` alone leaves no trace in
  the environment. ``wandb.init`` takes the run id, resume mode and folder from the environment
  (``WANDB_RUN_ID``, ``WANDB_RESUME``, ``WANDB_DIR``: the orchestrator's defaults make every attempt
  continue one run). W&B never holds a rank up for long: ``init`` gives up after ``WANDB_INIT_TIMEOUT_S``
  (training goes on without it) and ``close`` waits at most ``WANDB_FINISH_TIMEOUT_S`` for the upload (an
  unfinished run's files stay in WANDB_DIR, for ``orchestrator sync``).
"""

from __future__ import annotations

import importlib.util
import json
import numbers
import os
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Mapping

from orchestrator.node.rank_env import OrchVar
from orchestrator.core.run_folder import RunFolder

#: The longest a rank waits for W&B to start, and for it to finish (upload) at close.
WANDB_INIT_TIMEOUT_S = 60.0
WANDB_FINISH_TIMEOUT_S = 120.0


class MetricsWriter:
    """This rank's metrics file; run folder and rank default to ORCH_RUN_DIR (or the working
    directory) and RANK, as the orchestrator and torchrun set them.

    After a resume, give ``start_step`` (the checkpoint's step, ``resumed.step``; 0 on a fresh
    start) and ``start_epoch`` (the epoch it continues, as your ``throughput`` records count them),
    on every rank: ``report`` then shows each step once, as this attempt trained it, and drops
    what the previous attempt logged past the checkpoint. Without them, a step logged again
    still replaces its earlier record; steps the new attempt never logs again stay. The same
    ``start`` makes TensorBoard show each step once (module docstring: the trackers).

    ``step`` counts the updates done, as ``Checkpointer.save(step, ...)`` does: log a step's loss at
    the step number it brings the model to (1 after the first update), so that a checkpoint at N and
    the record at N describe the same model.
    """

    def __init__(self, run_dir: str | Path | None = None, rank: int | None = None,
                 start_step: int | None = None, start_epoch: int | None = None) -> None:
        run_dir = run_dir if run_dir is not None else os.environ.get(OrchVar.RUN_DIR, os.getcwd())
        self.rank = rank if rank is not None else int(os.environ.get("RANK", "0"))
        self.attempt = _attempt()
        self.path = RunFolder.of(run_dir).metrics_file(self.rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", buffering=1, encoding="utf-8")
        self._step = 0  # the latest step logged: rank 0's throughput goes to the trackers at it
        self._trackers: list[_Tracker] = _trackers(os.environ) if self.rank == 0 else []
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
        self._step = step
        for tracker in self._trackers:
            tracker.start(step)

    def train(self, step: int, loss: float, **values: Any) -> None:
        """The training loss at ``step`` (rank 0 only: ``report`` plots one curve; elsewhere a no-op)."""
        if self.rank == 0:
            self.log("train", step=step, loss=float(loss), **values)
            self._track("train", step, {"loss": loss, **values})

    def evaluation(self, epoch: int, step: int, accuracy: float, loss: float, **values: Any) -> None:
        """Test accuracy and loss after ``epoch`` (counted from 1; rank 0 only)."""
        if self.rank == 0:
            self.log("eval", epoch=epoch, step=step, accuracy=float(accuracy), loss=float(loss), **values)
            self._track("eval", step, {"accuracy": accuracy, "loss": loss, **values})

    def throughput(self, epoch: int, samples: int, seconds: float) -> None:
        """How many samples this rank trained on in ``seconds`` (every rank: ``report`` plots each;
        the trackers get rank 0's, at the latest step logged)."""
        rate = samples / seconds if seconds > 0 else 0.0
        self.log("throughput", epoch=epoch, samples=samples, seconds=seconds, samples_per_s=rate)
        self._track("throughput", self._step, {"samples_per_s": rate})

    def _track(self, kind: str, step: int, values: Mapping[str, Any]) -> None:
        """The numbers among ``values`` to every tracker, as ``<kind>/<name>`` (text is left out)."""
        step = int(step)  # numpy's and torch's integers too: protobuf and W&B take plain ints
        self._step = max(self._step, step)
        if self._trackers:
            scalars = {f"{kind}/{k}": n for k, n in ((k, _number(v)) for k, v in values.items()) if n is not None}
            for tracker in self._trackers:
                tracker.scalars(step, scalars)

    def close(self, failed: bool = False) -> None:
        """Flush the file and the trackers (``failed``: W&B marks the run's attempt as failed)."""
        if self._fh.closed:
            return
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        trackers, self._trackers = self._trackers, []
        for tracker in trackers:
            tracker.close(failed)

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close(failed=kind is not None)


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


def _number(value: Any) -> float | None:
    """A metric value as a float for the trackers; None for text, booleans and anything else."""
    if isinstance(value, bool) or isinstance(value, str):
        return None
    try:
        plain = _plain_number(value)
    except (TypeError, ValueError):
        return None
    return float(plain) if isinstance(plain, (int, float)) else None


def _note(text: str) -> None:
    print(f"[metrics] {text}", file=sys.stderr, flush=True)


class _Tracker:
    """Where rank 0's scalars go besides the JSONL file."""

    def start(self, step: int) -> None:
        """This attempt trains on from ``step``."""

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        raise NotImplementedError

    def close(self, failed: bool) -> None:
        raise NotImplementedError


class _TensorBoard(_Tracker):
    """Event files in one folder for every attempt. The writer opens at ``start`` (with TensorBoard's
    purge_step) or at the first scalar, and flushes after each record, as the JSONL file does: a rank
    killed before ``close`` leaves what it logged readable."""

    def __init__(self, log_dir: str) -> None:
        from torch.utils.tensorboard import SummaryWriter  # ImportError without tensorboard

        self._open = SummaryWriter
        self.log_dir = log_dir
        self._writer: Any = None

    def start(self, step: int) -> None:
        """TensorBoard purges from the step given, inclusive: records after ``step`` were rolled back."""
        purge = step + 1
        if self._writer is None:
            self._writer = self._open(self.log_dir, purge_step=purge)
        else:  # a writer already open: the same two events SummaryWriter's purge_step writes
            from tensorboard.compat.proto.event_pb2 import Event, SessionLog

            self._writer.file_writer.add_event(Event(step=purge, file_version="brain.Event:2"))
            self._writer.file_writer.add_event(Event(step=purge, session_log=SessionLog(status=SessionLog.START)))
        self._writer.flush()

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        if self._writer is None:
            self._writer = self._open(self.log_dir)
        for tag, value in values.items():
            self._writer.add_scalar(tag, value, global_step=step)
        self._writer.flush()

    def close(self, failed: bool) -> None:
        if self._writer is not None:
            self._writer.close()


class _WandB(_Tracker):
    """One W&B run per orchestrator run: ``wandb.init`` reads WANDB_RUN_ID, WANDB_RESUME and WANDB_DIR
    from the environment. The project defaults to the job's name and the run's name to ORCH_RUN_ID
    (WANDB_PROJECT and WANDB_NAME win)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        import wandb

        self._wandb = wandb
        self.run = wandb.init(
            project=None if "WANDB_PROJECT" in environ else environ.get(OrchVar.JOB_NAME),
            name=None if "WANDB_NAME" in environ else environ.get(OrchVar.RUN_ID),
            settings=wandb.Settings(init_timeout=WANDB_INIT_TIMEOUT_S))

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def close(self, failed: bool) -> None:
        done = threading.Event()

        def finish() -> None:
            self.run.finish(exit_code=1 if failed else 0)
            done.set()

        threading.Thread(target=finish, name="wandb-finish", daemon=True).start()
        if not done.wait(WANDB_FINISH_TIMEOUT_S):
            _note(f"W&B did not finish within {WANDB_FINISH_TIMEOUT_S:.0f} s; training goes on without it. Its "
                  f"files stay in {self.run.dir}: push them later with `orchestrator sync` or `wandb sync`")


def wandb_wanted(environ: Mapping[str, str]) -> bool:
    """The explicit rule: WANDB_MODE (other than disabled) or WANDB_API_KEY is set. wandb itself must
    also be importable (checked without importing it)."""
    mode = environ.get("WANDB_MODE", "").strip().lower()
    return mode != "disabled" and bool(mode or environ.get("WANDB_API_KEY"))


def _trackers(environ: Mapping[str, str]) -> list[_Tracker]:
    """Rank 0's trackers: each one only when asked for, and a missing package or a tracker that fails to
    start is a note on stderr, never a failed job (the JSONL file holds every record anyway)."""
    out: list[_Tracker] = []
    tb_dir = environ.get(OrchVar.TENSORBOARD_DIR)
    if tb_dir:
        try:
            out.append(_TensorBoard(tb_dir))
        except ImportError as exc:
            _note(f"{OrchVar.TENSORBOARD_DIR} is set but TensorBoard cannot be used ({exc}): pip install tensorboard "
                  "(or ddp-orchestrator[tracking]); metrics go to metrics/*.jsonl only")
    if wandb_wanted(environ):
        found = importlib.util.find_spec("wandb")
        if found is None or found.origin is None:  # origin None: a bare folder named wandb, not the package
            _note("WANDB_MODE or WANDB_API_KEY is set but wandb is not installed (or a folder named wandb shadows "
                  "it): pip install wandb (or ddp-orchestrator[tracking]); metrics go to metrics/*.jsonl only")
        else:
            try:
                out.append(_WandB(environ))
            except Exception as exc:  # wandb's own errors (no network, a bad key) vary by version
                _note(f"W&B did not start ({type(exc).__name__}: {exc}); training goes on without it. Offline "
                      "logging needs no network: set WANDB_MODE=offline in the spec's env")
    return out
