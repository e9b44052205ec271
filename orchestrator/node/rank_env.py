"""A rank's environment, built in one place.

``rank_environment`` is the one function that makes everything a rank gets: the torchrun contract
(``RankEnv.to_environ``), the job's settings (``ORCH_*``), the attempt, and the job's variables
(defaults, then the spec's ``env:``). ``plan`` calls it for its table, the local supervisor and
the debug executor for their ranks, and every SLURM rank for itself, so what ``plan`` shows is
what a rank gets. Standard library only: imported on every rank before torch.
"""

from __future__ import annotations

import os
import re

from orchestrator.core.lean_record import record
from orchestrator.core.netif import InterfaceChoice, Route, choose_interfaces, read_nccl_conf
from orchestrator.core.platform_caps import loopback_interface
from orchestrator.core.rendezvous import init_url

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a rank imports this module)
if TYPE_CHECKING:
    from typing import Literal, Mapping, Optional, Union
    from orchestrator.core.payload import Payload
    Source = Literal["scheduler", "launcher", "env", "plan"]  # a scheduler's task, our local launcher, torchrun's, plan
    #: A value known when the rank starts, or (in ``plan``'s SLURM table) the rule that produces it.
    Value = Union[int, str]


class OrchVar:
    """The ORCH_* variables of the rank contract, named once: ``rank_environment`` sets them,
    ``jobs/`` (the rank API) reads them by these names."""

    JOB_NAME = "ORCH_JOB_NAME"
    BACKEND = "ORCH_BACKEND"
    STRATEGY = "ORCH_STRATEGY"
    INIT_METHOD = "ORCH_INIT_METHOD"
    INIT_TIMEOUT_S = "ORCH_INIT_TIMEOUT_S"
    COLLECTIVE_TIMEOUT_S = "ORCH_COLLECTIVE_TIMEOUT_S"
    RUN_DIR = "ORCH_RUN_DIR"
    CHECKPOINT_DIR = "ORCH_CHECKPOINT_DIR"
    CHECKPOINT_INTERVAL = "ORCH_CHECKPOINT_INTERVAL"
    CHECKPOINT_KEEP = "ORCH_CHECKPOINT_KEEP"
    RESUME = "ORCH_RESUME"
    GRAD_COMPRESSION = "ORCH_GRAD_COMPRESSION"
    ATTEMPT = "ORCH_ATTEMPT"
    REQUEUE_MARKER = "ORCH_REQUEUE_MARKER"
    STOP_SIGNAL = "ORCH_STOP_SIGNAL"
    RUN_ID = "ORCH_RUN_ID"
    TENSORBOARD_DIR = "ORCH_TENSORBOARD_DIR"
    SURVIVORS = "ORCH_SURVIVORS"  # "keep": the rank API rejoins after a peer's loss (recovery.survivors)
    HEAL_GENERATION = "ORCH_HEAL_GENERATION"  # on a rank forked to replace one: the group it joins


