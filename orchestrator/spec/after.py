"""A spec's ``after:``: the runs a job waits for, resolved to their records, and what that means
for SLURM (``--dependency=afterok:J1:J2,...`` with ``--kill-on-invalid-dep=yes``) and locally (the
runs must have ended as ``when`` asks).

Its own module because both the SLURM executor (a plain ``submit`` of a spec with ``after:``)
and ``orchestrator.front.pipeline`` (which submits through that executor) need it: the pipeline
imports the executors, so this part cannot live there without an import cycle.

The judgement is pure (``edge_status``, ``dependency_options``); reading records and spec files is
in ``resolve`` and ``check_local``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal, Optional, Sequence

from orchestrator.backends import backend
from orchestrator.core.errors import OrchestratorError, RunNotFoundError, SubmissionError
from orchestrator.core.records import RunRecord, resolve_run
from orchestrator.core.states import State

if TYPE_CHECKING:
    from orchestrator.plan import LaunchPlan
    from orchestrator.spec.models import AfterSpec, JobSpec

#: sbatch's word for each ``when``.
SBATCH_TYPE: dict[str, str] = {"ok": "afterok", "any": "afterany", "notok": "afternotok"}
#: What each ``when`` waits for, as users read it.
MEANING: dict[str, str] = {"ok": "COMPLETED", "any": "ended in any state", "notok": "ended in failure"}

Refresh = Callable[[list[RunRecord]], list[RunRecord]]


# ---- pure judgement ---------------------------------------------------------------------------
def edge_status(when: str, parent: Optional[State]) -> Literal["met", "never", "wait"]:
    """Whether a job that waits ``when`` on a parent in state ``parent`` may start now ("met"),
    never will ("never": SLURM cancels it under --kill-on-invalid-dep), or must wait ("wait").
    ``None``: the parent has not ended (it is about to be submitted, or runs). As SLURM judges:
    afterok needs COMPLETED; afterany any end; afternotok any end but COMPLETED (CANCELLED too)."""
    if parent is None or not parent.terminal:
        return "wait"
    if when == "any":
        return "met"
    ok = parent == State.COMPLETED
    return "met" if ok == (when == "ok") else "never"


def base_ids(job_ids: Sequence[str]) -> list[str]:
    """'12_0', '12_1', '13' -> ['12', '13']: a dependency on an array waits for all its tasks."""
    return list(dict.fromkeys(job.split("_")[0] for job in job_ids))


def dependency_options(deps: Sequence[tuple[str, Sequence[str]]]) -> dict[str, str]:
    """[('ok', ['12', '13_0']), ('any', ['14'])] -> the sbatch options {'dependency':
    'afterok:12:13,afterany:14', 'kill-on-invalid-dep': 'yes'}; {} when there is nothing to wait
    for. Types are joined with ',' (all must hold). --kill-on-invalid-dep=yes: a dependency that
    can never be met (a failed parent of an afterok child) cancels the job instead of leaving it
    PENDING forever."""
    by_type: dict[str, list[str]] = {}
    for when, jobs in deps:
        ids = by_type.setdefault(SBATCH_TYPE[when], [])
        ids += [j for j in base_ids(jobs) if j not in ids]
    parts = [f"{kind}:{':'.join(ids)}" for kind, ids in by_type.items() if ids]
    return {"dependency": ",".join(parts), "kill-on-invalid-dep": "yes"} if parts else {}


# ---- resolving entries ------------------------------------------------------------------------
@dataclass(frozen=True)
class Parent:
    """One ``after:`` entry, resolved: the run id it names, its record (None: no run yet) and when."""

    ref: str
    run_id: str
    when: str
    record: Optional[RunRecord]

    @property
    def state(self) -> Optional[State]:
        return self.record.state if self.record is not None else None


def is_spec_path(ref: str) -> bool:
    """A spec file (YAML or JSON, by its name or because it is a file) rather than a run id."""
    return ref.lower().endswith((".yaml", ".yml", ".json")) or os.path.isfile(ref)


def run_id_of(ref: str, executor: str | None = None) -> str:
    """The run id an ``after: run:`` names: a run id (or a run folder) as written, or a spec file's
    run id, loaded with ``executor`` (the waiting job's: a run id includes its executor)."""
    if not is_spec_path(ref):
        return os.path.basename(os.path.normpath(ref)) if os.path.isdir(ref) else ref
    from orchestrator.spec.identity import run_id
    from orchestrator.spec.loading import load_spec

    return run_id(load_spec(ref, executor=executor))


def find_record(run_id: str) -> Optional[RunRecord]:
    """The run's record as its folder holds it (not refreshed), or None when there is no such run."""
    try:
        return RunRecord.load(resolve_run(run_id))
    except RunNotFoundError:
        return None


def resolve(entries: Sequence[AfterSpec], executor: str | None, refresh: Refresh | None = None,
            own_run_id: str | None = None) -> list[Parent]:
    """Each AfterSpec (``.run``, ``.when``) -> a Parent, its record refreshed by ``refresh`` (the
    scheduler's view; None: as recorded). A spec file that cannot be loaded raises its SpecError."""
    out = []
    for entry in entries:
        rid = run_id_of(entry.run, executor)
        if own_run_id is not None and rid == own_run_id:
            raise SubmissionError(f"after: {entry.run!r} names this run itself ({rid}); remove that entry")
        out.append(Parent(entry.run, rid, entry.when, find_record(rid)))
    live = [p.record for p in out if p.record is not None and not p.record.state.terminal]
    if refresh is not None and live:
        fresh = {r.run_dir: r for r in refresh(live)}
        out = [Parent(p.ref, p.run_id, p.when, fresh.get(p.record.run_dir, p.record) if p.record else None)
               for p in out]
    return out


def _named(p: Parent) -> str:
    return p.run_id if p.ref == p.run_id else f"{p.run_id} ({p.ref})"


def slurm_dependencies(parents: Sequence[Parent]) -> list[tuple[str, list[str]]]:
    """What a SLURM job must wait for: (when, job ids) for each parent still queued or running.
    A parent that ended as ``when`` asks needs no dependency; one that never can, one with no run,
    and one running outside SLURM raise SubmissionError naming the fix."""
    deps = []
    for p in parents:
        status = edge_status(p.when, p.state)
        if p.record is None:
            raise SubmissionError(f"after: {_named(p)} has no run yet: submit it first, or submit both with "
                                  "'orchestrator pipeline FILE', which orders them")
        if status == "never":
            raise SubmissionError(f"after: {_named(p)} ended {p.state}, and when: {p.when} waits for it to have "
                                  f"{MEANING[p.when]}: submit it again first, or change that entry's 'when'")
        if status == "wait":
            if not backend(p.record.executor).scheduled or not p.record.job_ids:
                raise SubmissionError(f"after: {_named(p)} is {p.state} outside SLURM ({p.record.executor}); a SLURM "
                                      "job can only wait for SLURM jobs: submit this once it has ended")
            deps.append((p.when, list(p.record.job_ids)))
    return deps


def local_problems(parents: Sequence[Parent]) -> list[str]:
    """Why a local run may not start yet: each parent with no run, still going, or ended otherwise
    than ``when`` asks (a local run does not wait: it checks)."""
    problems = []
    for p in parents:
        status = edge_status(p.when, p.state)
        if p.record is None:
            problems.append(f"after: {_named(p)} has no run yet: run it first (or run both in order with "
                            "'orchestrator pipeline FILE')")
        elif status == "wait":
            problems.append(f"after: {_named(p)} is still {p.state}: run this once it has ended")
        elif status == "never":
            problems.append(f"after: {_named(p)} ended {p.state}, and when: {p.when} needs it to have "
                            f"{MEANING[p.when]}: run it again first, or change that entry's 'when'")
    return problems


def check_local(launch: LaunchPlan, refresh: Refresh | None = None) -> None:
    """``orchestrator run`` of a spec with ``after:`` (a LaunchPlan's): refuse (SubmissionError,
    every problem named) unless each named run has ended as its ``when`` asks."""
    entries = launch.spec.after
    if not entries:
        return
    problems = local_problems(resolve(entries, launch.executor, refresh, launch.run_id))
    if problems:
        raise SubmissionError(f"{launch.run_id} waits for runs that are not ready:\n  " + "\n  ".join(problems))


def after_lines(spec: JobSpec | LaunchPlan) -> list[str]:
    """``plan``'s line for a spec's ``after:`` (a JobSpec, or a LaunchPlan): each run it waits for, its ``when`` and the state its
    folder records now (no scheduler query): 'after: prep-1a2b3c4d (ok; COMPLETED), ...'."""
    if not hasattr(spec, "after"):  # a LaunchPlan: the spec it was made from (its executor the plan's)
        spec = spec.spec
    if not spec.after:
        return []
    shown = []
    for entry in spec.after:
        try:
            rid = run_id_of(entry.run, spec.executor)
        except (OrchestratorError, OSError) as exc:
            shown.append(f"{entry.run} ({entry.when}; cannot be read: {' '.join(str(exc).split())[:200]})")
            continue
        record = find_record(rid)
        state = record.state if record is not None else "no run yet"
        named = rid if rid == entry.run else f"{rid} [{Path(entry.run).name}]"
        shown.append(f"{named} ({entry.when}; {state})")
    extra = " (SLURM: --dependency with --kill-on-invalid-dep=yes)" if backend(spec.executor).scheduled else \
        " (checked before it starts)"
    return ["after: " + ", ".join(shown) + extra]
