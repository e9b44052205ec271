"""Typed PyTorch DDP jobs, run on SLURM or as a local dry run.

Kept import-free: every rank imports this package, so nothing here imports torch, pydantic or
submitit. The public API is loaded on first use (PEP 562)::

    from orchestrator import JobSpec, Run, load_spec, run, submit
"""

from __future__ import annotations

from orchestrator.core import moved

__version__ = "0.1.0"
moved.install()  # the modules' names before the package move stay importable (queued jobs call them)

#: public name -> the module that defines it, imported when the name is first used
_LAZY = {
    "JobSpec": "orchestrator.spec.models",
    **dict.fromkeys(("load_spec", "run", "submit", "Run"), "orchestrator.api"),
    **dict.fromkeys(("OrchestratorError", "SpecError", "SubmissionError", "JobFailedError", "RunNotFoundError",
                     "RunNotFinishedError", "WaitTimeoutError", "UsageError"), "orchestrator.core.errors"),
}
__all__ = sorted(_LAZY)

TYPE_CHECKING = False  # not typing's: the package stays cheap to import (moved.py says why)
if TYPE_CHECKING:
    from typing import Any

    # The lazy names, for type checkers (``__all__`` is built from _LAZY, which ruff cannot read).
    from orchestrator.api import Run, load_spec, run, submit  # noqa: F401
    from orchestrator.core.errors import (JobFailedError, OrchestratorError, RunNotFinishedError,  # noqa: F401
                                          RunNotFoundError, SpecError, SubmissionError, UsageError, WaitTimeoutError)
    from orchestrator.spec.models import JobSpec  # noqa: F401


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    from orchestrator.core.platform_caps import unsupported_reason

    unsupported = unsupported_reason()  # native Windows: say what to use, not which module is missing
    if unsupported:
        raise ImportError(f"orchestrator.{name}: {unsupported}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