@record
class RankEnv:
    """The torchrun contract of one rank: its place in the job and how it finds its peers."""

    rank: Value
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: Value
    nnodes: int
    master_addr: str
    master_port: Value
    init_method: str
    interface: str | None  # what this node's ranks meet on: the route (auto) or the spec's names
    visible_devices: str | None
    source: Source
    #: NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME as ``netif.choose_interfaces`` decided them.
    interfaces: Optional[InterfaceChoice] = None

    def to_environ(self) -> dict[str, str]:
        """The variables every rank sees: torchrun's names, plus the init URL and the socket
        interfaces the job sets (``interfaces``: none for a backend left to its own choice)."""
        env = {"RANK": str(self.rank), "LOCAL_RANK": str(self.local_rank), "WORLD_SIZE": str(self.world_size),
               "LOCAL_WORLD_SIZE": str(self.local_world_size), "NODE_RANK": str(self.node_rank),
               "GROUP_RANK": str(self.node_rank), "NNODES": str(self.nnodes), "MASTER_ADDR": self.master_addr,
               "MASTER_PORT": str(self.master_port), OrchVar.INIT_METHOD: self.init_method}
        if self.interfaces is not None:
            env.update(self.interfaces.environ())
        if self.visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.visible_devices
        return env

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> RankEnv:
        """Read the standard env:// variables (as torchrun or our launcher set them)."""
        e = os.environ if environ is None else environ
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in e]
        if missing:
            raise RuntimeError(f"not launched as a distributed rank: {', '.join(missing)} unset; start it with "
                               "'orchestrator run', under SLURM with 'orchestrator submit', or with torchrun")
        world = int(e["WORLD_SIZE"])
        local_world = int(e.get("LOCAL_WORLD_SIZE", world))
        rank = int(e["RANK"])
        return cls(rank=rank, local_rank=int(e.get("LOCAL_RANK", rank % local_world)), world_size=world,
                   local_world_size=local_world,
                   node_rank=int(e.get("NODE_RANK", e.get("GROUP_RANK", rank // local_world))),
                   nnodes=int(e.get("NNODES", max(1, world // local_world))), master_addr=e["MASTER_ADDR"],
                   master_port=int(e["MASTER_PORT"]), init_method=e.get(OrchVar.INIT_METHOD, "env://"),
                   interface=e.get("GLOO_SOCKET_IFNAME") or e.get("NCCL_SOCKET_IFNAME"),
                   visible_devices=e.get("CUDA_VISIBLE_DEVICES"), source="env")


def job_settings(payload: Payload) -> dict[str, str]:
    """The job's settings every rank reads (``jobs/runtime.py``), by their ORCH_* names."""
    c = payload.checkpoint
    return {OrchVar.JOB_NAME: payload.job_name, OrchVar.RUN_ID: payload.run_id, OrchVar.BACKEND: payload.backend,
            OrchVar.STRATEGY: payload.strategy, OrchVar.INIT_TIMEOUT_S: str(payload.init_timeout_s),
            OrchVar.COLLECTIVE_TIMEOUT_S: str(payload.collective_timeout_s), OrchVar.RUN_DIR: payload.run_dir,
            OrchVar.CHECKPOINT_DIR: c.dir, OrchVar.CHECKPOINT_INTERVAL: str(c.interval_steps),
            OrchVar.CHECKPOINT_KEEP: str(c.keep_last), OrchVar.RESUME: "1" if c.resume else "0",
            OrchVar.GRAD_COMPRESSION: payload.grad_compression, OrchVar.STOP_SIGNAL: payload.stop_signal}


def rank_environment(rank: RankEnv, payload: Payload, attempt: Value, requeue_marker: str | None = None,
                     torch_version: str | None = None) -> dict[str, str]:
    """Everything one rank gets on top of the environment it inherits, in one dict: the torchrun
    contract, the job's ORCH_* settings, the attempt (and on SLURM the requeue marker's path),
    then the job's variables (the defaults and the spec's ``env:``, which ``env:`` may not use to
    override the contract), and, for a torch older than 2.8, the old names of the flight
    recorder's variables."""
    from orchestrator.node import frameworks, tracking

    env = rank.to_environ()
    env.update(job_settings(payload))
    env[OrchVar.ATTEMPT] = str(attempt)
    if payload.recovery.survivors == "keep":
        env[OrchVar.SURVIVORS] = "keep"
    if requeue_marker is not None:
        env[OrchVar.REQUEUE_MARKER] = requeue_marker
    env.update(tracking.environment(payload))
    env.update(frameworks.environment(payload, env))
    env.update(payload.env)
    if rank.source == "scheduler":  # a SLURM rank knows what plan shows as a rule (``resolve_cpu_share``)
        env.update(task_cpu_values(env, os.environ))
    env.update(flight_recorder_aliases(env, torch_version))
    return env


#: Locally every rank runs on this machine and meets the master at 127.0.0.1, over the loopback
#: interface ('lo' on Linux, 'lo0' on macOS).
def local_route() -> Route:
    """The route of ranks that all run on this machine: loopback (asked when needed: a SLURM rank
    does not)."""
    return Route(loopback_interface(), "every rank runs on this machine", loopback_only=True)


def interface_choice(setting: str | None, payload: Payload, route: Route | None) -> InterfaceChoice:
    """This host's decision on the job's socket interfaces (``netif.choose_interfaces``): with the
    environment the ranks inherit (this process's: the user's shell for ``plan`` and the local
    supervisor, what srun gave a SLURM rank) and NCCL's configuration files as NCCL reads them here."""
    conf = read_nccl_conf({**os.environ, **payload.env})
    return choose_interfaces(setting, payload.backend, payload.env, os.environ, conf, route)


def planned_interfaces(payload: Payload, on_this_machine: bool, rule: str) -> InterfaceChoice:
    """The decision ``plan`` shows and puts in its rows. Locally (``on_this_machine``) the ranks'
    own (``local_route``, whatever the spec names: every rank is on this machine). On SLURM each
    rank decides on its node (``rank_env_from_slurm``); for 'auto', ``rule`` stands for the route
    it will find there."""
    if on_this_machine:
        return interface_choice("auto", payload, local_route())
    if payload.interface in (None, "auto"):
        return interface_choice("auto", payload, Route(rule, "auto: found on each node when the job starts"))
    return interface_choice(payload.interface, payload, None)


def local_rank_env(payload: Payload, rank: int, port: int, rendezvous: str | None) -> RankEnv:
    """The contract of one local rank: emulated node ``rank // ranks_per_node``, master on this
    machine, the node's share of ``local.devices`` (none: every GPU hidden, a CPU dry run), the
    socket interfaces for ranks that all meet over loopback (``local_route``)."""
    node, local = divmod(rank, payload.ranks_per_node)
    devices = list(payload.devices) if payload.devices else None
    if devices is None:
        visible: str | None = ""
    elif payload.strategy == "ddp":
        visible = node_devices(devices, node, payload.nodes)
    else:
        visible = ",".join(map(str, devices))
    return RankEnv(rank=rank, local_rank=local, world_size=payload.world_size,
                   local_world_size=payload.ranks_per_node, node_rank=node, nnodes=payload.nodes,
                   master_addr="127.0.0.1", master_port=port,
                   init_method=init_url(payload.init_method, "127.0.0.1", port, rendezvous),
                   interface=payload.interface, visible_devices=visible, source="launcher",
                   interfaces=interface_choice("auto", payload, local_route()))


#: Variables a process reads when its interpreter (or a library it loads at start) starts: setting
#: them in an already running rank does nothing. A forked local rank whose job sets any of them to
#: a value other than the zygote's starts a fresh interpreter instead (``startup_variables``).
STARTUP_PREFIXES = ("PYTHON", "LD_", "MALLOC_", "GLIBC_TUNABLES", "TORCH_", "OMP_", "KMP_", "GOMP_", "MKL_",
                    "OPENBLAS_")
#: ... except these, which torch reads when it builds a process group (after the fork), or which
#: the launcher applies to a forked rank itself (OMP_NUM_THREADS: torch.set_num_threads; the heap
#: settings: mallopt).
NOT_STARTUP_PREFIXES = ("TORCH_NCCL_", "TORCH_FR_")
APPLIED_AFTER_START = frozenset({"OMP_NUM_THREADS", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"})


def startup_variables(env: Mapping[str, str], inherited: Mapping[str, str]) -> list[str]:
    """The variables of ``env`` that only a new interpreter would honour, because the process that
    would fork the rank started with another value (``inherited``)."""
    return sorted(name for name, value in env.items()
                  if name.startswith(STARTUP_PREFIXES) and not name.startswith(NOT_STARTUP_PREFIXES)
                  and name not in APPLIED_AFTER_START and inherited.get(name) != value)


def thread_count_local(cpus: int, ranks: int) -> int:
    """Locally every rank shares this machine: its cores divided among the ranks (on SLURM a rank
    gets its cpus_per_task, or its share of its node's CPUs: ``cpu_share``). torchrun sets
    OMP_NUM_THREADS=1; one thread pool per core-hungry rank on a shared node is the slow default."""
    return max(1, cpus // max(1, ranks))


# ---- a SLURM rank's share of its node's CPUs -------------------------------------------------
# A job that does not set slurm.cpus_per_task asks sbatch for no CPU count, so the site's defaults
# (DefCpuPerGPU, DefMemPerCPU, at least one CPU per task) decide how many CPUs each node gets. Only
# the job knows that number: the payload carries the ranks' srun --cpus-per-task and the thread
# default as the rule ``cpu_share_rule`` (which plan shows), the job's agent puts the number in
# (``resolve_cpu_share``) before srun starts the ranks, and each rank reads its own back.
_CPU_SHARE = re.compile(r"<SLURM_CPUS_ON_NODE / (\d+)>")


def cpu_share_rule(ranks_per_node: int) -> str:
    """The rule for a rank's CPUs when the spec asks for no number: its node's granted CPUs
    divided among the node's ranks (at least 1)."""
    return f"<SLURM_CPUS_ON_NODE / {ranks_per_node}>"


def has_cpu_share_rule(value: str) -> bool:
    return _CPU_SHARE.search(value) is not None


def _whole(text: str | None) -> int | None:
    return int(text) if text and text.isascii() and text.isdigit() and int(text) > 0 else None


def granted_cpus(environ: Mapping[str, str]) -> int | None:
    """The CPUs SLURM granted the job on its node, as the batch step sees them: SLURM_CPUS_ON_NODE,
    or the fewest of SLURM_JOB_CPUS_PER_NODE ('32(x2),16') where the job's nodes got different
    numbers (one srun --cpus-per-task must fit on every node). None when SLURM says neither."""
    per_node = [_whole(p.split("(")[0].strip()) for p in (environ.get("SLURM_JOB_CPUS_PER_NODE") or "").split(",")]
    counts = [n for n in (_whole(environ.get("SLURM_CPUS_ON_NODE")), *per_node) if n]
    return min(counts) if counts else None


def usable_cpu_count() -> int:
    """The CPUs this process may run on (its affinity mask), else the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_share(environ: Mapping[str, str], ranks_per_node: int) -> tuple[int, str]:
    """(each rank's CPUs, where the number comes from): the granted CPUs (``granted_cpus``) divided
    among the node's ranks, at least 1; the agent's own CPU mask if SLURM says nothing."""
    rpn = max(1, ranks_per_node)
    cpus = granted_cpus(environ)
    if cpus is None:
        cpus, source = usable_cpu_count(), "this node's CPU mask (SLURM_CPUS_ON_NODE is not set)"
    else:
        source = f"SLURM granted {cpus} CPUs on the node" if cpus == _whole(environ.get("SLURM_CPUS_ON_NODE")) \
            else f"SLURM granted {cpus} CPUs on the job's smallest node"
    return max(1, cpus // rpn), f"{source}, shared by {rpn} rank(s)"


def resolve_cpu_share(value: str, share: int) -> str:
    """``value`` with every CPU share rule replaced by the number."""
    return _CPU_SHARE.sub(str(share), value)


def task_cpu_values(env: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """On a SLURM rank: the job's variables that the payload carries as a CPU share rule, with the
    number this task got: srun's SLURM_CPUS_PER_TASK (the agent's --cpus-per-task), else the value
    the agent exported for it, else this task's CPU mask."""
    ruled = {k: value for k, value in env.items() if has_cpu_share_rule(value)}
    if not ruled:
        return {}
    share = _whole(environ.get("SLURM_CPUS_PER_TASK"))
    out = {}
    for key, value in ruled.items():
        inherited = environ.get(key, "")
        if share is None and inherited and not has_cpu_share_rule(inherited) and _whole(inherited):
            out[key] = inherited
        else:
            out[key] = resolve_cpu_share(value, share or usable_cpu_count())
    return out


def node_devices(devices: list[int] | None, node: int, nodes: int) -> str | None:
    """The GPUs of one emulated local node: its equal share of ``local.devices``. Every rank of
    that node sees all of them and LOCAL_RANK indexes them, as under torchrun; None without GPUs."""
    if not devices:
        return None
    share = max(1, len(devices) // max(1, nodes))
    return ",".join(str(d) for d in devices[node * share:(node + 1) * share])


def slurm_visible_devices(environ: Mapping[str, str]) -> str | None:
    """The GPUs SLURM gave the task, unchanged (None without any).

    The torchrun contract: with ``--gpus-per-node`` every task of a node sees the node's GPUs and
    a script picks its own with ``torch.cuda.set_device(LOCAL_RANK)``, as PyTorch's DDP
    tutorials, Accelerate and Lightning do. Narrowing the list to one device per rank while
    LOCAL_RANK keeps its value breaks every such script ("invalid device ordinal" on every rank
    but 0). A binding the site or the job asked SLURM for (``--gpu-bind``, ``--gpus-per-task``)
    is SLURM's to make, and is kept as it made it.
    """
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or visible in ("", "NoDevFiles"):
        return None
    return visible


#: The flight recorder's variables were renamed in torch 2.8 (TORCH_NCCL_* -> TORCH_FR_*); newer
#: releases warn about the old names, older ones know only those.
FLIGHT_RECORDER_RENAMES = {"TORCH_FR_BUFFER_SIZE": "TORCH_NCCL_TRACE_BUFFER_SIZE",
                           "TORCH_FR_DUMP_TEMP_FILE": "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}


def flight_recorder_aliases(environ: Mapping[str, str], torch_version: str | None) -> dict[str, str]:
    """The old names of the flight recorder's variables, for a torch older than 2.8 (``plan`` shows
    the new ones). ``torch_version`` from importlib.metadata, so torch is not imported for it."""
    m = re.match(r"(\d+)\.(\d+)", torch_version or "")
    if not m or (int(m.group(1)), int(m.group(2))) >= (2, 8):
        return {}
    return {old: environ[new] for new, old in FLIGHT_RECORDER_RENAMES.items() if new in environ and old not in environ}


def installed_torch_version(env: Mapping[str, str]) -> str | None:
    """torch's version from its metadata, only for a job that asked for the flight recorder (the
    one thing that depends on it); torch itself is not imported."""
    if "TORCH_FR_BUFFER_SIZE" not in env:
        return None
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # not installed the usual way: the names stay as the plan shows them
        return None
