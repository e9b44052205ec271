"""One module per backend behind one small interface (see base.py). No silent fallback."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing base pulls in pydantic; forked.py must start without it
    from orchestrator.executors.base import Executor


def get_executor(name: str) -> Executor:
    if name == "local":
        from orchestrator.executors.local import LocalExecutor

        return LocalExecutor()
    if name == "debug":
        from orchestrator.executors.debug import DebugExecutor

        return DebugExecutor()
    if name == "slurm":
        from orchestrator.executors.slurm import SlurmExecutor

        return SlurmExecutor()
    from orchestrator.errors import OrchestratorError

    raise OrchestratorError(f"unknown executor {name[:40]!r}: use local, slurm or debug")
