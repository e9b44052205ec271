"""The backends, by the spec's ``executor``: one registry of what each one is, so the rest of the
orchestrator asks what a backend does (``backend(name).scheduled``) instead of comparing its
name with "slurm" or "local". The generic planner asks here for the backend's planner
(``planner``) and imports no backend itself; ``factory.get_executor`` makes the executor (a
module of its own: the executors ask this one what a backend does). Adding a
backend means adding its package (``orchestrator/backends/<name>/``: its planner and executor)
and one entry in ``kinds.KINDS`` (its facts, which a spec reads too), ``_PLANNERS`` and
``factory.EXECUTORS``.

Standard library only at import time: a backend's modules are imported when first asked for.
"""

from __future__ import annotations

from orchestrator.backends.kinds import KINDS, Kind
from orchestrator.core.lean_record import record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a rank imports this module)
if TYPE_CHECKING:
    from typing import Callable
    from orchestrator.plan.plan_model import BackendPlanner


def _slurm_planner() -> BackendPlanner:
    from orchestrator.backends.slurm.slurm_plan import SlurmPlanner

    return SlurmPlanner()


def _local_planner(debug: bool = False) -> BackendPlanner:
    from orchestrator.backends.local.local_plan import LocalPlanner

    return LocalPlanner(debug)


def _slurm_preflight() -> None:
    """A cluster that cannot take a job is said before anything is stored (the code snapshot)."""
    from orchestrator.backends.slurm.node.slurm_controller import check_slurm_conf

    check_slurm_conf()


def _nothing() -> None:
    return None


@record
class Backend(Kind):
    """What one backend is (``kinds.Kind``: its facts) and how it plans and checks a submission."""

    make_planner: Callable[[], BackendPlanner]
    preflight: Callable[[], None] = _nothing  # before a submission stores anything


_PLANNERS: dict[str, Callable[[], BackendPlanner]] = {"local": _local_planner, "slurm": _slurm_planner,
                                                       "debug": lambda: _local_planner(debug=True)}
_PREFLIGHTS: dict[str, Callable[[], None]] = {"slurm": _slurm_preflight}
BACKENDS: dict[str, Backend] = {name: Backend(**vars(kind), make_planner=_PLANNERS[name],
                                              preflight=_PREFLIGHTS.get(name, _nothing))
                                for name, kind in KINDS.items()}


def backend(name: str) -> Backend:
    """The backend called ``name`` (a spec's or a run record's ``executor``)."""
    found = BACKENDS.get(name)
    if found is None:
        from orchestrator.core.errors import OrchestratorError

        names = list(BACKENDS)
        raise OrchestratorError(f"unknown executor {str(name)[:40]!r}: use {', '.join(names[:-1])} or {names[-1]}")
    return found


def planner(executor: str) -> BackendPlanner:
    """The executor's planner (``plan_model.BackendPlanner``), imported when first asked for."""
    return backend(executor).make_planner()
