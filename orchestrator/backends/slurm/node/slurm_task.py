"""What SLURM tells a job and its tasks about themselves, parsed once: used by the job's agent and by
every rank. Standard library only.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.core.hostlist import expand
from orchestrator.core.lean_record import record
from orchestrator.core.rendezvous import derive_port, init_url, rendezvous_file
from orchestrator.core.run_folder import RunFolder
from orchestrator.node.rank_env import RankEnv, interface_choice, slurm_visible_devices

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a rank imports this module)
if TYPE_CHECKING:
    from typing import Mapping, Optional
    from orchestrator.core.payload import Payload


#: What the job's agent tells the ranks of a step: the job's attempt (``SlurmJob.attempt``).
ATTEMPT_VARIABLE = "ORCH_JOB_ATTEMPT"


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compressed host list ("gpu[01-03,7],cpu1") as names, without calling scontrol
    (``orchestrator.core.hostlist``); [] for none."""
    return expand(nodelist) if nodelist and nodelist != "(null)" else []


@record
class SlurmJob:
    """The job (or array task) this process belongs to."""

    job_id: str  # what scontrol and sacct use: '<array job>_<task>' inside an array
    raw_job_id: str  # SLURM_JOB_ID: the allocation's own number
    array_job_id: Optional[str]
    array_task: Optional[int]
    restart: int  # SLURM_RESTART_COUNT: 0 on the first attempt, one more per requeue
    hosts: tuple[str, ...]  # the job's allocation (its spares included)
    #: This job's attempt, from 0: one more per requeue and per restart inside the allocation. The
    #: agent gives it to each step it starts (ATTEMPT_VARIABLE); without it, SLURM_RESTART_COUNT.
    attempt: int = 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> SlurmJob:
        array_job = environ.get("SLURM_ARRAY_JOB_ID") or None
        task = environ.get("SLURM_ARRAY_TASK_ID")
        raw = environ["SLURM_JOB_ID"]
        restart = int(environ.get("SLURM_RESTART_COUNT", "0"))
        return cls(
            job_id=f"{array_job}_{task}" if array_job else raw, raw_job_id=raw, array_job_id=array_job,
            array_task=int(task) if array_job and task is not None else None,
            restart=restart, hosts=tuple(expand_nodelist(environ.get("SLURM_JOB_NODELIST", ""))),
            attempt=int(environ.get(ATTEMPT_VARIABLE, restart)),
        )

    def payload_path(self, path: str | Path, point_base: int) -> Path:
        """The payload of this job: the run's, or in a job array that of its sweep point."""
        if self.array_task is None:
            return Path(path)
        return RunFolder(Path(path).parent).point(point_base + self.array_task).payload

    def requeue_marker(self, run_dir: str) -> str:
        """Written by the rank API once the ranks checkpointed after a stop signal (policy auto)."""
        return str(RunFolder(Path(run_dir)).requeue_marker(self.job_id, self.attempt))

    def rank_log(self, pattern: str, rank: int) -> Path:
        """srun's --output pattern (%j, %A, %a, %t) for one rank of this job."""
        return Path(pattern.replace("%A", self.array_job_id or self.raw_job_id)
                    .replace("%a", "" if self.array_task is None else str(self.array_task))
                    .replace("%j", self.raw_job_id).replace("%t", str(rank)))


@record
class SlurmTask:
    """One srun task (one rank) of the job."""

    job: SlurmJob
    procid: int
    localid: int
    nodeid: int
    ntasks: int
    nnodes: int  # the step's nodes
    cuda_visible_devices: Optional[str]  # as SLURM set it for the task (None: not set)
    #: The step's nodes, in order (the job's, when SLURM does not say): the ranks' master is the first.
    #: A job with spares runs its ranks' step on some of its nodes.
    hosts: tuple[str, ...] = ()

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> SlurmTask:
        job = SlurmJob.from_environ(environ)
        step = tuple(expand_nodelist(environ.get("SLURM_STEP_NODELIST", ""))) or job.hosts
        nnodes = environ.get("SLURM_STEP_NUM_NODES") or environ.get("SLURM_JOB_NUM_NODES") or \
            environ.get("SLURM_NNODES", "1")
        return cls(job=job, procid=int(environ["SLURM_PROCID"]),
                   localid=int(environ["SLURM_LOCALID"]), nodeid=int(environ["SLURM_NODEID"]),
                   ntasks=int(environ["SLURM_NTASKS"]), nnodes=int(nnodes),
                   cuda_visible_devices=environ.get("CUDA_VISIBLE_DEVICES"), hosts=step)


#: The options of a replacement rank's srun (``recovery.survivors: keep``): the rank it stands in
#: for, and the ranks' step's nodes (its own step has one).
STAND_IN_OPTION, STEP_NODES_OPTION = "--stand-in", "--step-nodes"


