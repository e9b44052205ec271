"""What a plan is made of: the LaunchPlan, its rows and sweep points, and what a backend's planner
gives the generic planner (``BackendPlanner``).

Below both ``orchestrator.plan`` (the generic planner) and each backend's planner
(``orchestrator.backends.local.local_plan``, ``orchestrator.backends.slurm.slurm_plan``), so the generic planner imports no
backend and no backend imports the generic planner.
"""

from __future__ import annotations

import contextlib
import gc
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Iterator, Mapping, Optional, Protocol

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, PlainValidator, PrivateAttr

from orchestrator.core.payload import Payload
from orchestrator.code.snapshot import Snapshot
from orchestrator.spec.models import ExecutorName, JobSpec

if TYPE_CHECKING:
    from orchestrator.core.netif import InterfaceChoice
    from orchestrator.core.payload import RecoverySettings


@dataclass(frozen=True, slots=True)
class RankRow:
    """One rank's place in the job and the environment it gets. ``<...>`` marks values known
    only at run time, with the rule that produces them. A plain dataclass: a plan may hold
    65,536 of them, and building a pydantic model for each would be most of a large plan's time
    (pydantic still validates and serialises the list in LaunchPlan)."""

    rank: int
    local_rank: int
    node_rank: int
    host: str
    env: dict[str, str]


def _payload_of(value: object) -> Payload:
    """A plan's payload: the record itself, or its dict (plan.json read back)."""
    if isinstance(value, Payload):
        return value
    if isinstance(value, Mapping):
        return Payload.from_dict(value, where="the plan's payload")
    raise ValueError(f"a payload is a Payload or its JSON object, not {type(value).__name__}")


#: The payload inside a pydantic model: a ``lean_record`` (no start-up cost on the ranks), which
#: pydantic neither validates nor serialises by itself.
PayloadField = Annotated[Payload, PlainValidator(_payload_of), PlainSerializer(lambda payload: payload.to_dict())]


class SweepPoint(BaseModel):
    model_config = ConfigDict(frozen=True)
    index: int
    args: dict[str, Any]
    argv: list[str]
    run_dir: str


class LaunchPlan(BaseModel):
    """Everything needed to launch, and to show the user what will launch."""

    model_config = ConfigDict(frozen=True)
    run_id: str
    run_dir: str
    executor: ExecutorName
    #: The validated spec the plan was made from (plan.json holds it as JSON; spec.yaml as YAML).
    spec: JobSpec
    nodes: int
    ranks_per_node: int
    world_size: int
    backend: str
    notes: list[str] = Field(default_factory=list)
    payload: PayloadField
    #: How each rank's process starts: "fork" (from the local zygote that imported torch),
    #: "fresh" (a new interpreter, locally or by srun), or "in-process" (the debug executor).
    rank_start: str = "fresh"
    ranks: list[RankRow]
    sweep: list[SweepPoint] = Field(default_factory=list)
    submitit: Optional[dict[str, Any]] = None
    sbatch_script: Optional[str] = None  # the first array chunk's (the only one without a sweep)
    sbatch_scripts: list[str] = Field(default_factory=list)  # every array chunk's script, as submitted
    array_chunks: list[list[int]] = Field(default_factory=list)
    #: The code snapshot the ranks import (``Snapshot.summary()``); None: they import the live files.
    code: Optional[dict[str, Any]] = None
    #: Where each rank's CPU count (srun's --cpus-per-task on SLURM, and OMP_NUM_THREADS) comes from.
    cpus: Optional[str] = None
    #: Which socket interface NCCL and gloo use, and why (``netif.InterfaceChoice.line``).
    interfaces: Optional[str] = None
    #: The scanned snapshot itself, which the run's start stores (``executors.base``); not serialised.
    _snapshot: Optional[Snapshot] = PrivateAttr(default=None)

    @property
    def snapshot(self) -> Optional[Snapshot]:
        return self._snapshot

    def payload_for_point(self, index: int | None) -> Payload:
        """The rank payload for one sweep point (or the single run)."""
        if index is None or not self.sweep:
            return self.payload
        point = self.sweep[index]
        return self.payload.for_point(index, point.argv, point.run_dir)


class Layout(BaseModel):
    """The shape a backend runs the spec in: nodes, ranks per node, process-group backend, the
    interface the ranks use, the devices a local run hands out, and the plan's notes about it."""

    nodes: int
    ranks_per_node: int
    backend: str
    interface: Optional[str]
    devices: Optional[list[int]]
    notes: list[str]


@dataclass(frozen=True)
class Launcher:
    """How a backend starts the ranks, as the payload carries it: the srun argv the SLURM agent
    runs (None: the local supervisor starts them) and each rank's log, by SLURM's patterns."""

    srun: Optional[list[str]] = None
    rank_log: Optional[str] = None


class BackendPlanner(Protocol):
    """What a backend decides in a plan (``orchestrator.backends.planner`` gives the executor's)."""

    def layout(self, spec: JobSpec) -> Layout: ...

    def threads(self, spec: JobSpec, local_ranks: int) -> int | str:
        """Each rank's OMP_NUM_THREADS default (a number, or the rule the job resolves)."""

    def python(self, spec: JobSpec) -> str:
        """The interpreter the ranks run."""

    def launcher(self, spec: JobSpec, run_dir: str, python: str, code: Snapshot | None, sweep: bool) -> Launcher: ...

    def rank_start(self, spec: JobSpec, env: Mapping[str, str]) -> tuple[str, str | None]:
        """How the ranks' processes start (``LaunchPlan.rank_start``), and the plan's note when not the default."""

    def cpus_line(self, spec: JobSpec, ranks: int, default: int | str) -> str:
        """Where each rank's CPU count comes from (after 'CPUs: ')."""

    def interfaces(self, payload: Payload) -> InterfaceChoice: ...

    def launch_fields(self, spec: JobSpec, run_id: str, run_dir: str, shown: Payload, n_points: int,
                      max_array_size: int | None) -> dict[str, Any]:
        """The LaunchPlan's backend fields: ``ranks`` (every rank's row, built from ``shown``, the
        payload with a sweep point's values as their rules), and for SLURM the submission."""

    def array_note(self, n_points: int, max_array_size: int | None, why: str | None) -> str | None:
        """The plan's line on how a sweep is split into submissions (None: nothing to say)."""

    def environment_lines(self, launch: LaunchPlan) -> list[str]:
        """What of this environment the submission will pick up (a scheduler's defaults)."""

    def recovery_how(self, recovery: RecoverySettings) -> str:
        """What a restart is on this backend, as ``plan``'s recovery line says it."""

    def steps_line(self, nodes: int, world: int, per_node: int, payload: Payload) -> str:
        """How the ranks' processes start at this size, as ``plan``'s start-up line says it."""


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause Python's cycle collector while one dict per rank is built (or checked): those make no
    reference cycles, and each automatic collection would re-scan every object the process holds
    (pydantic's schemas included), again and again: a large share of building a large plan's rows."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask: taskset, an salloc on a big node, a
    cgroup cpuset), not the machine's core count."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1
