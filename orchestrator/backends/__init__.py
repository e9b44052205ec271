"""The backends, by the spec's ``executor``: one registry of what each one is, so the rest of the
orchestrator asks what a backend does (``backend(name).scheduled``) instead of comparing its
name with "slurm" or "local". The generic planner asks here for the backend's planner
(``planner``) and imports no backend itself; ``factory.get_executor`` makes the executor (a
module of its own: the executors ask this one what a backend does). Adding a
backend means adding its package (``orchestrator/backends/<name>/``: its planner and executor)
and one entry in ``BACKENDS`` and in ``factory.EXECUTORS``.

Standard library only at import time: a backend's modules are imported when first asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from orchestrator.plan.plan_model import BackendPlanner


def _slurm_planner() -> BackendPlanner:
    from orchestrator.backends.slurm.slurm_plan import SlurmPlanner

    return SlurmPlanner()


def _local_planner() -> BackendPlanner:
    from orchestrator.backends.local.local_plan import LocalPlanner

    return LocalPlanner()


def _debug_planner() -> BackendPlanner:
    from orchestrator.backends.local.local_plan import LocalPlanner

    return LocalPlanner(debug=True)


def _slurm_preflight() -> None:
    """A cluster that cannot take a job is said before anything is stored (the code snapshot)."""
    from orchestrator.backends.slurm.node.slurm_controller import check_slurm_conf

    check_slurm_conf()


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class Backend:
    """What one backend is. ``scheduled``: a batch scheduler queues its jobs, which have job ids,
    wait for each other (``after:``, pipelines), are requeued by it and are asked about (paced);
    otherwise a supervisor on this machine runs the ranks and keeps the run folder current.
    ``foreground``: ``orchestrator run`` runs it in this terminal (else ``submit`` queues it).
    ``in_process``: the rank runs in this process (pdb): it imports the live files, no snapshot.
    ``poll_s``: how often ``Run.wait`` looks at a run."""

    name: str
    scheduled: bool
    foreground: bool
    in_process: bool
    poll_s: float
    make_planner: Callable[[], BackendPlanner]
    preflight: Callable[[], None] = _nothing  # before a submission stores anything


BACKENDS: dict[str, Backend] = {
    "local": Backend("local", scheduled=False, foreground=True, in_process=False, poll_s=0.2,
                     make_planner=_local_planner),
    "slurm": Backend("slurm", scheduled=True, foreground=False, in_process=False, poll_s=1.0,
                     make_planner=_slurm_planner, preflight=_slurm_preflight),
    "debug": Backend("debug", scheduled=False, foreground=True, in_process=True, poll_s=0.2,
                     make_planner=_debug_planner),
}


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