def stand_in(task: SlurmTask, args: list[str], ranks_per_node: int) -> tuple[SlurmTask, dict[str, str]]:
    """The task as the rank it replaces (``--stand-in R --step-nodes a,b``), and the SLURM variables a
    framework reads, as the ranks' step set them for that rank: its own step is one task on one node
    (``agent_survivors``). Without ``--stand-in``, the task as SLURM started it and nothing to set."""
    if STAND_IN_OPTION not in args:
        return task, {}
    rank = int(args[args.index(STAND_IN_OPTION) + 1])
    hosts = tuple(args[args.index(STEP_NODES_OPTION) + 1].split(",")) if STEP_NODES_OPTION in args else task.hosts
    per_node = max(1, ranks_per_node)
    world = len(hosts) * per_node
    task = SlurmTask(job=task.job, procid=rank, localid=rank % per_node, nodeid=rank // per_node, ntasks=world,
                     nnodes=len(hosts), cuda_visible_devices=task.cuda_visible_devices, hosts=hosts)
    return task, {"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(task.localid), "SLURM_NODEID": str(task.nodeid),
                  "SLURM_NTASKS": str(world), "SLURM_NPROCS": str(world), "SLURM_STEP_NUM_TASKS": str(world),
                  "SLURM_STEP_NUM_NODES": str(len(hosts)), "SLURM_STEP_NODELIST": ",".join(hosts)}


#: SLURM's default MaxArraySize is 1001, so one array holds at most 1000 tasks.
DEFAULT_MAX_ARRAY_SIZE = 1001
#: The batch script's option (and the ranks' srun's) that names a job array's first sweep point.
POINT_BASE_OPTION = "--point-base"
#: The ranks' srun option that carries the auto port the job's agent found free.
MASTER_PORT_OPTION = "--master-port"


def point_base(args: list[str]) -> int:
    """``--point-base N``: the first sweep point of this job array (arrays are split at MaxArraySize)."""
    return int(args[args.index(POINT_BASE_OPTION) + 1]) if POINT_BASE_OPTION in args else 0


def master_port(args: list[str]) -> Optional[int]:
    """``--master-port N``: the auto port the job's agent found free on the master's node (None:
    not given, the rank derives it)."""
    return int(args[args.index(MASTER_PORT_OPTION) + 1]) if MASTER_PORT_OPTION in args else None


#: The ranks' srun option that has the step run the health gate first (``orchestrator.backends.slurm.node.gate_step``).
GATE_OPTION = "--gate"


def gate_attempt(args: list[str]) -> Optional[int]:
    """``--gate K``: the attempt (as recovery.json counts) whose health gate this task takes part in
    before its entrypoint (None: the gate ran as a step of its own, or not at all)."""
    return int(args[args.index(GATE_OPTION) + 1]) if GATE_OPTION in args else None


def rank_env_from_slurm(task: SlurmTask, payload: Payload, agent_port: int | None = None) -> RankEnv:
    """The RankEnv of this srun task, from SLURM's variables and the job's payload: master = first
    host of the step's node list, port derived from the job id and its attempt (or the one the job's
    agent found free on the master's node: ``agent_port``), interface 'auto' = the one carrying
    (or routing to) the master's address for gloo, NCCL's own choice or the user's or the site's
    setting for NCCL (``netif.choose_interfaces``), a named one checked on this node, a GPU
    binding SLURM made kept, and a file:// rendezvous file unique per job and restart."""
    from orchestrator.core.netif import expand_names, master_route

    job = task.job
    port = int(payload.port) if payload.port != "auto" else agent_port or derive_port(job.raw_job_id, job.attempt)
    hosts = task.hosts or job.hosts
    master = hosts[0]
    iface = payload.interface
    if iface in (None, "auto"):
        route = master_route(master, hosts[1:])
        iface, interfaces = route.interface, interface_choice("auto", payload, route)
    else:
        if not str(iface).startswith("^"):  # an NCCL exclusion list is NCCL's to apply
            iface = ",".join(expand_names(str(iface)))
        interfaces = interface_choice(iface, payload, None)
    rfile = rendezvous_file(payload.rendezvous_dir, job.job_id, job.attempt)
    return RankEnv(
        rank=task.procid, local_rank=task.localid, world_size=task.ntasks,
        local_world_size=task.ntasks // max(1, task.nnodes), node_rank=task.nodeid, nnodes=task.nnodes,
        master_addr=master, master_port=port, init_method=init_url(payload.init_method, master, port, rfile),
        interface=str(iface), source="scheduler", interfaces=interfaces,
        visible_devices=slurm_visible_devices({"CUDA_VISIBLE_DEVICES": task.cuda_visible_devices}
                                              if task.cuda_visible_devices is not None else {}),
    )
