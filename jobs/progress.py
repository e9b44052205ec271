"""The rank API's progress heartbeat: ``heartbeat(step, total, samples)`` once a step.

It feeds ``<run>/progress/rank-N.json`` (``orchestrator.progress``, standard library only), which
the orchestrator's live progress line and stall watchdog (``watchdog.stall_s``) read. Cheap
enough for every step: the writer touches the file at most once a second, and between writes a
call costs a clock read. Outside the orchestrator (no ORCH_RUN_DIR) it does nothing.
"""

from __future__ import annotations

import os

from orchestrator.progress import ProgressWriter
from orchestrator.rank_env import OrchVar

_writers: dict[tuple[str, int, int], ProgressWriter] = {}


def heartbeat(step: int, total: int | None = None, samples: int | None = None) -> bool:
    """Report that this rank finished ``step`` (of ``total``); ``samples``: how many samples one step
    trains on, for the samples/s shown. Returns whether a report was written."""
    writer = _writer()
    if writer is None:
        return False
    return writer.report(step, total, samples, force=total is not None and step >= total)  # the last one always


def _writer() -> ProgressWriter | None:
    run_dir = os.environ.get(OrchVar.RUN_DIR)
    if not run_dir:
        return None
    key = (run_dir, int(os.environ.get("RANK", "0")), int(os.environ.get(OrchVar.ATTEMPT, "0")))
    writer = _writers.get(key)
    if writer is None:  # a new run (the debug executor runs several in one process) or attempt
        writer = _writers[key] = ProgressWriter(*key)
    return writer
