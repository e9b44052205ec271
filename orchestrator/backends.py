"""The backends, by the spec's ``executor``: the one place that maps an executor's name to the
module that plans for it (``planner``). The generic planner (``orchestrator.plan``) asks here and
imports no backend itself; adding a backend means adding its planner module and one entry below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.plan_model import BackendPlanner
    from orchestrator.spec import ExecutorName


def planner(executor: ExecutorName) -> BackendPlanner:
    """The executor's planner (``plan_model.BackendPlanner``), imported when first asked for."""
    if executor == "slurm":
        from orchestrator.slurm_plan import SlurmPlanner

        return SlurmPlanner()
    if executor in ("local", "debug"):
        from orchestrator.local_plan import LocalPlanner

        return LocalPlanner(debug=executor == "debug")
    from orchestrator.errors import OrchestratorError

    raise OrchestratorError(f"unknown executor {str(executor)[:40]!r}: use local, slurm or debug")
