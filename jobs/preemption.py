"""A stop flag set by a signal, agreed on by all ranks at a step boundary.

The signal handler only sets a flag (it may run in the middle of a collective). At each step
boundary, ``should_stop()`` all-reduces the flag with MAX, so if any rank was signalled, every
rank stops at the same step and they can checkpoint together. SLURM sends USR2 a margin before
the time limit or on preemption; SIGTERM is included for local cancellation.
"""

from __future__ import annotations

import signal
from types import FrameType

import torch
import torch.distributed as dist


class StopFlag:
    def __init__(self, signals: tuple[int, ...] = (signal.SIGUSR2, signal.SIGTERM)) -> None:
        self.local = False
        self.signal_name: str | None = None
        self._previous = {}
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.local = True
        self.signal_name = signal.Signals(signum).name

    def should_stop(self, device: torch.device | str = "cpu") -> bool:
        """Collective: every rank must call it at the same step."""
        if not (dist.is_available() and dist.is_initialized()):
            return self.local
        flag = torch.tensor([1 if self.local else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def mark_checkpointed_for_requeue() -> bool:
    """Tell the orchestrator the ranks stopped on a signal *and* their checkpoint is written, so
    the job may be requeued (``slurm.requeue: auto``). Call it on one rank (rank 0) after the
    collective checkpoint. Does nothing outside an orchestrator SLURM job; True if it marked."""
    import os

    path = os.environ.get("ORCH_REQUEUE_MARKER")
    if not path:
        return False
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("checkpointed\n")
    return True
