"""The typed job spec: what a user writes in YAML, and every cross-field check.

Models are frozen and refuse unknown keys. Each field has a description, which becomes the
JSON schema (``orchestrator schema``) and therefore editor completion. Checks raise
``ValueError`` with the fix in the message; ``loading.py`` turns them into ``SpecError``.
"""

from __future__ import annotations

import math
import re
import weakref
from datetime import date
from functools import partial
from itertools import product
from typing import Annotated, Any, Callable, ClassVar, Literal, Union

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, WithJsonSchema,
                      field_validator, model_validator)

from orchestrator.spec import validators as v
from orchestrator.backends.kinds import KINDS, Kind
from orchestrator.core.payload import Defaults

Scalar = Union[str, int, float, bool]


def _known_executor(name: str) -> str:
    """A spec's ``executor``: a backend the registry knows (``backends.kinds.KINDS``)."""
    if name not in KINDS:
        raise ValueError(f"unknown executor {name[:40]!r}: use {', '.join(list(KINDS)[:-1])} or {list(KINDS)[-1]}")
    return name


#: A backend's name, as the registry knows it (``backends.kinds``: a new backend is added there).
ExecutorName = Annotated[str, AfterValidator(_known_executor), WithJsonSchema({"type": "string", "enum": list(KINDS)})]

#: sbatch options the orchestrator sets itself; `slurm.extra_sbatch` may not override them.
RESERVED_SBATCH = frozenset({
    "job-name", "nodes", "ntasks", "ntasks-per-node", "gpus-per-node", "gpus", "gres",
    "cpus-per-task", "mem", "time", "partition", "account", "qos", "constraint",
    "exclusive", "output", "error", "open-mode", "array", "signal", "wrap", "chdir",
    "export", "wckey", "nodelist", "exclude", "reservation",
    "mem-per-cpu", "mem-per-gpu", "cpus-per-gpu",
    # Options that would change the task layout, the requeue behaviour or how sbatch
    # answers (submission must get a job id back, at once).
    "gpus-per-task", "ntasks-per-gpu",
    "requeue", "no-requeue", "wait", "test-only", "parsable", "help", "usage", "version",
    # What a job waits for: the spec's after: (orchestrator.spec.after), resolved at submission.
    "dependency", "kill-on-invalid-dep",
})
#: Most items a list or mapping field may hold (arguments, setup lines, sbatch options).
MAX_ITEMS = v.MAX_SWEEP_POINTS

#: Every field that names a place on the machine the job runs on, where '~' means that machine's
#: home: the one list. Validating a spec expands '~' in them for this machine's user (runs_dir
#: keeps its text, which names the run id, and is expanded when planned). A spec validated with
#: the context ``{HOME_ELSEWHERE: True}`` (``loading.load_spec(..., home_elsewhere=True)``, what
#: ``--remote`` sends) keeps '~' as written and unchecked in each, so the login node's own
#: validation expands it for the login user: ``~/ckpt`` is the cluster's home, never the laptop's.
#: Fields that take no '~' are not listed: slurm.python, container.image and container.mounts
#: (absolute paths; '~' refused), code.ignore_file and code.include/exclude (inside the project,
#: shipped with it), entrypoint (a script of the project, shipped). ``tests/unit/test_remote_paths.py``
#: fails when a field that expands '~' is missing here.
HOME_PATH_FIELDS: tuple[str, ...] = ("runs_dir", "workdir", "checkpoint.dir", "distributed.rendezvous_dir")
#: The validation context's key saying that '~' in HOME_PATH_FIELDS is another machine's home.
HOME_ELSEWHERE = "home_elsewhere"


def _home_path(value: str, field: str, info: ValidationInfo, *, expand: bool = True, run_folder: bool = True) -> str:
    """One of HOME_PATH_FIELDS, checked: '~' expanded here (unless ``expand`` is false), or kept
    as written when the spec is validated for another machine (``HOME_ELSEWHERE``). ``run_folder``:
    a folder the job names its logs after, where '%' is refused (``validators.local_path``)."""
    if field not in HOME_PATH_FIELDS:
        raise AssertionError(f"{field} is not in HOME_PATH_FIELDS")  # the list is the one place: keep it whole
    elsewhere = home_elsewhere(info)
    return v.local_path(value, field, expand=expand and not elsewhere, home_elsewhere=elsewhere, run_folder=run_folder)


def home_elsewhere(info: ValidationInfo) -> bool:
    """Whether this validation is for another machine (``HOME_ELSEWHERE``): checks of this
    machine's disk then say nothing about where the job runs."""
    return isinstance(info.context, dict) and bool(info.context.get(HOME_ELSEWHERE))


def _check_texts(value: Any, what: str) -> None:
    """Apply the one string rule (validators.text) to every string in a field, keys included."""
    if isinstance(value, str):
        v.text(value, what)
    elif isinstance(value, (list, tuple)):
        if len(value) > MAX_ITEMS:
            raise ValueError(f"{what} has {len(value)} items; the limit is {MAX_ITEMS}")
        for i, item in enumerate(value):
            _check_texts(item, f"{what}[{i}]")
    elif isinstance(value, dict):
        if len(value) > MAX_ITEMS:
            raise ValueError(f"{what} has {len(value)} entries; the limit is {MAX_ITEMS}")
        for key, item in value.items():
            _check_texts(key, f"the key of {what}")
            _check_texts(item, f"{what}.{key}")


#: The JobSpecs validated for this machine (by their constructor or ``loading.spec_from_dict``), by id
#: (a weak reference each, so a collected spec's id is never mistaken for a new one): ``api.as_spec``
#: takes them as they are. A copy (``model_copy(update=...)``, never checked) is not among them.
_VALIDATED: dict[int, weakref.ref[JobSpec]] = {}


def mark_validated(spec: JobSpec) -> JobSpec:
    """Record that ``spec`` was validated for this machine (not for another: ``HOME_ELSEWHERE``)."""
    key = id(spec)
    _VALIDATED[key] = weakref.ref(spec, lambda _ref: _VALIDATED.pop(key, None))
    return spec


def is_validated(spec: object) -> bool:
    """Whether ``spec`` is a JobSpec validated for this machine, as it is now."""
    ref = _VALIDATED.get(id(spec))
    return ref is not None and ref() is spec


class _Model(BaseModel):
    """Strict: no coercion (``nodes: true`` and ``nodes: "2"`` are refused, not converted; only
    ``distributed.port``, a field that also takes ``'auto'``, reads its digits as text), no NaN or infinity, no unknown keys, and every string obeys
    ``validators.text``."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, strict=True,
                              allow_inf_nan=False)
    #: The check of ``validators`` that normalises a field's value (when set), by field name: it
    #: runs right after the text rule, so a control character is named as such first.
    _CHECKS: ClassVar[dict[str, Callable[[str], str]]] = {}

    def __init__(self, /, **data: Any) -> None:
        """``JobSpec(nodes='2')`` raises SpecError (an OrchestratorError), formatted as load_spec
        formats it, not pydantic's ValidationError."""
        try:
            super().__init__(**data)
        except ValidationError as exc:
            from orchestrator.spec.spec_data import spec_error

            raise spec_error(exc, data, type(self)) from None
        if isinstance(self, JobSpec):
            mark_validated(self)

    # Only a direct call runs the wrapper: pydantic validates nested models and model_validate()
    # as for its own __init__ (so spec_from_dict still sees every error with its full location).
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @field_validator("*", mode="after")
    @classmethod
    def _texts(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, BaseModel):
            _check_texts(value, info.field_name or "value")
        check = cls._CHECKS.get(info.field_name or "")
        return value if value is None or check is None else check(value)


