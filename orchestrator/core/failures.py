"""How a rank's failure is told: the user's traceback without the launcher's frames.

Standard library only (ranks import it). The full traceback stays in ``<run>/errors/rank-N.json``;
what the rank's log and the run's outcome show is trimmed of the orchestrator's and runpy's
frames, which are the same in every failure and hide the user's own.
"""

from __future__ import annotations

import os
import runpy
import traceback

_OURS = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep, os.path.abspath(runpy.__file__))

#: The line a failing rank prints before its traceback. The local console stops echoing a rank
#: after it (the run's outcome shows the first failure's traceback once).
FAILED_MARK = "[launcher] rank {rank} failed: "


def _is_ours(filename: str) -> bool:
    path = os.path.abspath(filename)
    return path.startswith(_OURS[0]) or path == _OURS[1] or filename.startswith("<frozen runpy")


def user_traceback(exc: BaseException) -> str:
    """``traceback.format_exception`` with the orchestrator's and runpy's frames left out (each
    chained exception too). If every frame is ours, the full traceback is the honest answer."""
    te = traceback.TracebackException.from_exception(exc)
    for part in _chain(te):
        kept = [f for f in part.stack if not _is_ours(f.filename)]
        if kept:
            part.stack = traceback.StackSummary.from_list(kept)
    return "".join(te.format())


def _chain(te: traceback.TracebackException) -> list[traceback.TracebackException]:
    out, seen = [], set()
    current: traceback.TracebackException | None = te
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        out.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return out


def message_of(exc: BaseException) -> str:
    """``str(exc)``, plus the operating system's reason when it is buried in the exception's
    chain: torch reports a full disk while saving as "enforce fail at inline_container.cc:...",
    and "No space left on device" is only in the error that caused it."""
    text = str(exc)
    seen, cause = {id(exc)}, exc.__cause__ or exc.__context__
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.strerror and cause.strerror not in text:
            where = f": {cause.filename}" if cause.filename else ""
            return f"{text} (caused by {type(cause).__name__}: {cause.strerror}{where})"
        cause = cause.__cause__ or cause.__context__
    return text


#: What torch says when a rank asks for a GPU it cannot see.
_NO_GPU = ("No CUDA GPUs are available", "invalid device ordinal", "Found no NVIDIA driver",
           "Torch not compiled with CUDA enabled", "CUDA driver initialization failed")


def hidden_gpu_hint(message: str, devices: tuple[int, ...] | list[int] | None) -> str | None:
    """The fix for a local rank that failed because it asked for a GPU the local run hid: locally
    a GPU job is a CPU dry run unless ``local.devices`` lists the GPUs to use."""
    if devices or not any(s in message for s in _NO_GPU):
        return None
    return ("hint: this local run hides every GPU (a CPU dry run, CUDA_VISIBLE_DEVICES empty) because the "
            "spec lists no local.devices; to train on this machine's GPUs set local.devices, e.g. "
            "--set 'local.devices=[0]'")
