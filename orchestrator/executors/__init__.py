"""One module per backend behind one small interface (see base.py). No silent fallback: an
executor's name is checked against the one registry of backends (``orchestrator.backends``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # importing base pulls in pydantic; forked.py must start without it
    from orchestrator.executors.base import Executor


def _local() -> Executor:
    from orchestrator.executors.local import LocalExecutor

    return LocalExecutor()


def _debug() -> Executor:
    from orchestrator.executors.debug import DebugExecutor

    return DebugExecutor()


def _slurm() -> Executor:
    from orchestrator.executors.slurm import SlurmExecutor

    return SlurmExecutor()


#: Each backend's executor, made when first asked for (``backends.BACKENDS`` has the same names).
EXECUTORS: dict[str, Callable[[], Executor]] = {"local": _local, "debug": _debug, "slurm": _slurm}


def get_executor(name: str) -> Executor:
    from orchestrator.backends import backend

    return EXECUTORS[backend(name).name]()
