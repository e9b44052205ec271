"""Each backend's executor, made when first asked for: the registry's second half, in a module of
its own because the executors themselves ask ``orchestrator.backends`` what a backend does (so
that module imports none of them, even lazily). ``EXECUTORS`` has the names ``BACKENDS`` has."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, cast

if TYPE_CHECKING:  # importing base pulls in pydantic; forked.py must start without it
    import subprocess

    from orchestrator.executors.base import Executor, ScheduledExecutor


def _local(zygote: subprocess.Popen | None) -> Executor:
    from orchestrator.backends.local.executor import LocalExecutor

    return LocalExecutor(zygote)


def _debug(zygote: subprocess.Popen | None) -> Executor:
    from orchestrator.backends.local.debug import DebugExecutor

    return DebugExecutor()


def _slurm(zygote: subprocess.Popen | None) -> Executor:
    from orchestrator.backends.slurm.executor import SlurmExecutor

    return SlurmExecutor()


#: Each backend's executor, made when first asked for (``backends.BACKENDS`` has the same names).
EXECUTORS: dict[str, Callable[[subprocess.Popen | None], Executor]] = {"local": _local, "debug": _debug,
                                                                       "slurm": _slurm}


def scheduler(name: str) -> ScheduledExecutor:
    """The executor of the scheduled backend called ``name`` (``Kind.scheduled``), for what only
    a scheduler answers; OrchestratorError for another backend."""
    from orchestrator.backends import backend

    if not backend(name).scheduled:
        from orchestrator.core.errors import OrchestratorError

        raise OrchestratorError(f"executor {name} has no scheduler to ask: this needs a scheduled executor (slurm)")
    return cast("ScheduledExecutor", get_executor(name))


def get_executor(name: str, zygote: subprocess.Popen | None = None) -> Executor:
    """The executor of the backend called ``name``; an unknown name is refused naming the known ones.
    ``zygote``: a launcher that imported torch early (``start_zygote``), for a backend whose ranks
    are processes started on this machine (the others do without it)."""
    from orchestrator.backends import backend

    return EXECUTORS[backend(name).name](zygote)


def start_zygote() -> subprocess.Popen:
    """The local ranks' warm parent (``local.forked.start_zygote``), started before a spec is read
    (pydantic not imported yet) so that torch imports meanwhile."""
    from orchestrator.backends.local.forked import start_zygote as start

    return start()