def _scalar(value: Any, what: str, alone: bool = False) -> Any:
    """An argument value: text, a number or true/false (YAML's dates and nulls are refused).
    ``alone``: ``what`` ('args.lr') holds this one value, not a list of them, so the hint can show
    how to quote it in the file and with --set."""
    if isinstance(value, (int, str)):  # bool is an int
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{what} is {value}; give a finite number")
        return value
    if value is None and alone:
        raise ValueError(f"{what} is null (empty): give it a value, or quote an empty text: "
                         f"{quoted_forms(what, value)}")
    if value is None or type(value).__name__ in ("date", "datetime"):
        hint = f" (quote it: {quoted_forms(what, value)})" if alone else " (quote it in YAML)"
    else:
        hint = ""
    raise ValueError(f"{what} must be text, a number or true/false, got {type(value).__name__}{hint}")


def quoted_forms(path: str, value: Any) -> str:
    """How to give ``value``, a scalar YAML did not read as text (a number, true/false, a date,
    null: none holds a quote), as text at ``path`` ('env.FOO'), in a spec file and with --set:
    ``FOO: '1' in YAML, --set "env.FOO='1'" on the command line``."""
    text = "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return f"{path.rsplit('.', 1)[-1]}: '{text}' in YAML, --set \"{path}='{text}'\" on the command line"


def render_value(value: Any, bools: str = "flag") -> list[str]:
    """How one argument value appears after '--key' on the command line. ``bools`` is the spec's
    ``bool_args``: 'flag' gives nothing for true (the flag alone), 'value' gives 'true'/'false'."""
    if isinstance(value, bool):
        return [] if bools == "flag" else ["true" if value else "false"]
    if isinstance(value, list):
        return [str(x).lower() if isinstance(x, bool) and bools == "value" else str(x) for x in value]
    return [str(value)]


