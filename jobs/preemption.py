"""A stop flag set by a signal, agreed on by all ranks at a step boundary.

The signal handler only sets a flag (it may run in the middle of a collective). At a step
boundary, ``should_stop()`` all-reduces the flag with MAX, so if any rank was signalled, every
rank stops at the same step and they can checkpoint together. SLURM sends the job's notice
(``slurm.signal``: USR2 by default, ``ORCH_STOP_SIGNAL`` in the rank) a margin before the time
limit or on preemption; USR2 and SIGTERM (cancel, preemption) are always included. After that
checkpoint, ``checkpointed()`` tells the orchestrator the job may be requeued
(``slurm.requeue: auto``).
"""

from __future__ import annotations

import os
import signal
from types import FrameType, TracebackType
from typing import Any

import torch
import torch.distributed as dist

from orchestrator.node.rank_env import OrchVar
from orchestrator.core.run_folder import stop_flag_note


class StopFlag:
    """Install it before the long work starts (``with jobs.StopFlag() as stop:`` puts the previous
    handlers back on the way out; ``restore()`` does it by hand)."""

    def __init__(self, signals: tuple[int, ...] | None = None) -> None:
        self.local = False
        self.signal_name: str | None = None
        self.stopped = False  # should_stop() returned True: the ranks agreed to stop
        self._noted_stop = False
        self._previous: dict[int, Any] = {sig: signal.signal(sig, self._handle)
                                          for sig in (default_signals() if signals is None else signals)}
        note_stop_state("listening")

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.local = True
        self.signal_name = signal.Signals(signum).name

    def should_stop(self, device: torch.device | str = "cpu", *, step: int | None = None, every: int = 1) -> bool:
        """Collective: every rank must call it at the same steps. With ``step`` and ``every``, only
        every ``every``-th step communicates (one tiny all_reduce); the others return False at once."""
        if step is not None and step % every != 0:
            return False
        if dist.is_available() and dist.is_initialized():
            flag = torch.tensor([1 if self.local else 0], dtype=torch.int32, device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            self.stopped = bool(flag.item())
        else:
            self.stopped = self.local
        if self.stopped and not self._noted_stop:
            self._noted_stop = note_stop_state("stopped")
        return self.stopped

    def checkpointed(self) -> bool:
        """Call it on every rank once the checkpoint after a stop is written: rank 0 marks the job
        as requeueable (``mark_checkpointed_for_requeue``). True if it marked."""
        if not self.stopped:
            return False
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", "0"))
        return rank == 0 and mark_checkpointed_for_requeue()

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def __enter__(self) -> StopFlag:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.restore()


def default_signals() -> tuple[int, ...]:
    """USR2, SIGTERM, and the job's own notice (``ORCH_STOP_SIGNAL``, from ``slurm.signal``)."""
    chosen = [signal.SIGUSR2, signal.SIGTERM]
    name = os.environ.get(OrchVar.STOP_SIGNAL, "")
    if name in signal.Signals.__members__ and signal.Signals[name] not in chosen:
        chosen.append(signal.Signals[name])
    return tuple(chosen)


def note_stop_state(state: str) -> bool:
    """Rank 0 notes for the job's agent that the ranks listen for a stop ('listening') or have
    stopped on one ('stopped'), beside the attempt's requeue marker: ranks that end after the time
    limit's notice without having stopped finished their work, and the job is not requeued for it
    (``slurm.requeue: always``). Does nothing outside an orchestrator SLURM job; True if noted."""
    path = os.environ.get(OrchVar.REQUEUE_MARKER)
    if not path or os.environ.get("RANK", "0") != "0":
        return False
    note = stop_flag_note(path)
    try:
        os.makedirs(os.path.dirname(note), exist_ok=True)
        with open(note + ".tmp", "w", encoding="utf-8") as fh:
            fh.write(state + "\n")
        os.replace(note + ".tmp", note)
    except OSError:
        return False  # the agent then treats the ranks as any script's: requeued after the notice
    return True


def mark_checkpointed_for_requeue() -> bool:
    """Tell the orchestrator the ranks stopped on a signal *and* their checkpoint is written, so
    the job may be requeued (``slurm.requeue: auto``). Call it on one rank (rank 0) after the
    collective checkpoint. Does nothing outside an orchestrator SLURM job; True if it marked."""
    path = os.environ.get(OrchVar.REQUEUE_MARKER)
    if not path:
        return False
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("checkpointed\n")
    return True
