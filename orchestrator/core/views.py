"""What the spec's rule modules read of a JobSpec and of a LaunchPlan, as typing Protocols.

``spec.py`` calls ``container.problems`` and ``frameworks.problems`` while it validates, and
``plan.py`` imports ``container``, ``frameworks`` (through ``rank_env``) and ``tracking``: those
modules must not import ``spec`` or ``plan`` back, not even for type checking (the import graph
stays a tree: ``tests/unit/test_boundaries.py``). They are typed against these read-only views
instead, which ``JobSpec`` and ``LaunchPlan`` satisfy structurally (a type checker verifies it
where they are passed). Standard library only: ``frameworks`` and ``tracking`` run on every rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional, Protocol, Sequence, Sized

if TYPE_CHECKING:
    from orchestrator.core.payload import Payload


class ContainerView(Protocol):
    """``JobSpec.container``."""

    @property
    def runtime(self) -> str: ...
    @property
    def image(self) -> str: ...
    @property
    def python(self) -> str: ...
    @property
    def mounts(self) -> Sequence[str]: ...
    @property
    def options(self) -> Sequence[str]: ...


class SlurmView(Protocol):
    """The parts of ``JobSpec.slurm`` a one-node check's srun takes."""

    @property
    def partition(self) -> Optional[str]: ...
    @property
    def account(self) -> Optional[str]: ...
    @property
    def qos(self) -> Optional[str]: ...
    @property
    def nodelist(self) -> Optional[str]: ...


class LocalView(Protocol):
    @property
    def devices(self) -> Optional[Sequence[int]]: ...


class DistributedView(Protocol):
    @property
    def rendezvous_dir(self) -> Optional[str]: ...


class CheckpointView(Protocol):
    @property
    def dir(self) -> Optional[str]: ...


class CodeView(Protocol):
    @property
    def snapshot(self) -> bool: ...


class TrackingView(Protocol):
    @property
    def wandb(self) -> bool: ...
    @property
    def tensorboard(self) -> bool: ...
    @property
    def mlflow(self) -> bool: ...


class BackendView(Protocol):
    """What the spec's executor is (``orchestrator.backends.Backend``), as the rule modules ask it
    instead of comparing its name."""

    @property
    def scheduled(self) -> bool: ...  # a scheduler's nodes run the spec's own shape
    @property
    def emulated(self) -> bool: ...  # the nodes are emulated on this machine (local_shape)
    @property
    def in_process(self) -> bool: ...  # one rank, in this process


class ShapeView(Protocol):
    """A spec's shape: where it runs, on how many nodes and ranks, with which backend."""

    @property
    def executor(self) -> str: ...
    @property
    def runs_on(self) -> BackendView: ...
    @property
    def framework(self) -> Optional[str]: ...
    @property
    def strategy(self) -> str: ...
    @property
    def nodes(self) -> int: ...
    @property
    def gpus_per_node(self) -> int: ...
    @property
    def ranks_per_node(self) -> int: ...
    @property
    def resolved_backend(self) -> str: ...

    def local_shape(self) -> tuple[int, int]: ...

    def local_backend(self) -> str: ...


class CommandView(Protocol):
    """What a spec runs on every rank, with what, and where its runs go."""

    @property
    def entrypoint(self) -> str: ...
    @property
    def args(self) -> Mapping[str, Any]: ...  # values as the user wrote them: text, numbers, true/false, lists
    @property
    def bool_args(self) -> str: ...
    @property
    def sweep(self) -> Mapping[str, Sequence[Any]]: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def runs_dir(self) -> str: ...
    @property
    def workdir(self) -> Optional[str]: ...


class SectionsView(Protocol):
    """A spec's sections, as the views above."""

    @property
    def container(self) -> Optional[ContainerView]: ...
    @property
    def slurm(self) -> SlurmView: ...
    @property
    def local(self) -> LocalView: ...
    @property
    def distributed(self) -> DistributedView: ...
    @property
    def checkpoint(self) -> CheckpointView: ...
    @property
    def code(self) -> CodeView: ...
    @property
    def tracking(self) -> TrackingView: ...


class SpecView(ShapeView, CommandView, SectionsView, Protocol):
    """A validated ``JobSpec``, as the rule modules read it: its shape, its command and its
    sections (a module that reads only one of them can be typed with that one)."""


class RankView(Protocol):
    @property
    def env(self) -> Mapping[str, str]: ...


class LaunchView(Protocol):
    """A ``LaunchPlan``, as the plan's lines of these modules read it."""

    @property
    def run_id(self) -> str: ...
    @property
    def run_dir(self) -> str: ...
    @property
    def spec(self) -> SpecView: ...
    @property
    def payload(self) -> Payload: ...
    @property
    def nodes(self) -> int: ...
    @property
    def ranks_per_node(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def ranks(self) -> Sequence[RankView]: ...
    @property
    def sweep(self) -> Sized: ...  # the plan's sweep points; only their number is read

    def payload_for_point(self, index: int | None) -> Payload: ...