class DistributedSpec(_Model):
    """How the ranks find each other."""

    backend: Literal["auto", "nccl", "gloo"] = Field(
        Defaults.BACKEND, description="Process-group backend. 'auto' is nccl when the job has GPUs, else gloo.")
    init_method: Literal["env", "tcp", "file"] = Field(
        "env", description="Rendezvous: 'env' (env://, MASTER_ADDR/MASTER_PORT), 'tcp' "
        "(tcp://master:port) or 'file' (a shared file).")
    port: Union[Literal["auto"], int] = Field(
        "auto", description="Master port. 'auto' derives it from the job id and restart count, "
        "outside the ephemeral range.")
    rendezvous_dir: str | None = Field(
        None, description="Directory for file:// rendezvous files; it must be visible to every node. "
        "Default: the run folder.")
    rendezvous_dir_is_shared: bool = Field(
        False, description="Declare that rendezvous_dir (or the run folder) is shared between nodes even "
        "though its path looks node-local (/tmp, /dev/shm ...), e.g. when all nodes are one host.")
    interface: Union[str, list[str]] = Field(
        "auto", description="Network interface for NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME: 'auto' (the "
        "interface that routes to the master), a name such as 'eth0', or a list of names.")
    init_timeout_s: float = Field(
        Defaults.INIT_TIMEOUT_S, gt=0, le=v.MAX_TIMEOUT_S,
        description="Seconds to wait for every rank to join. The orchestrator enforces it for any script: a rank "
        "whose init_process_group has not returned by then ends the job FAILED, naming the ranks that never "
        "called it, with every rank's stack saved in <run folder>/stacks/.")
    collective_timeout_s: float = Field(Defaults.COLLECTIVE_TIMEOUT_S, gt=0, le=v.MAX_TIMEOUT_S,
                                        description="Seconds a single collective may take before the job fails.")
    grad_compression: Literal["none", "fp16", "bf16"] = Field(
        Defaults.GRAD_COMPRESSION,
        description="DDP gradient compression for jobs built on the rank API (jobs.wrap_model): 'fp16' or "
        "'bf16' halve the bytes all-reduced, for bandwidth-bound multi-node jobs; 'none' is exact.")
    nccl_async_error_handling: bool = Field(
        True, description="nccl jobs: TORCH_NCCL_ASYNC_ERROR_HANDLING=1, so a failed or timed-out collective ends "
        "the rank instead of hanging it. Free while nothing is wrong.")
    nccl_flight_recorder: bool = Field(
        True, description="nccl jobs: PyTorch's NCCL flight recorder (TORCH_FR_BUFFER_SIZE=2000) with a dump on "
        "timeout into <run folder>/nccl-trace/ (TORCH_NCCL_DUMP_ON_TIMEOUT=1, TORCH_FR_DUMP_TEMP_FILE).")

    @field_validator("port", mode="before")
    @classmethod
    def _port(cls, value: Any) -> Any:
        if value == "auto":
            return value
        if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 5:
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"expected 'auto' or a port number, got {v.shown(value)}")
        return v.port(value)

    @field_validator("rendezvous_dir")
    @classmethod
    def _rdir(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else _home_path(value, "distributed.rendezvous_dir", info)

    @field_validator("interface")
    @classmethod
    def _interface_list(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list):
            if not value:
                raise ValueError("the interface list is empty: name at least one, or use 'auto'")
            if len(set(value)) != len(value):
                raise ValueError("the interface list names an interface twice")
        return value

    def interface_names(self) -> list[str]:
        """The interface setting as a list; empty means auto."""
        if self.interface == "auto":
            return []
        return list(self.interface) if isinstance(self.interface, list) else [self.interface]


class CheckpointSpec(_Model):
    """Where and how often rank 0 writes checkpoints."""

    dir: str | None = Field(None, description="Checkpoint directory. Default: <run folder>/checkpoints.")
    interval_steps: int = Field(Defaults.CHECKPOINT_INTERVAL, ge=0,
                                description="Also checkpoint every N optimizer steps; 0 means only at epoch ends.")
    keep_last: int = Field(Defaults.CHECKPOINT_KEEP, ge=1, description="How many checkpoints to keep; older ones are deleted.")
    resume: bool = Field(Defaults.RESUME, description="Resume from the latest checkpoint in dir when one exists.")

    @field_validator("dir")
    @classmethod
    def _dir(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("checkpoint.dir is empty: give a directory, or leave it unset for <run folder>/checkpoints")
        return None if value is None else _home_path(value, "checkpoint.dir", info, run_folder=False)


class SlurmSpec(_Model):
    """Options for the SLURM executor."""

    # The fields that name things sbatch is given (a comma-separated list: several of them) name
    # the field in their error.
    _CHECKS = {
        "mem": v.slurm_memory, "mem_per_cpu": v.slurm_memory, "mem_per_gpu": v.slurm_memory, "constraint": v.constraint,
        "gpu_type": v.gpu_type, "nodelist": v.hostlist, "exclude": v.hostlist,
        **{field: partial(check, what=f"slurm.{field} name") for field, check in (
            ("account", v.safe_name), ("qos", v.safe_name), ("wckey", v.safe_name), ("partition", v.safe_names),
            ("reservation", v.safe_names))}}

    partition: str | None = Field(
        None, description="Partition (sbatch --partition), or a comma-separated list ('gpu,gpu-preempt'): "
        "the job runs in the first that can start it. Default: the cluster's default partition.")
    account: str | None = Field(None, description="Account to charge (sbatch --account).")
    qos: str | None = Field(None, description="Quality of service (sbatch --qos).")
    reservation: str | None = Field(
        None, description="Run in this advance reservation (sbatch --reservation); a comma-separated list "
        "lets SLURM use the first that can start the job.")
    wckey: str | None = Field(
        None, description="Workload characterization key to book the job to (sbatch --wckey). Default: none "
        "(the site's default wckey, where it tracks them).")
    time: str = Field(
        "01:00:00", description="Time limit in any sbatch format: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.")
    mem: str | None = Field(None, description="Memory per node, e.g. '64G' (sbatch --mem). Default: the "
                            "site's (DefMemPerNode, DefMemPerCPU or DefMemPerGPU). One of mem, mem_per_cpu, "
                            "mem_per_gpu.")
    mem_per_cpu: str | None = Field(None, description="Memory per allocated CPU, e.g. '4G' (sbatch --mem-per-cpu).")
    mem_per_gpu: str | None = Field(
        None, description="Memory per allocated GPU, e.g. '64G' (sbatch --mem-per-gpu). Needs gpus_per_node.")
    cpus_per_task: int | None = Field(
        None, ge=1, description="CPUs per rank (sbatch and the ranks' srun --cpus-per-task; with strategy dp, "
        "per GPU of the node's one rank); raise it for DataLoader workers. Default: not asked for, so the site's "
        "defaults decide the CPUs of each node (DefCpuPerGPU; DefMemPerCPU then counts them), and the job's agent "
        "gives each rank an equal share of its node's granted CPUs (SLURM_CPUS_ON_NODE / ranks per node, at "
        "least 1), for srun --cpus-per-task and OMP_NUM_THREADS.")
    cpus_per_gpu: int | None = Field(
        None, ge=1, description="CPUs per allocated GPU (sbatch --cpus-per-gpu); needs gpus_per_node, and "
        "excludes cpus_per_task. Each rank gets its share of its node's CPUs, as without either.")
    constraint: str | None = Field(None, description="Node features, e.g. 'a100&ib' (sbatch --constraint).")
    exclusive: bool = Field(False, description="Do not share nodes with other jobs (sbatch --exclusive).")
    setup: list[str] = Field(
        default_factory=list, description="Shell lines run in the batch script before the ranks start (module load, "
        "source venv/bin/activate). These are shell by design and run as written.")
    signal_margin_s: int = Field(
        120, ge=10, le=3600,
        description="Seconds before the time limit at which SLURM sends slurm.signal, so ranks can checkpoint.")
    signal: Literal["USR1", "USR2"] = Field(
        "USR2", description="The time limit's advance notice (sbatch --signal=B:SIG@margin), forwarded to every rank: "
        "USR2 (the rank API listens for it), or USR1 for Lightning's own SLURM requeue (SLURMEnvironment's "
        "requeue_signal). A rank with no handler for it runs on to the time limit, as under plain sbatch.")
    max_requeues: int = Field(3, ge=0, le=1000, description="How many times a preempted or timed-out job is requeued.")
    requeue: Literal["auto", "always", "never"] = Field(
        "auto",
        description="When slurm.signal arrives (signal_margin_s before the time limit, or on preemption): 'auto' "
        "requeues once the ranks checkpointed through the rank API (jobs/); 'always' requeues any script "
        "once its ranks have ended or the margin is nearly spent (for a script that resumes from its own "
        "snapshot); 'never' lets the job end.")
    assume_shared_paths: bool = Field(
        False, description="Declare that runs_dir and checkpoint.dir are shared by the submitting host and every "
        "node though their paths look node-local (/tmp, /var/tmp, /dev/shm ...): e.g. a cluster whose nodes "
        "all run on one host.")
    python: str | None = Field(
        None, description="Python executable on the compute nodes (one path, quoted in the script; "
        "use setup for wrappers). Default: the interpreter that submits.")
    gpu_type: str | None = Field(
        None, description="GPU type as the cluster's GRES names it (e.g. 'a100'): the job asks for "
        "--gpus-per-node=TYPE:N instead of --gpus-per-node=N. Needs gpus_per_node.")
    nodelist: str | None = Field(
        None, description="Run on these nodes (sbatch --nodelist), a SLURM host list: 'gpu[01-04]'.")
    exclude: str | None = Field(
        None, description="Never run on these nodes (sbatch --exclude), a SLURM host list: 'gpu07,gpu[10-12]'.")
    extra_sbatch: dict[str, Union[str, int, bool]] = Field(
        default_factory=dict, description="Further sbatch options by long name, e.g. {'mail-type': 'END'}. Options the "
        "orchestrator sets itself are refused.")

    @field_validator("time", mode="before")
    @classmethod
    def _time_text(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            raise ValueError(f"got the number {value}; YAML reads an unquoted time such as 12:00:00 as a number "
                             "(base 60), so quote it: time: '12:00:00' (or '60' for 60 minutes)")
        return value

    @field_validator("time")
    @classmethod
    def _time(cls, value: str) -> str:
        v.slurm_time_minutes(value)
        return value

    @field_validator("python")
    @classmethod
    def _python(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.strip() or value != value.strip():
            raise ValueError(f"{v.shown(value)} is not a Python executable: give an absolute path such as "
                             "'/opt/venv/bin/python', or leave it unset to use the submitting interpreter")
        if value.startswith("~"):
            raise ValueError(f"{v.shown(value)}: '~' is not expanded (the path is quoted); write the absolute path")
        if value.startswith("-"):
            raise ValueError(f"{v.shown(value)} starts with '-', so srun would read it as an option of its own, not "
                             "as the interpreter; give the interpreter's absolute path ('/opt/venv/bin/python') or "
                             "its name ('python3')")
        if not value.startswith("/") and not re.fullmatch(r"[A-Za-z0-9_.+\-]+", value):
            raise ValueError(f"{v.shown(value)} is neither an absolute path nor a command name such as 'python3'; "
                             "it is one executable, quoted in the script (put wrappers and modules in slurm.setup)")
        return value

    @field_validator("extra_sbatch")
    @classmethod
    def _extra(cls, value: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, item in value.items():
            norm = v.sbatch_option(key, RESERVED_SBATCH)
            if norm in out:
                raise ValueError(f"{key!r} names the option {norm!r} twice ('_' and '-' are the same)")
            if item is False:
                continue
            out[norm] = item
        return out

    @property
    def time_minutes(self) -> int:
        return v.slurm_time_minutes(self.time)


class LocalSpec(_Model):
    """Options for the local executor (and the debug executor)."""

    devices: list[int] | None = Field(
        None, description="GPU indices this machine may use; split among the local ranks. "
        "Default: none (CPU, gloo).")
    emulate_nodes: int | None = Field(
        None, ge=1, le=v.MAX_LOCAL_RANKS, description="How many nodes to emulate. Default: the spec's nodes "
        f"(at most {v.MAX_LOCAL_RANKS} ranks run locally in all).")
    ranks_per_node: int | None = Field(
        None, ge=1, le=v.MAX_LOCAL_RANKS, description="Ranks per emulated node. Default: GPUs per node, capped at 2 on "
        "GPU specs without local.devices so a cluster spec stays runnable on a laptop.")
    timeout_s: float | None = Field(None, gt=0, le=v.MAX_TIMEOUT_S, description="Kill the local run after this many seconds.")
    preload_torch: bool = Field(
        True, description="Import torch once in a launcher process and fork the ranks from it (a fast "
        "start on few cores). false starts every rank as a fresh interpreter, exactly as on SLURM.")

    @field_validator("devices")
    @classmethod
    def _devices(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (len(set(value)) != len(value) or any(d < 0 for d in value)):
            raise ValueError("local.devices must be distinct non-negative GPU indices")
        return value


class WatchdogSpec(_Model):
    """What the orchestrator watches while the ranks run (outside the ranks' code)."""

    stall_s: float | None = Field(
        None, gt=0, le=v.MAX_TIMEOUT_S,
        description="End the job FAILED (capturing every rank's stack and naming the straggler) when no rank "
        "has made progress for this many seconds. Progress: a rank API heartbeat (jobs.heartbeat) for a rank "
        "that sends them; for a rank that sends none, new output in its log; joining the process group counts "
        "too. The clock runs once every rank is past its start: joined its process group, or sent a heartbeat "
        "(before that, distributed.init_timeout_s bounds the start). The straggler is the rank whose stack is not inside a "
        "torch.distributed collective, else one that did not answer, else the one that progressed least "
        "recently. Default: off.")
    stacks_on_failure: bool = Field(
        True, description="On an abnormal end (a rank failed, a timeout, the init deadline, a stall, the time limit "
        "with no requeue left) save the stacks of the ranks still alive in <run folder>/stacks/ first.")
    straggler_factor: float = Field(
        1.5, gt=1, le=100,
        description="Name a rank the straggler (in status and top) when the time it spends outside collectives "
        "each step (data, forward: the rank API's heartbeat busy_s, which jobs.train reports) is at least this "
        "many times the other ranks' median. In a synchronous job every rank's step rate falls to the slowest's, "
        "so the rate cannot tell; this can. Scripts that report no busy_s get none named.")
    straggler_window_s: float = Field(
        30.0, gt=0, le=v.MAX_TIMEOUT_S,
        description="The window a straggler is judged over when recovery.on lists straggler: a rank whose time "
        "outside collectives, averaged over it, is straggler_factor times the others' median (and still the slower "
        "at the last look) is a failure of kind 'straggler': the attempt ends and, on SLURM, its node is blamed and "
        "replaced by a spare inside the job (locally every rank restarts in a new process).")


RecoveryKind = Literal["crash", "node_failure", "hang", "unhealthy", "straggler"]
RECOVERY_KINDS: tuple[RecoveryKind, ...] = ("crash", "node_failure", "hang", "unhealthy")  # the default: not straggler


class RecoverySpec(_Model):
    """Surviving failures without a human: the health gate before every attempt, and restarts
    after a crash, a lost node, a hang or an unhealthy node (``orchestrator.core.recovery``).
    Time-limit requeues stay under slurm.requeue and slurm.max_requeues, counted apart."""

    max_restarts: int = Field(
        0, ge=0, le=1000,
        description="Automatic restarts after a failure (locally the ranks restart in place; on SLURM the ranks' "
        "step restarts inside the job, or the job is requeued without the nodes blamed: recovery.in_allocation). "
        "0 turns restarts off (the default).")
    spares: int = Field(
        0, ge=0, le=1000,
        description="SLURM: extra nodes held in the allocation (sbatch asks for nodes + spares). The ranks run on "
        "`nodes` of them, the health gate checks all of them, and a node blamed for a failure (or lost) is "
        "replaced by a healthy spare without leaving the job, and given back to SLURM. Locally: nothing to hold.")
    in_allocation: bool = Field(
        True, description="SLURM: restart inside the job: the agent ends the ranks' step and starts a new one on the "
        "same nodes (a blamed node swapped for a spare), with a fresh rendezvous; no requeue, no queue wait. "
        "The job is requeued (without the blamed nodes) only when the allocation has too few healthy nodes "
        "left. false: every restart is a requeue.")
    on: list[RecoveryKind] = Field(
        default_factory=lambda: list(RECOVERY_KINDS),
        description="Which failures restart: crash (a rank failed: a traceback, an exit code, a signal), "
        "node_failure (SLURM lost a node), hang (watchdog.stall_s or distributed.init_timeout_s fired), "
        "unhealthy (the health gate failed on a node), straggler (a rank named the straggler, slower than the "
        "others by watchdog.straggler_factor, for watchdog.straggler_window_s: its node is blamed and, with a "
        "spare, replaced inside the job). Default: the first four; straggler is off unless listed.")
    exclude_failed_nodes: bool = Field(
        True, description="SLURM: a node blamed for a failure (the health gate, a node failure, a rank killed by a "
        "hardware-like signal there, a hung rank not inside a collective) is excluded from later attempts. "
        "A Python traceback is the code's fault and excludes nothing.")
    health_check: bool = Field(
        True, description="Before any rank starts, on every attempt, check every node: the run and checkpoint "
        "folders are writable and shared, free disk, the interface exists, the GPUs were granted, node_check "
        "passes. A failing node is named with its reason in status.")
    node_check: list[str] | None = Field(
        None, min_length=1, max_length=MAX_ITEMS,
        description="A site command (argv list, never read by a shell) the health gate runs on every node; "
        "a non-zero exit marks the node unhealthy. It sees ORCH_HEALTH_NODE=<node>.")
    survivors: Literal["restart", "keep"] = Field(
        "restart",
        description="What a crash of some ranks does to the others. restart (the default): every rank starts "
        "again and the script resumes from its checkpoint. keep: the survivors keep their process and their "
        "state; only the failed ranks are forked again, and a script on the rank API (jobs.Healer; jobs.train "
        "does it) rejoins a fresh process group with them and hands them its model, optimizer and step by "
        "broadcast: no checkpoint read, at most the step in flight redone. Each one is an attempt in "
        "recovery.json and counts against max_restarts. On SLURM a replaced rank runs as a step of its own on "
        "its node, inside the job (in_allocation); a lost node or a hang still restarts every rank there.")
    standbys: bool = Field(
        True,
        description="SLURM: once the ranks train, a warm interpreter of ours waits on each of the job's nodes (its "
        "spares included) with torch imported, as a step of one task beside the ranks'. A restart inside the job "
        "(in_allocation) forks the next attempt's ranks from them instead of starting a new step in which every "
        "rank imports torch again, and with survivors: keep a replaced rank is forked from its node's. Costs one "
        "idle interpreter per node (a few hundred MB). Not used for ranks in a container or an nccl job yet. "
        "false: every restart starts a new step.")
    stop_without_progress: int = Field(
        2, ge=1, le=1000,
        description="Stop with reason 'no progress' after this many attempts in a row ended by a failure "
        "without a new checkpoint (a new or changed file under checkpoint.dir).")

    @field_validator("on")
    @classmethod
    def _on(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("is empty: list the failures that restart (crash, node_failure, hang, unhealthy), "
                             "or set recovery.max_restarts: 0 to turn restarts off")
        if len(set(value)) != len(value):
            raise ValueError("names a failure twice")
        return value

    @model_validator(mode="after")
    def _spares_need_restarts(self) -> RecoverySpec:
        if self.spares and not self.max_restarts:
            raise ValueError(f"spares: {self.spares} holds nodes only a restart can use, and max_restarts is 0: set "
                             "recovery.max_restarts (e.g. 2), or spares: 0")
        return self

    @field_validator("node_check")
    @classmethod
    def _node_check(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value[0].strip():
            raise ValueError("starts with an empty program name: give the command's path, e.g. "
                             "['/usr/local/sbin/gpu-burn-check', '--quick']")
        return value


class CodeSpec(_Model):
    """The code snapshot (``orchestrator.code.snapshot``): what the ranks import, frozen at run/submit."""

    snapshot: bool = Field(
        True, description="Freeze the job's code when it is run or submitted: the git work tree's tracked files and "
        "the untracked files git does not ignore that are code (outside git, the code of the entrypoint's "
        "folder): Python and C/CUDA sources, and configuration files (.yaml, .json, .toml, .cfg, .txt...) up "
        "to 1 MB; never outputs, logs, datasets, hidden folders or run folders. What is left out stays "
        "reachable at the same place beside the frozen files. Stored "
        "content-addressed under <runs_dir>/.code. The ranks import from the snapshot on every attempt, "
        "requeues included, so edits made after submitting never reach a queued or requeued job. false: the "
        "ranks import the live files.")
    max_mb: float = Field(
        200, gt=0, le=100_000,
        description="Refuse a snapshot larger than this many MB (data or weights in the tree belong elsewhere: "
        "list them in the ignore file).")
    ignore_file: str = Field(
        ".orchignore",
        description="A file at the project's root whose lines (gitignore-style: '#' comments, '*' globs, a "
        "trailing '/' for folders, a '/' inside anchors at the root, '!pattern' takes a path back in, the last "
        "match wins) leave paths out of the snapshot.")

    include: list[str] = Field(
        default_factory=list,
        description="Patterns (gitignore-style, as the ignore file) of files to freeze although the rule leaves "
        "them out (untracked files that are not sources or configuration, or are under an output or hidden "
        "folder), e.g. ['assets/*.bin', 'prompts/'].")
    exclude: list[str] = Field(
        default_factory=list,
        description="Patterns (gitignore-style) of files never to freeze, tracked ones included, like the "
        "ignore file's lines ('!pattern' takes a path back). Left out is never lost: the ranks find it live, "
        "at the same place.")

    @field_validator("include", "exclude")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not pattern.strip() or ".." in pattern.split("/"):
                raise ValueError(f"{pattern!r} is not a pattern inside the project; write e.g. 'data/' or '*.bin'")
        return value

    @field_validator("ignore_file")
    @classmethod
    def _ignore_file(cls, value: str) -> str:
        if not value or value.startswith("/") or ".." in value.split("/"):
            raise ValueError("must be a path relative to the project's root, e.g. .orchignore")
        return value


class ContainerSpec(_Model):
    """Run every rank inside a container (``orchestrator.node.container``). The job's agent stays on the
    host (it needs srun and scontrol); only the rank command is wrapped."""

    runtime: Literal["apptainer", "pyxis", "oci"] = Field(
        description="apptainer: 'apptainer exec' around each rank. pyxis: srun's --container-image (SLURM with "
        "the pyxis plugin; enroot images). oci: SLURM's own 'srun --container' (SLURM >= 21.08 with oci.conf and "
        "runc; one rank per node); image is an OCI bundle folder. The local and debug executors run the ranks on "
        "the host.")
    image: str = Field(
        description="apptainer: a .sif file or a docker:// / oras:// URI. pyxis: an image name "
        "(nvcr.io#nvidia/pytorch:24.05-py3) or a .sqsh file. oci: the bundle folder (config.json and rootfs/), "
        "readable on every node.")
    mounts: list[str] = Field(
        default_factory=list,
        description="Host folders to bind inside, 'SRC:DST' or 'SRC:DST:ro' (SRC absolute; no ',' in either, as "
        "apptainer and pyxis read one list). The run folder, the code snapshot and the orchestrator's own package are "
        "bound automatically.")
    python: str = Field(
        "python3",
        description="The interpreter inside the image that runs each rank (it needs Python >= 3.10; the rank "
        "entry uses the standard library only, the user's code whatever the image has).")
    options: list[str] = Field(
        default_factory=list,
        description="Extra options for the runtime, as written: apptainer exec's (['--writable-tmpfs']; not "
        "--cleanenv or --containall, which hide SLURM's variables from the ranks) or srun's pyxis options "
        "(['--container-writable']). Options the orchestrator sets itself are refused, in any form (--container-image, "
        "--container-mounts, --container-workdir, srun's --output, --ntasks...): set the spec's field instead.")

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        """Never a word starting with '-': apptainer (``apptainer exec [options] IMAGE ...``) would
        read it as an option of its own, and no image is named so."""
        if not value.strip():
            raise ValueError("is empty: give the image (a .sif path, a registry name or an OCI bundle folder)")
        if value.startswith("-"):
            raise ValueError(f"{v.shown(value)} starts with '-', so apptainer would read it as an option of its own, "
                             "not as the image; give the image's absolute path, e.g. '/images/torch.sif'")
        return value

    @field_validator("python")
    @classmethod
    def _python(cls, value: str) -> str:
        """One argv word, never read by a shell: 'python3 -u' would make the runtime look for a program
        of that whole name, and '-x' would be read as an option; so an absolute path or a command name."""
        if not value.strip():
            raise ValueError("is empty: give the image's interpreter, e.g. 'python3' or '/opt/conda/bin/python'")
        if any(ch.isspace() for ch in value):
            raise ValueError(f"{v.shown(value)} holds whitespace, but it is one executable (the rank's argv[0], never "
                             "read by a shell), so the runtime would look for a program of that whole name; give the "
                             "interpreter alone ('python3' or '/opt/conda/bin/python': the orchestrator adds its own "
                             "arguments), and put variables in env")
        if value.startswith("-"):
            raise ValueError(f"{v.shown(value)} starts with '-', so it would be read as an option, not as the "
                             "interpreter; give its absolute path or its name, e.g. 'python3'")
        if value.startswith("~"):
            raise ValueError(f"{v.shown(value)}: '~' is not expanded inside the image; write the absolute path")
        if not value.startswith("/") and not re.fullmatch(r"[A-Za-z0-9_.+][A-Za-z0-9_.+\-]{0,127}", value):
            raise ValueError(f"{v.shown(value)} is neither an absolute path nor a command name such as 'python3'")
        return value

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, value: list[str]) -> list[str]:
        for item in value:
            parts = item.split(":")
            if len(parts) not in (2, 3) or not parts[0].startswith("/") or not parts[1].startswith("/") \
                    or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
                raise ValueError(f"{v.shown(item)} is not 'SRC:DST' or 'SRC:DST:ro' with absolute paths, e.g. "
                                 "'/scratch/data:/data:ro'")
        return value


class AfterSpec(_Model):
    """A run this job waits for (``orchestrator.front.pipeline``)."""

    run: str = Field(description="The run it waits for: a run id (<name>-<hash>, as `orchestrator list` shows it) "
                     "or the path of that run's spec file.")
    when: Literal["ok", "any", "notok"] = Field(
        "ok", description="ok: start after it completed (and never, if it fails: this job is cancelled). any: after "
        "it ended in any state. notok: only if it failed (a cleanup or report job).")


class TrackingSpec(_Model):
    """Experiment trackers' defaults (``orchestrator.node.tracking``): one tracker run per orchestrator run,
    across attempts, requeues and restarts. A variable the spec's env (or the submitting shell) sets wins."""

    wandb: bool = Field(True, description="Set WANDB_RUN_ID (from ORCH_RUN_ID), WANDB_RESUME=allow and WANDB_DIR "
                        "(<run folder>/wandb). Offline runs (WANDB_MODE=offline) are pushed with `orchestrator sync`.")
    tensorboard: bool = Field(True, description="Set ORCH_TENSORBOARD_DIR (<run folder>/tensorboard); "
                              "jobs.MetricsWriter writes TensorBoard events there.")
    mlflow: bool = Field(True, description="Set MLFLOW_TRACKING_URI to a file store under the run folder "
                         "(<run folder>/mlruns) and MLFLOW_EXPERIMENT_NAME to the job name.")


class JobSpec(_Model):
    """One distributed training (or inference) job."""

    _CHECKS = {"name": partial(v.safe_name, what="job name"), "entrypoint": v.entrypoint_syntax}

    name: str = Field(description="Job name: letters, digits, '_', '.', '-'. Names the run folder and the SLURM job.")
    entrypoint: str = Field(
        description="What every rank runs: 'package.module:function' (called with the argument "
        "list) or a path to a script that reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.")
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="Arguments by name without dashes, passed as '--key value' ('--key' alone for true; "
        "false omits it; a list gives '--key a b'). Values are text, numbers or true/false.")
    extra_args: list[str] = Field(
        default_factory=list, description="Arguments appended after args exactly as written, one per item: positional "
        "arguments and short flags (['-v', 'data/']). Never interpreted by a shell.")
    nodes: int = Field(1, ge=1, le=4096, description="Number of nodes.")
    gpus_per_node: int = Field(0, ge=0, le=64, description="GPUs per node; one rank per GPU.")
    cpu_ranks_per_node: int = Field(
        1, ge=1, le=256, description="Ranks per node when gpus_per_node is 0 (CPU training with gloo).")
    strategy: Literal["ddp", "dp"] = Field(
        Defaults.STRATEGY,
        description="'ddp': one process per device. 'dp': DataParallel, one process per node using all its GPUs.")
    distributed: DistributedSpec = Field(default_factory=DistributedSpec, description="Rendezvous and backend.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing.")
    slurm: SlurmSpec = Field(default_factory=SlurmSpec, description="SLURM options.")
    local: LocalSpec = Field(default_factory=LocalSpec, description="Local executor options.")
    sweep: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="Argument name -> values; the job runs once per point of the grid (a SLURM job array).")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables set on every rank, on every executor (NCCL_DEBUG, WANDB_*...). "
        "Values are text, set as written (never read by a shell); they override the orchestrator's "
        "defaults (OMP_NUM_THREADS, the NCCL aids) but not the rank contract (RANK, MASTER_PORT, ORCH_*...).")
    workdir: str | None = Field(
        None, description="The ranks' working directory (relative files the script writes land here). Default: "
        "the directory 'orchestrator run' / 'submit' was called from.")
    watchdog: WatchdogSpec = Field(default_factory=WatchdogSpec, description="Stall watchdog and stack capture.")
    code: CodeSpec = Field(default_factory=CodeSpec, description="The code snapshot the ranks import.")
    recovery: RecoverySpec = Field(default_factory=RecoverySpec,
                                   description="Health gate and automatic restarts after failures.")
    executor: ExecutorName = Field("local", description="Where it runs: local, slurm or debug.")
    stop_grace_s: float = Field(
        Defaults.STOP_GRACE_S, ge=1, le=3600,
        description="After `orchestrator cancel` (and locally local.timeout_s) the ranks get SIGTERM, then this "
        "long to checkpoint and exit before SIGKILL; the default is SLURM's KillWait default. On SLURM a plain "
        "scancel or the time limit uses the site's KillWait instead.")
    runs_dir: str = Field("runs", description="Where run folders are created; must be shared on a cluster.")
    container: ContainerSpec | None = Field(
        None, description="Run the ranks inside a container (apptainer, pyxis or SLURM's OCI support).")
    after: list[AfterSpec] = Field(
        default_factory=list,
        description="Runs this job waits for (SLURM --dependency, with --kill-on-invalid-dep=yes; locally they "
        "must have ended as 'when' asks). `orchestrator pipeline FILE` submits a whole graph.")
    tracking: TrackingSpec = Field(default_factory=TrackingSpec, description="Experiment trackers' defaults.")
    framework: Literal["lightning", "fabric", "accelerate", "transformers"] | None = Field(
        None, description="The training framework the entrypoint uses: each rank gets what that framework's own "
        "launcher would export, and the spec's shape is checked against the framework's settings in args.")
    bool_args: Literal["flag", "value"] = Field(
        "flag", description="How true/false in args are passed. flag: '--key' for true, nothing for false (argparse "
        "store_true). value: '--key true' / '--key false' (jsonargparse, LightningCLI, HfArgumentParser). One "
        "argument can always be passed as text instead: key: 'false'.")

    @field_validator("args")
    @classmethod
    def _args(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key, item in value.items():
            v.arg_name(key, "args key")
            items = item if isinstance(item, list) else [item]
            if isinstance(item, list) and not item:
                raise ValueError(f"args.{key} is an empty list: give values, or remove the key")
            for x in items:
                if isinstance(x, list):
                    raise ValueError(f"args.{key}: a list may hold only text, numbers or true/false, not lists")
                _scalar(x, f"args.{key}", alone=not isinstance(item, list))
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        """Every value text (YAML's 1 or true is refused, not turned into '1'), every name and value
        one the ranks' environment can hold; anything else than a mapping of text is pydantic's to refuse."""
        if isinstance(value, dict):
            for name, item in value.items():
                if isinstance(name, str):
                    v.env_name(name)
                if not isinstance(item, str):
                    what = "null (empty)" if item is None else v.shown(item)
                    how = quoted_forms(f"env.{name}", item) if isinstance(item, (int, float, date, type(None))) \
                        else "NAME: '1' in YAML"
                    raise ValueError(f"the value of {v.shown(name)} is {what}, not text: quote it ({how}); every "
                                     "environment value is a string")
                if isinstance(name, str):
                    v.env_value(name, item)
        return value

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        value = _home_path(value, "workdir", info)
        return value if home_elsewhere(info) else v.folder_or_absent(value, "workdir")

    @field_validator("runs_dir")
    @classmethod
    def _runs_dir(cls, value: str, info: ValidationInfo) -> str:
        # '~' stays as written (plan expands it): the text names the run id, so existing runs keep theirs.
        return _home_path(value, "runs_dir", info, expand=False)

    @field_validator("sweep")
    @classmethod
    def _sweep(cls, value: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in value.items():
            v.arg_name(key, "sweep key")
            if not values:
                raise ValueError(f"sweep.{key} is empty: give at least one value, or remove the key")
            rendered: dict[tuple[str, ...], Any] = {}
            for x in values:
                _scalar(x, f"sweep.{key}")
                argv = tuple(render_value(x)) if x is not False else ("<omitted>",)
                if argv in rendered:
                    same = "" if repr(rendered[argv]) == repr(x) else f" (as {v.shown(rendered[argv])}: the same command line)"
                    raise ValueError(f"sweep.{key} repeats {v.shown(x)}{same}; each point must differ")
                rendered[argv] = x
        points = math.prod(len(vals) for vals in value.values())
        if points > v.MAX_SWEEP_POINTS:
            raise ValueError(f"the sweep has {points} points; the limit is {v.MAX_SWEEP_POINTS}: split it "
                             "into several specs, or sweep fewer values")
        return value

    @model_validator(mode="after")
    def _cross_field(self) -> JobSpec:
        problems = cross_field_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self

    # ---- derived values -------------------------------------------------------------------
    @property
    def ranks_per_node(self) -> int:
        if self.strategy == "dp":
            return 1
        return self.gpus_per_node if self.gpus_per_node > 0 else self.cpu_ranks_per_node

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def runs_on(self) -> Kind:
        """What the executor is (the registry's facts), asked instead of comparing its name."""
        return KINDS[self.executor]

    @property
    def resolved_backend(self) -> str:
        if self.distributed.backend != "auto":
            return self.distributed.backend
        return "nccl" if self.gpus_per_node > 0 else "gloo"

    def local_shape(self) -> tuple[int, int]:
        """(emulated nodes, ranks per emulated node) of a local run of this spec: the honest
        downscale that ``plan --executor local`` prints."""
        nodes = self.local.emulate_nodes or self.nodes
        devices = self.local.devices
        if self.local.ranks_per_node:
            return nodes, self.local.ranks_per_node
        if self.strategy == "dp":
            return nodes, 1
        if self.gpus_per_node and devices:
            return nodes, max(1, min(self.ranks_per_node, len(devices) // nodes))
        if self.gpus_per_node:
            return nodes, min(self.ranks_per_node, 2)
        return nodes, self.ranks_per_node

    def local_backend(self) -> str:
        """Locally, nccl without local.devices becomes gloo on CPU (a dry run, noted in the plan)."""
        backend = self.resolved_backend
        return "gloo" if backend == "nccl" and not self.local.devices else backend

    def sweep_points(self) -> list[dict[str, Scalar]]:
        """The grid in a stable order: the first key varies slowest. One empty point without a sweep."""
        keys = list(self.sweep)
        return [dict(zip(keys, combo)) for combo in product(*(self.sweep[k] for k in keys))]


def cross_field_problems(spec: JobSpec) -> list[str]:
    """Rules that span fields. Each message says which field to change."""
    problems: list[str] = []
    d = spec.distributed
    if spec.bool_args == "value":  # true and 'true' are one command line then (the sweep check used 'flag')
        for key, values in spec.sweep.items():
            argvs = [tuple(render_value(x, "value")) for x in values]
            if len(set(argvs)) < len(argvs):
                problems.append(f"sweep.{key}: with bool_args: value, {v.shown(values)} gives the same command line "
                                "twice (true and 'true' both pass 'true'); each point must differ")
    if d.backend == "nccl" and spec.gpus_per_node == 0:
        problems.append("distributed.backend: nccl needs GPUs but gpus_per_node is 0; set gpus_per_node, "
                        "or use backend gloo (or auto) for CPU ranks")
    if spec.strategy == "dp" and spec.nodes > 1:
        problems.append("strategy: dp (DataParallel) runs one process on one node, but nodes is "
                        f"{spec.nodes}; use strategy ddp for several nodes, or set nodes: 1")
    if spec.strategy == "dp" and spec.cpu_ranks_per_node > 1 and spec.gpus_per_node == 0:
        problems.append("cpu_ranks_per_node: strategy dp runs one process; set it to 1 or use strategy ddp")
    if spec.world_size > v.MAX_WORLD:
        problems.append(f"nodes: {spec.nodes} nodes x {spec.ranks_per_node} ranks is a world of {spec.world_size}; "
                        f"the limit is {v.MAX_WORLD} ranks")
    if spec.slurm.signal_margin_s >= spec.slurm.time_minutes * 60:
        problems.append(f"slurm.signal_margin_s: {spec.slurm.signal_margin_s}s is not shorter than the time limit "
                        f"({spec.slurm.time}); lower the margin or raise slurm.time")
    if spec.slurm.gpu_type and not spec.gpus_per_node:
        problems.append("slurm.gpu_type: a GPU type needs GPUs; set gpus_per_node, or remove slurm.gpu_type")
    problems += _slurm_resource_problems(spec)
    problems += _hostlist_problems(spec)
    if spec.distributed.grad_compression != "none" and spec.strategy != "ddp":
        problems.append("distributed.grad_compression: compresses DDP's all-reduce; strategy dp has none, so "
                        "use strategy ddp or grad_compression: none")
    if spec.recovery.survivors == "keep" and spec.runs_on.scheduled and not spec.recovery.in_allocation:
        problems.append("recovery.survivors: keep replaces a rank inside the job, and recovery.in_allocation is "
                        "false; set in_allocation: true (the default), or survivors: restart")
    if spec.recovery.survivors == "keep" and spec.runs_on.scheduled and spec.container is not None:
        problems.append("recovery.survivors: keep on SLURM starts a replaced rank on the host, not in a container, "
                        "for now; remove container, or set survivors: restart")
    if spec.recovery.survivors == "keep" and spec.recovery.max_restarts == 0:
        problems.append("recovery.survivors: keep acts on a restart, and recovery.max_restarts is 0; "
                        "set max_restarts (each rejoin counts as one)")
    if spec.runs_on.scheduled:
        problems += _file_init_problems(spec)
        problems += _node_local_problems(spec)
    if spec.runs_on.emulated:
        problems += _local_problems(spec)
    for name in d.interface_names():
        try:
            v.interface_name(name, allow_exclusion=spec.resolved_backend == "nccl")
        except ValueError as exc:
            problems.append(f"distributed.interface: {exc}")
    if isinstance(d.interface, list) and any(n.startswith("^") for n in d.interface):
        problems.append("distributed.interface: an exclusion ('^a,b') must be the only entry, not part of a list")
    from orchestrator.node.container import problems as container_problems

    problems += container_problems(spec)
    both = [k for k in spec.sweep if k in spec.args]
    if both:
        problems.append(f"sweep.{both[0]}: also set in args (args.{both[0]}); the sweep overrides it per point, so "
                        f"remove args.{both[0]}")
    from orchestrator.node import frameworks  # the framework's world settings against the shape (stdlib only)

    return problems + frameworks.problems(spec)


def _slurm_resource_problems(spec: JobSpec) -> list[str]:
    """The CPU and memory options sbatch takes only one of, or only with GPUs."""
    s, problems = spec.slurm, []
    if s.cpus_per_gpu is not None and s.cpus_per_task is not None:
        problems.append("slurm.cpus_per_gpu: sbatch refuses it together with slurm.cpus_per_task; keep one: "
                        "cpus_per_gpu (CPUs for each GPU) or cpus_per_task (CPUs for each rank)")
    elif s.cpus_per_gpu is not None and not spec.gpus_per_node:
        problems.append("slurm.cpus_per_gpu: counts CPUs per GPU, but the job asks for none; set gpus_per_node, "
                        "or use slurm.cpus_per_task for CPU ranks")
    mems = [name for name in ("mem", "mem_per_cpu", "mem_per_gpu") if getattr(s, name) is not None]
    if len(mems) > 1:
        problems.append(f"slurm.{mems[1]}: sbatch takes one of slurm.mem (per node), slurm.mem_per_cpu and "
                        f"slurm.mem_per_gpu; keep one of {', '.join('slurm.' + m for m in mems)}")
    elif s.mem_per_gpu is not None and not spec.gpus_per_node:
        problems.append("slurm.mem_per_gpu: counts memory per GPU, but the job asks for none; set gpus_per_node, "
                        "or use slurm.mem or slurm.mem_per_cpu")
    return problems


def _hostlist_problems(spec: JobSpec) -> list[str]:
    """What sbatch would refuse without naming the field: a node list longer than the allocation
    (SLURM allocates every node of it; the allocation is ``nodes`` and the ``recovery.spares`` held
    beside them, so a list of exactly nodes + spares hosts fits) and a host both wanted and excluded."""
    s = spec.slurm
    if not s.nodelist:
        return []
    wanted, allocation = v.hostlist_hosts(s.nodelist), allocated_nodes(spec)
    if wanted is None or len(wanted) > allocation:
        n = "more than 65536" if wanted is None else str(len(wanted))
        asks = (f"nodes: {spec.nodes} and recovery.spares: {spec.recovery.spares}, {allocation} in all"
                if spec.recovery.spares else f"nodes: {spec.nodes}")
        return [f"slurm.nodelist: names {n} nodes but the job asks for {asks}; SLURM allocates every node of the "
                "list, so raise nodes (or recovery.spares) or shorten the list"]
    both = wanted & (v.hostlist_hosts(s.exclude) or set()) if s.exclude else set()
    if both:
        return [f"slurm.nodelist and slurm.exclude both name {', '.join(sorted(both)[:5])}; remove it from one of them"]
    return []


def _file_init_problems(spec: JobSpec) -> list[str]:
    """file:// rendezvous across real nodes needs a path every node sees. (Locally every emulated
    node is this machine, so the plan only notes it.)"""
    d = spec.distributed
    if d.init_method != "file" or spec.nodes == 1 or d.rendezvous_dir_is_shared:
        return []
    where = d.rendezvous_dir or spec.runs_dir
    field = "distributed.rendezvous_dir" if d.rendezvous_dir else "runs_dir"
    if not v.is_node_local(where):
        return []
    return [f"{field}: file:// init across {spec.nodes} nodes needs a path every node sees, "
            f"but {v.shown(where)} is node-local; use a shared filesystem path, init_method tcp, or "
            "set distributed.rendezvous_dir_is_shared: true if it really is shared"]


def _node_local_problems(spec: JobSpec) -> list[str]:
    """A SLURM job's run folder and checkpoints must be one folder for the submitting host and
    every node, on every attempt: on a node-local path the nodes never find the payload (or each
    finds only its own checkpoints after a requeue to other nodes), and status sees nothing."""
    if spec.slurm.assume_shared_paths:
        return []
    fix = "use a shared filesystem path, or set slurm.assume_shared_paths: true if it really is shared"
    problems = []
    if v.is_node_local(spec.runs_dir):
        problems.append(f"runs_dir: {v.shown(spec.runs_dir)} is node-local on a cluster, but the nodes read the job's "
                        f"payload there and write its logs and checkpoints where `status` reads them; {fix}")
    if spec.checkpoint.dir and v.is_node_local(spec.checkpoint.dir):
        problems.append(f"checkpoint.dir: {v.shown(spec.checkpoint.dir)} is node-local: a requeued or multi-node job "
                        f"resumes only where the same node wrote, and ranks on other nodes find nothing; {fix}")
    return problems


def _local_problems(spec: JobSpec) -> list[str]:
    """What the local executor cannot run on one machine."""
    nodes, rpn = spec.local_shape()
    world = nodes * rpn
    if world > v.MAX_LOCAL_RANKS:
        return [f"local.emulate_nodes: a local run of {nodes} node(s) x {rpn} rank(s) = {world} processes; the "
                f"limit on one machine is {v.MAX_LOCAL_RANKS}: set local.emulate_nodes and local.ranks_per_node "
                "to a downscale (the plan keeps the same code path and variables)"]
    devices = spec.local.devices
    if devices is not None and spec.gpus_per_node > 0 and spec.local_backend() == "nccl" and spec.strategy == "ddp":
        if world > len(devices):
            return [f"local.devices: {len(devices)} GPU(s) for {world} local rank(s) with nccl: every rank needs a "
                    "GPU of its own; list more devices, lower local.emulate_nodes / local.ranks_per_node, or set "
                    "distributed.backend: gloo"]
    return []


def allocated_nodes(spec: JobSpec) -> int:
    """The nodes sbatch asks for: the ranks' ``nodes`` and the spares held beside them (recovery.spares)."""
    return spec.nodes + spec.recovery.spares
