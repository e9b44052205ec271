"""Specs in, plans out: what ``run``, ``submit`` and ``plan`` do before anything starts. Every
spec is validated here once, with the executor it is planned for; the plan is made for it, with
the project's code scanned (``orchestrator.code.snapshot``) and, for a SLURM sweep, the cluster's
MaxArraySize (as submit splits it). ``orchestrator.api`` re-exports these names.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence, Union, cast

from orchestrator.backends import backend
from orchestrator.core.errors import OrchestratorError

if TYPE_CHECKING:
    from orchestrator.plan import LaunchPlan
    from orchestrator.code.snapshot import Snapshot
    from orchestrator.spec.models import JobSpec

#: What ``run`` and ``submit`` accept: a JobSpec, a mapping of spec fields, a spec file, or a
#: list of any of these (merged in order, as by ``load_spec``).
SpecLike = Union["JobSpec", Mapping[str, Any], str, Path, Sequence[Any]]


def load_spec(*sources: Any, overrides: Iterable[str] = (), executor: str | None = None) -> JobSpec:
    """Spec files (YAML or JSON paths), mappings and JobSpecs, deep-merged in order (later ones
    win key by key), then each ``"key.path=value"`` override in order (the value is read as
    YAML, as with ``--set``), then ``executor``. Raises SpecError naming the source, the field
    and the fix. (Defined in ``orchestrator.spec.loading``, which brings pydantic in.)"""
    from orchestrator.spec.loading import load_spec as load

    return load(*sources, overrides=overrides, executor=executor)


def as_spec(spec: SpecLike, executor: str | None = None) -> JobSpec:
    """Anything ``load_spec`` takes, through ``load_spec`` (with ``executor``, whose rules apply). A
    JobSpec validated on this machine (by ``load_spec`` or its constructor) for that executor is
    taken as it is: a spec is validated once per run or submission. Any other JobSpec (one changed
    with ``model_copy(update=...)`` was never checked) is validated again, with the same errors."""
    from orchestrator.spec.models import is_validated

    if is_validated(spec) and executor in (None, cast("JobSpec", spec).executor):
        return cast("JobSpec", spec)
    return load_spec(*(spec if isinstance(spec, (list, tuple)) else [spec]), executor=executor)


def plan_for(spec: SpecLike, executor: str | None = None) -> LaunchPlan:
    """The LaunchPlan (what ``orchestrator plan`` prints): nothing is started or written (the
    project is read to show its code snapshot). Every spec is validated here, whatever made it,
    so run/submit/plan never act on an unchecked one."""
    return planned(spec, executor)[0]


def planned(spec: SpecLike, executor: str | None = None, *,
            stage_for: tuple[str, ...] = ()) -> tuple[LaunchPlan, Snapshot | None]:
    """The plan and the scanned code snapshot it runs (None: live files, ``code.snapshot: false``,
    the debug executor, or an entrypoint from an installed package). ``stage_for``: the executors
    for which the scan copies the files the store lacks into it while hashing them (run: local,
    submit: slurm), so a file that changes afterwards never refuses the run, and a run refused for
    its executor writes nothing."""
    from orchestrator.plan import plan

    checked = as_spec(spec, executor)  # the executor's own rules apply (local caps, node-local paths)
    backend(checked.executor).make_planner().layout(checked)  # its refusals (a node-local runs_dir) before the scan stores
    code = scan_code(checked, checked.executor, stage=checked.executor in stage_for)
    limit, why = array_limit(checked)
    return plan(checked, code=code, max_array_size=limit, array_limit_why=why), code


def array_limit(spec: JobSpec) -> tuple[int | None, str | None]:
    """A SLURM sweep's MaxArraySize as submit splits it (``ScheduledExecutor.array_limit``), so
    ``plan`` shows the arrays submit makes; (None, why) when no cluster answers (no SLURM here, a
    controller down): the plan then assumes SLURM's default and says so."""
    if not backend(spec.executor).scheduled or not spec.sweep:
        return None, None
    from orchestrator.backends.factory import scheduler

    try:
        return scheduler(spec.executor).array_limit(), None
    except (OrchestratorError, OSError) as exc:
        return None, " ".join(str(exc).split())[:200]


def scan_code(spec: JobSpec, executor: str, *, stage: bool = False) -> Snapshot | None:
    """Read and hash the project the spec's entrypoint lives in (``orchestrator.code.snapshot``)."""
    if not spec.code.snapshot or backend(executor).in_process:
        return None
    from orchestrator.code.snapshot import scan_project

    extra = [os.path.abspath(p) for p in (spec.checkpoint.dir, spec.distributed.rendezvous_dir) if p]
    return scan_project(spec.entrypoint, os.getcwd(), spec.runs_dir, ignore_file=spec.code.ignore_file,
                        max_mb=spec.code.max_mb, exclude=extra, include_patterns=spec.code.include,
                        exclude_patterns=spec.code.exclude, stage=stage)
