"""The job payload: what the plan writes for the ranks, the local supervisor and the SLURM agent.

One typed, versioned record, read the same way everywhere (attributes, never string keys with
fallbacks): a payload another version of the orchestrator wrote, or one missing a field, is
refused with one line that says what to do, instead of "working" on defaults. Standard library
only: every rank reads it before the user's code (and before torch) is imported.
"""

from __future__ import annotations

from collections.abc import Mapping
import json
import os
from pathlib import Path

from orchestrator.core import lean_record
from orchestrator.core.lean_record import record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a rank imports this module)
if TYPE_CHECKING:
    from typing import Any, Final, Optional, Union


#: Bumped whenever a field is added, removed or changes meaning.
PAYLOAD_VERSION = 6


class Defaults:
    """The job settings' defaults, in one place: the spec's fields use them, and so does the rank
    API (``jobs/runtime.py``) for a script started without the orchestrator (torchrun)."""

    BACKEND: Final = "auto"  # Final: a literal the spec's Literal fields accept
    STRATEGY: Final = "ddp"
    INIT_TIMEOUT_S = 300.0
    COLLECTIVE_TIMEOUT_S = 1800.0
    CHECKPOINT_INTERVAL = 0
    CHECKPOINT_KEEP = 3
    RESUME = True
    GRAD_COMPRESSION: Final = "none"
    STOP_GRACE_S = 30.0  # SLURM's KillWait default


class PayloadError(ValueError):
    """A payload this code cannot read: another version's, hand-edited, or truncated."""


def is_script(entrypoint: str) -> bool:
    """Whether an entrypoint is a script (``train.py``, or anything without ``:``) rather than a
    module's function (``pkg.module:function``): the one rule every reader of an entrypoint uses."""
    return entrypoint.endswith(".py") or ":" not in entrypoint


@record
class CheckpointSettings:
    dir: str
    interval_steps: int
    keep_last: int
    resume: bool


@record
class WatchdogSettings:
    stall_s: Optional[float]
    stacks_on_failure: bool
    straggler_factor: float = 1.5  # orchestrator.core.stragglers (absent from payloads before it: the default)
    straggler_window_s: float = 30.0  # named this long without a break: a 'straggler' failure (recovery.on)


@record
class RecoverySettings:
    """The spec's ``recovery`` section (``orchestrator.core.recovery`` decides with it)."""

    max_restarts: int
    on: tuple[str, ...]  # crash, node_failure, hang, unhealthy
    exclude_failed_nodes: bool
    health_check: bool
    node_check: Optional[tuple[str, ...]]
    stop_without_progress: int
    spares: int = 0  # SLURM: nodes held in the allocation beyond ``nodes``, to replace a failed one
    in_allocation: bool = True  # SLURM: restart the ranks' step inside the job; requeue only when out of nodes
    survivors: str = "restart"  # "keep": after a crash only the failed ranks are forked again (local)
    standbys: bool = True  # SLURM: warm interpreters on the job's nodes fork the ranks of a restart inside it


@record
class CodeSettings:
    """The code snapshot the ranks import from (``orchestrator.code.snapshot``, ``orchestrator.node.code_redirect``)."""

    id: str
    live_root: str  # the project as it was on disk; imports that resolve inside it move to the tree
    tree: str  # the snapshot's folder


@record
class ContainerSettings:
    """The spec's ``container`` section (``orchestrator.node.container`` wraps the rank command with it)."""

    runtime: str  # apptainer, pyxis or oci
    image: str
    mounts: tuple[str, ...]  # SRC:DST[:ro], the automatic ones included
    python: str  # the interpreter inside the image
    options: tuple[str, ...]


@record
class TrackingSettings:
    """Which trackers get their defaults (``orchestrator.node.tracking``); plan turns one off when the
    user set its variables already (the spec's env, or the submitting shell)."""

    wandb: bool
    tensorboard: bool
    mlflow: bool


