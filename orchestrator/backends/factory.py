"""Each backend's executor, made when first asked for: the registry's second half, in a module of
its own because the executors themselves ask ``orchestrator.backends`` what a backend does (so
that module imports none of them, even lazily). ``EXECUTORS`` has the names ``BACKENDS`` has."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # importing base pulls in pydantic; forked.py must start without it
    from orchestrator.executors.base import Executor


def _local() -> Executor:
    from orchestrator.backends.local.executor import LocalExecutor

    return LocalExecutor()


def _debug() -> Executor:
    from orchestrator.backends.local.debug import DebugExecutor

    return DebugExecutor()


def _slurm() -> Executor:
    from orchestrator.backends.slurm.executor import SlurmExecutor

    return SlurmExecutor()


#: Each backend's executor, made when first asked for (``backends.BACKENDS`` has the same names).
EXECUTORS: dict[str, Callable[[], Executor]] = {"local": _local, "debug": _debug, "slurm": _slurm}


def get_executor(name: str) -> Executor:
    """The executor of the backend called ``name``; an unknown name is refused naming the known ones."""
    from orchestrator.backends import backend

    return EXECUTORS[backend(name).name]()
