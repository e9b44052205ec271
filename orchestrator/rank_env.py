"""RankEnv: what one rank needs to join the job, and where it came from.

Standard library only: this module is imported on every rank before torch, and by ``plan``.
The same contract is produced from SLURM's variables (``from_slurm``), by the local executor
(``for_local_rank``), or read back from the standard env:// variables (``from_environ``).
"""

from __future__ import annotations

import os
import re
import zlib
from dataclasses import asdict, dataclass
from typing import Literal, Mapping

Source = Literal["slurm", "local", "env"]


class OrchVar:
    """The ORCH_* variables of the rank contract, named once: the launcher and the executors set
    them, ``jobs/`` (the rank API) reads them by these names."""

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
    RANK_ENV_SOURCE = "ORCH_RANK_ENV_SOURCE"

#: Auto ports live in [PORT_BASE, PORT_BASE + PORT_SPAN): below Linux's ephemeral range (32768+)
#: and above the usual service ports.
PORT_BASE = 20000
PORT_SPAN = 12000


def derive_port(job_id: str, restart: int = 0) -> int:
    """The same port on every rank, from the job id and restart count, with no communication.

    A restart gets a different port, so a port left in TIME_WAIT by the previous attempt is
    never reused by the next one.
    """
    return PORT_BASE + zlib.crc32(f"{job_id}:{restart}".encode()) % PORT_SPAN


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand SLURM's compressed host list ("gpu[01-03,7],cpu1") without calling scontrol."""
    hosts: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", nodelist):
        m = re.match(r"^(.*?)\[([^\]]*)\](.*)$", item)
        if not m:
            hosts.append(item)
            continue
        prefix, ranges, suffix = m.groups()
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not hi:
                hosts.append(f"{prefix}{lo}{suffix}")
                continue
            for i in range(int(lo), int(hi) + 1):
                hosts.append(f"{prefix}{str(i).zfill(len(lo))}{suffix}")
    return hosts


def init_url(method: str, master_addr: str, master_port: int, rendezvous_file: str | None) -> str:
    if method == "tcp":
        return f"tcp://{master_addr}:{master_port}"
    if method == "file":
        if not rendezvous_file:
            raise ValueError("file:// init needs a rendezvous file path")
        return f"file://{rendezvous_file}"
    return "env://"


def rendezvous_file(rendezvous_dir: str, job_id: str, restart: int) -> str:
    """A unique file per job and restart: a stale file from an earlier attempt is never reused."""
    return os.path.join(rendezvous_dir, f"rendezvous-{job_id}-{restart}")


@dataclass(frozen=True)
class RankEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    init_method: str
    interface: str | None
    visible_devices: str | None
    source: Source

    def to_environ(self) -> dict[str, str]:
        """The variables every rank sees: torchrun's names, plus our own for the rest."""
        env = {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "NODE_RANK": str(self.node_rank),
            "GROUP_RANK": str(self.node_rank),
            "NNODES": str(self.nnodes),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            OrchVar.INIT_METHOD: self.init_method,
            OrchVar.RANK_ENV_SOURCE: self.source,
        }
        if self.interface:
            env["NCCL_SOCKET_IFNAME"] = self.interface
            if not self.interface.startswith("^"):
                env["GLOO_SOCKET_IFNAME"] = self.interface
        if self.visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.visible_devices
        return env

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> RankEnv:
        """Read the standard env:// variables (as torchrun or our launcher set them)."""
        e = os.environ if environ is None else environ
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in e]
        if missing:
            raise RuntimeError(
                f"not launched as a distributed rank: {', '.join(missing)} unset; start it with "
                "'orchestrator run', under SLURM with 'orchestrator submit', or with torchrun"
            )
        world = int(e["WORLD_SIZE"])
        local_world = int(e.get("LOCAL_WORLD_SIZE", world))
        rank = int(e["RANK"])
        return cls(
            rank=rank,
            local_rank=int(e.get("LOCAL_RANK", rank % local_world)),
            world_size=world,
            local_world_size=local_world,
            node_rank=int(e.get("NODE_RANK", e.get("GROUP_RANK", rank // local_world))),
            nnodes=int(e.get("NNODES", max(1, world // local_world))),
            master_addr=e["MASTER_ADDR"],
            master_port=int(e["MASTER_PORT"]),
            init_method=e.get(OrchVar.INIT_METHOD, "env://"),
            interface=e.get("GLOO_SOCKET_IFNAME") or e.get("NCCL_SOCKET_IFNAME"),
            visible_devices=e.get("CUDA_VISIBLE_DEVICES"),
            source="env",
        )


def slurm_job_id(environ: Mapping[str, str]) -> str:
    """The id scontrol and sacct use for this job: '<array job>_<task>' inside an array."""
    if environ.get("SLURM_ARRAY_JOB_ID"):
        return f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    return environ["SLURM_JOB_ID"]


def rank_env_from_slurm(environ: Mapping[str, str], payload: Mapping[str, object]) -> RankEnv:
    """The RankEnv of this srun task, from SLURM's variables and the job's payload: master = first
    host of the node list, port derived from the job id and restart count, interface 'auto' =
    the one carrying (or routing to) the master's address, a named one checked on this node,
    a GPU binding SLURM made kept, and a file:// rendezvous file unique per job and restart."""
    from orchestrator.netif import check_interfaces, interface_for

    e, p = environ, payload
    hosts = expand_nodelist(e["SLURM_JOB_NODELIST"])
    job_id = slurm_job_id(e)
    restart = int(e.get("SLURM_RESTART_COUNT", "0"))
    port = derive_port(job_id, restart) if p["port"] == "auto" else int(str(p["port"]))
    world = int(e["SLURM_NTASKS"])
    nnodes = int(e.get("SLURM_JOB_NUM_NODES", e.get("SLURM_NNODES", "1")))
    local_world = world // max(1, nnodes)
    local_rank = int(e["SLURM_LOCALID"])
    master = hosts[0]
    iface = p["interface"]
    if iface in (None, "auto"):
        iface = interface_for(master)
    else:
        import socket

        check_interfaces(str(iface).split(","), socket.gethostname())
    rfile = rendezvous_file(str(p["rendezvous_dir"]), job_id, restart)
    return RankEnv(
        rank=int(e["SLURM_PROCID"]), local_rank=local_rank, world_size=world, local_world_size=local_world,
        node_rank=int(e["SLURM_NODEID"]), nnodes=nnodes, master_addr=master, master_port=port,
        init_method=init_url(str(p["init_method"]), master, port, rfile), interface=str(iface),
        visible_devices=slurm_visible_devices(e), source="slurm",
    )


def thread_count_local(cpus: int, ranks: int) -> int:
    """Locally every rank shares this machine: its cores divided among the ranks (on SLURM a rank
    gets its cpus_per_task). torchrun sets OMP_NUM_THREADS=1; one thread pool per core-hungry rank
    on a shared node is the slow default."""
    return max(1, cpus // max(1, ranks))


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