@record
class Payload:
    """Every fact a rank, the local supervisor and the SLURM agent take from the spec, resolved."""

    version: int
    job_name: str
    entrypoint: str  # ``pkg.module:function``, or an absolute path to a script
    argv: tuple[str, ...]
    strategy: str
    nodes: int
    ranks_per_node: int
    backend: str
    init_method: str  # env, tcp or file
    port: Union[int, str]  # a number, or "auto"
    interface: Optional[str]  # names, "auto" (SLURM: the one routing to the master) or "lo" locally
    rendezvous_dir: str
    init_timeout_s: float
    collective_timeout_s: float
    devices: Optional[tuple[int, ...]]
    run_dir: str
    checkpoint: CheckpointSettings
    max_requeues: int
    requeue: str  # auto, always, never
    stop_signal: str  # the time limit's notice on SLURM: SIGUSR2 or SIGUSR1
    signal_margin_s: int  # SLURM: how long before the time limit the notice comes
    stop_grace_s: float  # SIGTERM, then this long before SIGKILL (cancel, local timeout)
    grad_compression: str
    env: dict[str, str]  # the job's variables: defaults, then the spec's env (which wins)
    workdir: str
    source_dir: str
    watchdog: WatchdogSettings
    recovery: RecoverySettings
    python: str  # the interpreter the ranks run
    run_id: str  # ORCH_RUN_ID: the run's identity (a sweep point's adds its index); the same on every attempt
    tracking: TrackingSettings
    framework: Optional[str]  # lightning, fabric, accelerate, transformers (orchestrator.node.frameworks)
    container: Optional[ContainerSettings] = None  # None: the ranks run on the host
    code: Optional[CodeSettings] = None  # None: the ranks import the live files (code.snapshot: false)
    srun: Optional[tuple[str, ...]] = None  # SLURM: what the job's agent runs
    rank_log: Optional[str] = None  # SLURM: srun's --output pattern (%j %A %a %t)

    def __post_init__(self) -> None:
        if self.version != PAYLOAD_VERSION:
            raise PayloadError(f"this payload is version {self.version}; this orchestrator reads version "
                               f"{PAYLOAD_VERSION}: plan and submit the job again with this version")

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def for_point(self, index: int, argv: list[str], run_dir: str) -> Payload:
        """The payload of one sweep point: its arguments, its folder, its own checkpoints, its own
        run id (so each point is its own tracker run)."""
        ckpt = lean_record.replace(self.checkpoint, dir=os.path.join(self.checkpoint.dir, f"point-{index:04d}"))
        return lean_record.replace(self, argv=tuple(argv), run_dir=run_dir, checkpoint=ckpt,
                                   run_id=f"{self.run_id}-point-{index:04d}")

    def to_dict(self) -> dict[str, Any]:
        return dict(lean_record.as_dict(self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "the payload") -> Payload:
        if not isinstance(data, Mapping):
            raise PayloadError(f"{where} is not a JSON object")
        version = data.get("version")
        if version != PAYLOAD_VERSION:
            raise PayloadError(f"{where} is version {version!r}; this orchestrator reads version {PAYLOAD_VERSION}: "
                               "plan and submit the job again with this version")
        names = set(lean_record.field_names(cls)) | ({"extra"} if data.get("extra") == {} else set())
        required = set(lean_record.required_names(cls))
        missing, unknown = sorted(required - set(data)), sorted(set(data) - names)
        if missing or unknown:
            raise PayloadError(f"{where} does not match this orchestrator's version {PAYLOAD_VERSION}"
                               + (f"; missing: {', '.join(missing)}" if missing else "")
                               + (f"; unknown: {', '.join(unknown)}" if unknown else "")
                               + ": plan and submit the job again")
        values = dict(data)
        if values.get("extra") == {}:
            del values["extra"]  # a field written empty until 2026-12-06, never read: a queued job's payload still loads
        try:
            values["argv"] = tuple(values["argv"])
            values["devices"] = None if values["devices"] is None else tuple(values["devices"])
            values["srun"] = None if values.get("srun") is None else tuple(values["srun"])
            values["checkpoint"] = CheckpointSettings(**values["checkpoint"])
            values["watchdog"] = WatchdogSettings(**values["watchdog"])
            rec = dict(values["recovery"])
            rec["on"] = tuple(rec["on"])
            rec["node_check"] = None if rec.get("node_check") is None else tuple(rec["node_check"])
            values["recovery"] = RecoverySettings(**rec)
            values["code"] = None if values.get("code") is None else CodeSettings(**values["code"])
            values["container"] = None if values.get("container") is None else ContainerSettings(
                **{**values["container"], "mounts": tuple(values["container"]["mounts"]),
                   "options": tuple(values["container"]["options"])})
            values["tracking"] = TrackingSettings(**values["tracking"])
            values["env"] = dict(values["env"])
        except (TypeError, KeyError) as exc:
            raise PayloadError(f"{where} has a malformed field ({exc}): plan and submit the job again") from None
        return cls(**values)

    @classmethod
    def load(cls, path: str | Path) -> Payload:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise PayloadError(f"cannot read the job payload {path}: {exc}") from None
        return cls.from_dict(data, where=f"the job payload {path}")

    def write(self, path: str | Path) -> None:
        """The one writer of payload files (the run's, each sweep point's, the local supervisor's
        per-point copy): atomically, as JSON, in the format ``from_dict`` reads."""
        from orchestrator.core.atomic_files import write_json_atomic

        write_json_atomic(Path(path), self.to_dict())
