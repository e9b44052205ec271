"""The rank API's progress heartbeat: ``heartbeat(step, total, samples)`` once a step.

It feeds ``<run>/progress/`` (``orchestrator.core.progress``, standard library only: one file per node,
published by one of the node's ranks), which the orchestrator's live progress line and stall
watchdog (``watchdog.stall_s``) read. Cheap
enough for every step: the writer touches the file at most once a second, and between writes a
call costs a clock read. Outside the orchestrator (no ORCH_RUN_DIR) it does nothing.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
from typing import Any, Optional

from orchestrator.core.progress import NodePlace, ProgressWriter
from orchestrator.node.rank_env import OrchVar

_writers: dict[tuple[str, int, int], ProgressWriter] = {}


def heartbeat(step: int, total: int | None = None, samples: float | None = None,
              busy_s: float | None = None) -> bool:
    """Report that this rank finished ``step`` (of ``total``); ``samples``: how many samples one
    step trains on, for the samples/s shown; ``busy_s``: the seconds of this step spent outside
    collectives (loading data, the forward pass, your own work: from the end of the previous step
    to the start of ``backward``), which lets ``status`` and ``top`` name a rank slower than the
    others (``watchdog.straggler_factor``). Returns whether a report was written. Any number type
    works (numpy's and torch's scalars too): ``step`` and ``total`` any whole number (an integral
    float such as 3.0 included), ``samples`` and ``busy_s`` any finite real >= 0."""
    step = _whole(step, "step")
    total = None if total is None else _whole(total, "total")
    samples = None if samples is None else _real(samples, "samples")
    busy_s = None if busy_s is None else _real(busy_s, "busy_s")
    writer = _writer()
    if writer is None:
        return False
    return writer.report(step, total, samples, force=total is not None and step >= total,  # the last one always
                         busy_s=busy_s)


def _whole(value: Any, name: str) -> int:
    """A plain int from any numbers.Integral, or any numbers.Real with a whole value (numpy
    registers its scalar types with the numbers ABCs; nothing here imports numpy)."""
    value = _scalar(value)
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        real = float(value)
        if math.isfinite(real) and real.is_integer():
            return int(real)
        raise ValueError(f"heartbeat: {name}={value!r} is not a whole number of steps")
    raise TypeError(f"heartbeat: {name} is a step count (an integer), not {type(value).__name__}")


def _real(value: Any, name: str) -> float:
    value = _scalar(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        real = float(value)
        if math.isfinite(real) and real >= 0:
            return real
        raise ValueError(f"heartbeat: {name}={value!r} must be a finite number >= 0")
    raise TypeError(f"heartbeat: {name} is a number, not {type(value).__name__}")


def _scalar(value: Any) -> Any:
    """A one-element tensor or array (``loss.item()`` forgotten) as its Python number."""
    if not isinstance(value, numbers.Number) and callable(getattr(value, "item", None)):
        try:
            return value.item()
        except (ValueError, RuntimeError, TypeError):
            return value
    return value


def _writer() -> ProgressWriter | None:
    run_dir = os.environ.get(OrchVar.RUN_DIR)
    if not run_dir:
        return None
    key = (run_dir, int(os.environ.get("RANK", "0")), int(os.environ.get(OrchVar.ATTEMPT, "0")))
    writer = _writers.get(key)
    if writer is None:  # a new run (the debug executor runs several in one process) or attempt
        writer = _writers[key] = ProgressWriter(*key, place=NodePlace.from_env(), gpu=gpu_figures)
    return writer


def gpu_figures() -> tuple[Optional[float], Optional[float]]:
    """This rank's GPU as ``top`` shows it: the device's utilisation (%, through NVML: the
    nvidia-ml-py package; None without it) and the memory this process holds there (torch's caching
    allocator, MiB). Nothing for a CPU rank, nor before the rank's own code has used CUDA: the
    probe never initialises CUDA (a fork after that would break), and never fails the rank."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None, None
        device = torch.cuda.current_device()
        memory = round(torch.cuda.memory_reserved(device) / 2**20, 1)
    except Exception:  # noqa: BLE001 - a probe of what is shown, never a failure of the rank
        return None, None
    try:
        utilisation: Optional[float] = float(torch.cuda.utilization(device))
    except Exception:  # noqa: BLE001 - NVML absent (no nvidia-ml-py) or unsupported on this device
        utilisation = None
    return utilisation, memory
