"""JobSpec -> LaunchPlan. Pure: no subprocess, no writes, nothing read from the cluster.

The plan is what ``orchestrator plan`` prints and what the executors carry out: the submitit
parameters and the sbatch script rendered by submitit's own code (so what is shown is what
runs), the table of every rank's environment, the run folder, and the payload each rank reads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import shlex
import sys
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from orchestrator import platform_caps, tracking
from orchestrator.container import container_settings, srun_tail
from orchestrator.interpreter import module_argv
from orchestrator.malloc import MALLOC_DEFAULTS
from orchestrator.payload import (PAYLOAD_VERSION, CheckpointSettings, CodeSettings, ContainerSettings, Payload,
                                  RecoverySettings, WatchdogSettings)
from orchestrator.rank_env import (
    RankEnv,
    cpu_share_rule,
    installed_torch_version,
    local_rank_env,
    planned_interfaces,
    rank_environment,
    startup_variables,
    thread_count_local,
)
from orchestrator.rendezvous import derive_port, init_url, rendezvous_file
from orchestrator.run_folder import RunFolder
from orchestrator.snapshot import Snapshot
from orchestrator.spec import ExecutorName, JobSpec, render_value

#: SLURM's default MaxArraySize is 1001, so one array holds at most 1000 tasks.
DEFAULT_MAX_ARRAY_SIZE = 1001


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
    payload: Payload
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


def run_id_for(spec: JobSpec) -> str:
    """A stable id: a spec that trains the same thing always maps to the same run folder (and
    resumes there), whatever its operational fields say (``orchestrator.identity`` has the rule)."""
    from orchestrator.identity import run_id

    return run_id(spec)


def render_argv(args: dict[str, Any], extra: list[str], bools: str = "flag") -> list[str]:
    """{'lr': 0.1, 'amp': True, 'sizes': [1, 2]} -> ['--lr', '0.1', '--amp', '--sizes', '1', '2'].
    ``bools``: the spec's ``bool_args``; with 'value', {'amp': False} -> ['--amp', 'false']."""
    argv: list[str] = []
    for key, value in args.items():
        if value is not False or bools == "value":
            argv += [f"--{key}", *render_value(value, bools)]
    return argv + list(extra)


def plan(spec: JobSpec, executor: ExecutorName | None = None, max_array_size: int = DEFAULT_MAX_ARRAY_SIZE,
         code: Snapshot | None = None) -> LaunchPlan:
    """``spec``: validated (``api.plan_for`` validates once, with the executor it plans for).
    ``executor``: another executor than the spec's, whose own rules apply (local caps, node-local
    paths): the spec is validated again for it by its constructor. ``code``: the scanned project
    (``snapshot.scan``); the ranks then import from its tree. The scan reads the disk and runs
    git, so it is the caller's (``api.plan_for``), not the plan's."""
    executor = executor or spec.executor
    if executor != spec.executor:
        spec = JobSpec(**{**spec.model_dump(mode="json", exclude_defaults=True), "executor": executor})
    run_id = run_id_for(spec)
    run_dir = os.path.abspath(os.path.join(os.path.expanduser(spec.runs_dir), run_id))
    layout = _layout(spec, executor)
    threads = rank_threads(spec, executor, layout.nodes * layout.ranks_per_node)
    env = job_environment(spec, run_dir, layout.backend, threads, os.environ)
    chosen_env = dict(env)  # what decides how ranks start: the snapshot's rewrite needs no fresh interpreter
    env.update(snapshot_variables(code, env, os.environ))
    sweep = _sweep(spec, run_dir)
    python = spec.slurm.python if executor == "slurm" and spec.slurm.python is not None else sys.executable
    params = submitit_parameters(spec, n_points=len(sweep)) if executor == "slurm" else None
    srun = rank_log = None
    if params is not None:
        rank_log = str(RunFolder.of(run_dir).slurm_log("%A_%a" if sweep else "%j", "%t"))
        srun = srun_argv(rank_log, run_dir, python, srun_cpus_per_task(spec),
                         container_settings(spec, run_dir, code), spec.gpus_per_node,
                         os.path.abspath(spec.workdir) if spec.workdir else os.getcwd())
    payload = _payload(spec, run_id, run_dir, layout, env, python, srun, rank_log, code)
    start, start_note = _rank_start(spec, executor, chosen_env)
    common: dict[str, Any] = dict(
        run_id=run_id, run_dir=run_dir, executor=executor, spec=spec,
        nodes=layout.nodes, ranks_per_node=layout.ranks_per_node,
        world_size=layout.nodes * layout.ranks_per_node, backend=layout.backend,
        notes=layout.notes + ([start_note] if start_note else []), payload=payload, sweep=sweep, rank_start=start,
        code=code.summary() if code is not None else None,
        cpus=cpus_line(spec, executor, layout.nodes * layout.ranks_per_node, env.get("OMP_NUM_THREADS"), threads),
        interfaces=planned_interfaces(payload, executor, SLURM_RULES["interface"]).line(),
    )
    shown = _shown_payload(payload, bool(sweep))
    if params is not None:
        folder = str(RunFolder.of(run_dir).slurm)
        chunks = array_chunks(len(sweep), max_array_size)
        scripts = [render_sbatch(params, folder, job_command(run_dir, spec.slurm.python, chunk[0]), n_points=len(chunk))
                   for chunk in chunks] or [render_sbatch(params, folder, job_command(run_dir, spec.slurm.python))]
        with paused_gc():
            rows = _slurm_rows(spec, shown)
        launch = LaunchPlan(**common, ranks=rows, submitit=params, sbatch_script=scripts[0], sbatch_scripts=scripts,
                            array_chunks=chunks)
    else:
        with paused_gc():
            rows = _local_rows(run_id, shown)
        launch = LaunchPlan(**common, ranks=rows)
    launch._snapshot = code
    return launch


def _rank_start(spec: JobSpec, executor: ExecutorName, env: Mapping[str, str]) -> tuple[str, str | None]:
    """How the ranks' processes start, and the plan's note when that is not the default. A forked
    rank cannot honour a variable read at interpreter start-up (PYTHONPATH, PYTHONHASHSEED,
    LD_PRELOAD...), so a job whose ``env`` sets one starts fresh interpreters instead."""
    if executor == "slurm":
        return "fresh", None
    if executor == "debug":
        late = startup_variables(env, os.environ)
        return "in-process", (f"debug executor: the rank runs in this process, which started without "
                              f"{', '.join(late)}; they are set but cannot take effect" if late else None)
    if not spec.local.preload_torch:
        return "fresh", None
    if not platform_caps.fork_after_torch_safe():
        return "fresh", (f"local: each rank starts a fresh interpreter, since forking after import torch is not "
                         f"safe on {platform_caps.system_name()}")
    late = startup_variables(env, os.environ)
    if late:
        return "fresh", (f"local: each rank starts a fresh interpreter, since env sets {', '.join(late[:5])}"
                         f"{' and more' if len(late) > 5 else ''}, read only when an interpreter starts")
    return "fork", None


def _shown_payload(payload: Payload, sweep: bool) -> Payload:
    """The payload the rank table is built from: in a sweep every point has its own folder and
    checkpoints, shown as the rule that names them."""
    if not sweep:
        return payload
    index = "<point index, 4 digits>"
    return dataclasses.replace(payload, run_dir=str(RunFolder.of(payload.run_dir).points / index),
                               run_id=f"{payload.run_id}-point-{index}",
                               checkpoint=dataclasses.replace(payload.checkpoint,
                                                              dir=os.path.join(payload.checkpoint.dir, f"point-{index}")))


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


# ---- layout --------------------------------------------------------------------------------
class _Layout(BaseModel):
    nodes: int
    ranks_per_node: int
    backend: str
    interface: Optional[str]
    devices: Optional[list[int]]
    notes: list[str]


def _layout(spec: JobSpec, executor: ExecutorName) -> _Layout:
    if executor == "slurm":
        iface = spec.distributed.interface_names()
        return _Layout(nodes=spec.nodes, ranks_per_node=spec.ranks_per_node, backend=spec.resolved_backend,
                       interface=",".join(iface) if iface else "auto", devices=None, notes=[])
    notes: list[str] = []
    if executor == "debug":
        nodes, rpn = 1, 1
        if spec.world_size > 1:
            notes.append(f"debug executor: 1 rank in process (the spec has {spec.world_size})")
    else:
        nodes, rpn = spec.local_shape()
        if (nodes, rpn) != (spec.nodes, spec.ranks_per_node):
            notes.append(
                f"local dry run: {nodes} emulated node(s) x {rpn} rank(s) instead of "
                f"{spec.nodes} x {spec.ranks_per_node}; same code path and variables"
            )
    backend = spec.local_backend()
    if backend != spec.resolved_backend:
        notes.append(f"local dry run: {spec.resolved_backend} -> {backend} on CPU (no local.devices given)")
    if spec.distributed.interface_names():
        notes.append(f"local dry run: interface {spec.distributed.interface!r} -> "
                     f"{platform_caps.loopback_interface()!r} (all ranks on this machine)")
    if spec.distributed.init_method == "file" and nodes > 1:
        notes.append("local dry run: the file:// rendezvous is on this machine, which every emulated node shares")
    return _Layout(nodes=nodes, ranks_per_node=rpn, backend=backend, interface=platform_caps.loopback_interface(),
                   devices=spec.local.devices, notes=notes)


def snapshot_variables(code: Snapshot | None, env: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """The variables the code snapshot rewrites, as every rank gets them: a ``PYTHONPATH`` (the
    spec's, else the one exported here, which reaches the ranks) naming folders of the project
    names their place in the tree first, so the ranks, their children and ``plan`` agree."""
    value = env.get("PYTHONPATH", environ.get("PYTHONPATH"))
    if code is None or not value:
        return {}
    moved = code.pythonpath(value)
    return {"PYTHONPATH": moved} if moved != value else {}


#: PyTorch's NCCL debugging aids that jobs get by default (each can be turned off in the spec).
NCCL_ASYNC_ERRORS = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
NCCL_TRACE_BUFFER = "2000"  # entries kept per rank; a ring buffer of recent collectives


def rank_threads(spec: JobSpec, executor: ExecutorName, local_ranks: int) -> int | str:
    """Each rank's OMP_NUM_THREADS default: on SLURM ``slurm.cpus_per_task``, or without it the
    rank's share of its node's granted CPUs, a rule the job's agent resolves
    (``rank_env.cpu_share_rule``); locally this machine's usable CPUs divided among the ranks."""
    if executor != "slurm":
        return thread_count_local(usable_cpus(), local_ranks)
    return spec.slurm.cpus_per_task if spec.slurm.cpus_per_task is not None else cpu_share_rule(spec.ranks_per_node)


def srun_cpus_per_task(spec: JobSpec) -> int | str:
    """The ranks' srun --cpus-per-task: ``slurm.cpus_per_task`` (times the node's GPUs for strategy
    dp's one rank), as sbatch asks for it; without it the rank's share of its node's granted CPUs,
    resolved by the job's agent (``rank_env.cpu_share_rule``)."""
    s = spec.slurm
    if s.cpus_per_task is None:
        return cpu_share_rule(spec.ranks_per_node)
    return s.cpus_per_task * (max(1, spec.gpus_per_node) if spec.strategy == "dp" else 1)


def cpus_line(spec: JobSpec, executor: ExecutorName, ranks: int, threads: str | None, default: int | str) -> str:
    """Where each rank's CPU count comes from, in one line for ``plan``."""
    s, rpn = spec.slurm, spec.ranks_per_node
    if executor != "slurm":
        line = (f"locally the {ranks} rank(s) share this machine's {usable_cpus()} usable CPU(s) "
                f"(OMP_NUM_THREADS={default} each)")
    elif s.cpus_per_task is not None:
        cpus = srun_cpus_per_task(spec)
        dp = f" (slurm.cpus_per_task {s.cpus_per_task} x {max(1, spec.gpus_per_node)} GPU(s): strategy dp's one " \
             f"rank per node)" if spec.strategy == "dp" and cpus != s.cpus_per_task else ""
        line = (f"{cpus} per rank{dp}, as slurm.cpus_per_task asks (sbatch and the ranks' srun "
                f"--cpus-per-task={cpus}); OMP_NUM_THREADS={default}")
    else:
        asked = (f"slurm.cpus_per_gpu asks for {s.cpus_per_gpu} per GPU (--cpus-per-gpu={s.cpus_per_gpu}, "
                 f"{s.cpus_per_gpu * spec.gpus_per_node} per node)" if s.cpus_per_gpu is not None else
                 "the job asks for no CPU count (no slurm.cpus_per_task or slurm.cpus_per_gpu), so the site's "
                 "defaults decide each node's CPUs (DefCpuPerGPU; at least 1 per rank)")
        line = (f"{default} per rank, known when the job starts: {asked}; the job's agent shares the CPUs SLURM "
                f"granted a node equally among its {rpn} rank(s) (srun --cpus-per-task, OMP_NUM_THREADS)")
    if threads is not None and threads != str(default):
        line += f"; OMP_NUM_THREADS={threads} as you set it"
    return "CPUs: " + line


def job_environment(spec: JobSpec, run_dir: str, backend: str, threads: int | str,
                    environ: Mapping[str, str]) -> dict[str, str]:
    """The variables every rank gets on top of the rank contract, computed once (the payload carries
    them, the plan's rows show them): the CPU thread default (on SLURM without slurm.cpus_per_task
    the rule the job's agent resolves, ``rank_threads``), the C heap settings
    (``orchestrator.malloc``), the NCCL aids for nccl jobs, then the spec's ``env``, which wins.
    A default the user already exported in their own environment (which reaches the ranks on
    either executor) is left to theirs."""
    defaults = {"OMP_NUM_THREADS": str(threads), **MALLOC_DEFAULTS}
    if backend == "nccl":
        d = spec.distributed
        if d.nccl_async_error_handling:
            defaults.update(NCCL_ASYNC_ERRORS)
        if d.nccl_flight_recorder:  # torch >= 2.8 names; the launcher adds the old ones for older torch
            defaults.update({"TORCH_FR_BUFFER_SIZE": NCCL_TRACE_BUFFER, "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                             "TORCH_FR_DUMP_TEMP_FILE": str(RunFolder.of(run_dir).nccl_trace_prefix)})
    env = {name: environ.get(name) or value for name, value in defaults.items()}
    env.update(spec.env)
    return env


def _payload(spec: JobSpec, run_id: str, run_dir: str, layout: _Layout, env: dict[str, str], python: str,
             srun: list[str] | None, rank_log: str | None, code: Snapshot | None) -> Payload:
    d, c, r = spec.distributed, spec.checkpoint, spec.recovery
    entry = spec.entrypoint if ":" in spec.entrypoint and not spec.entrypoint.endswith(".py") else os.path.abspath(spec.entrypoint)
    # Relative paths the user wrote are relative to where they ran the CLI; with a snapshot, the
    # entrypoint and that folder are read from its tree.
    source_dir = os.getcwd()
    if code is not None:
        entry = (code.in_tree(os.path.realpath(entry)) or entry) if entry.startswith("/") else entry
        source_dir = code.in_tree(os.path.realpath(source_dir)) or source_dir
    folder = RunFolder.of(run_dir)
    return Payload(
        version=PAYLOAD_VERSION,
        job_name=spec.name,
        entrypoint=entry,
        argv=tuple(render_argv(dict(spec.args), spec.extra_args, spec.bool_args)),
        strategy=spec.strategy,
        nodes=layout.nodes,
        ranks_per_node=layout.ranks_per_node,
        backend=layout.backend,
        init_method=d.init_method,
        port=d.port,
        interface=layout.interface,
        rendezvous_dir=os.path.abspath(d.rendezvous_dir) if d.rendezvous_dir else str(folder.rendezvous),
        init_timeout_s=d.init_timeout_s,
        collective_timeout_s=d.collective_timeout_s,
        devices=tuple(layout.devices) if layout.devices else None,
        run_dir=run_dir,
        checkpoint=CheckpointSettings(dir=os.path.abspath(c.dir) if c.dir else str(folder.checkpoints),
                                      interval_steps=c.interval_steps, keep_last=c.keep_last, resume=c.resume),
        max_requeues=spec.slurm.max_requeues,
        requeue=spec.slurm.requeue,
        stop_signal=f"SIG{spec.slurm.signal}",
        signal_margin_s=spec.slurm.signal_margin_s,
        stop_grace_s=spec.stop_grace_s,
        grad_compression=d.grad_compression,
        env=env,
        workdir=os.path.abspath(spec.workdir) if spec.workdir else os.getcwd(),
        source_dir=source_dir,
        watchdog=WatchdogSettings(stall_s=spec.watchdog.stall_s, stacks_on_failure=spec.watchdog.stacks_on_failure),
        recovery=RecoverySettings(max_restarts=r.max_restarts, on=tuple(r.on), exclude_failed_nodes=r.exclude_failed_nodes,
                                  health_check=r.health_check, node_check=tuple(r.node_check) if r.node_check else None,
                                  stop_without_progress=r.stop_without_progress),
        python=python,
        code=CodeSettings(id=code.id, live_root=code.root, tree=code.tree) if code is not None else None,
        run_id=run_id,
        tracking=tracking.settings(spec.tracking, spec.env, os.environ),
        framework=spec.framework,
        container=container_settings(spec, run_dir, code),
        srun=tuple(srun) if srun else None,
        rank_log=rank_log,
    )


def _sweep(spec: JobSpec, run_dir: str) -> list[SweepPoint]:
    if not spec.sweep:
        return []
    out = []
    for i, point in enumerate(spec.sweep_points()):
        args = {**spec.args, **point}
        out.append(SweepPoint(index=i, args=args, argv=render_argv(args, spec.extra_args, spec.bool_args),
                              run_dir=str(RunFolder.of(run_dir).point(i).root)))
    return out


# ---- rank tables ---------------------------------------------------------------------------
def _local_rows(run_id: str, payload: Payload) -> list[RankRow]:
    """Every local rank's environment as the supervisor will build it for the first attempt: the
    planned port (the supervisor takes the next free one should it be taken by then)."""
    port = int(payload.port) if payload.port != "auto" else derive_port(run_id, 0)
    rfile = rendezvous_file(payload.rendezvous_dir, run_id, 0)
    torch_version = installed_torch_version(payload.env)
    rows = []
    for rank in range(payload.world_size):
        contract = local_rank_env(payload, rank, port, rfile)
        env = rank_environment(contract, payload, attempt=0, torch_version=torch_version)
        node, local = divmod(rank, payload.ranks_per_node)
        rows.append(RankRow(rank=rank, local_rank=local, node_rank=node, host=f"local-node{node}", env=env))
    return rows


#: What a SLURM rank's values are made of, where only the job knows them.
SLURM_RULES = {
    "master_addr": "<first host of SLURM_JOB_NODELIST>",
    "port": "<derive_port(SLURM_JOB_ID, restart), or the next port free on the master's node: 20000-31999>",
    "interface": "<interface that routes to MASTER_ADDR>",
    "job": "<SLURM_JOB_ID>",
    "restart": "<restart>",
    "attempt": "<SLURM_RESTART_COUNT: 0, then one more per requeue or restart>",
    "visible": "<the node's GPUs as SLURM sets them; LOCAL_RANK indexes them>",
}


def _slurm_rows(spec: JobSpec, payload: Payload) -> list[RankRow]:
    """Every SLURM rank's environment, with the values only the job knows shown as their rules
    (``SLURM_RULES``); built by the same ``rank_environment`` each rank calls."""
    rpn, d = payload.ranks_per_node, spec.distributed
    addr, iface = SLURM_RULES["master_addr"], ",".join(d.interface_names()) or SLURM_RULES["interface"]
    port = d.port if d.port != "auto" else SLURM_RULES["port"]
    rfile = rendezvous_file(payload.rendezvous_dir, SLURM_RULES["job"], SLURM_RULES["restart"])
    marker = str(RunFolder.of(payload.run_dir).requeue_marker(SLURM_RULES["job"], SLURM_RULES["restart"]))  # type: ignore[arg-type]
    torch_version = installed_torch_version(payload.env)
    interfaces = planned_interfaces(payload, "slurm", SLURM_RULES["interface"])
    # One template per local rank, copied per node (a C-level dict copy): linear, and several times
    # faster than building each row's dict in a plan of tens of thousands of ranks.
    templates = []
    for local in range(rpn):
        contract = RankEnv(rank="", local_rank=local, world_size=spec.world_size, local_world_size=rpn, node_rank="",
                           nnodes=spec.nodes, master_addr=addr, master_port=port,
                           init_method=init_url(d.init_method, addr, port, rfile), interface=iface,
                           visible_devices=SLURM_RULES["visible"] if spec.gpus_per_node else None, source="plan",
                           interfaces=interfaces)
        templates.append(rank_environment(contract, payload, SLURM_RULES["attempt"], marker, torch_version))
    rows = []
    for node in range(spec.nodes):
        node_text, host = str(node), f"<node {node} of the allocation>"
        for local, template in enumerate(templates):
            rank = node * rpn + local
            env = template.copy()
            env["RANK"], env["NODE_RANK"], env["GROUP_RANK"] = str(rank), node_text, node_text
            rows.append(RankRow(rank=rank, local_rank=local, node_rank=node, host=host, env=env))
    return rows


# ---- SLURM rendering -----------------------------------------------------------------------
def submitit_parameters(spec: JobSpec, n_points: int = 0) -> dict[str, Any]:
    """The parameters given to submitit's SlurmExecutor.update_parameters, by submitit's names."""
    s = spec.slurm
    params: dict[str, Any] = {
        "job_name": spec.name,
        "nodes": spec.nodes,
        "ntasks_per_node": spec.ranks_per_node,
        "time": s.time_minutes,
        "signal_delay_s": s.signal_margin_s,
        # The batch script runs the job's agent (orchestrator.slurm_job), which runs srun itself.
        "use_srun": False,
        # One log per rank with stdout and stderr interleaved, as the local executor writes it:
        # `logs --rank N` shows the traceback next to the output that led to it.
        "stderr_to_stdout": True,
    }
    gpus = f"{s.gpu_type}:{spec.gpus_per_node}" if s.gpu_type and spec.gpus_per_node else spec.gpus_per_node
    optional = {
        # No --cpus-per-task unless the spec sets it: asking for one switches off the site's
        # DefCpuPerGPU (slurm.conf: used only "if the job didn't specify --cpus-per-task"), and the
        # job's agent gives each rank its share of what SLURM granted instead.
        "cpus_per_task": srun_cpus_per_task(spec) if s.cpus_per_task is not None else None,
        # --gpus-per-node=TYPE:N (not --gres=gpu:TYPE:N): the GPU-specific option of SLURM >= 19.05,
        # which the srun steps inherit and which SLURM's GPU binding and cgroups act on.
        "gpus_per_node": gpus or None, "partition": s.partition, "account": s.account,
        "qos": s.qos, "constraint": s.constraint, "exclusive": True if s.exclusive else None,
        # submitit's own parameters, rendered as written (no unit conversion, unlike its mem).
        "mem_per_cpu": s.mem_per_cpu, "mem_per_gpu": s.mem_per_gpu,
        # None (submitit's default is 'submitit'): no wckey unless the spec names one (submitit_adapter).
        "wckey": s.wckey,
        "setup": list(s.setup) or None, "additional_parameters": dict(s.extra_sbatch) or None,
    }
    params.update({k: val for k, val in optional.items() if val is not None})
    # The time-limit signal goes to the batch shell only (B:): the agent forwards it to the ranks
    # through srun, and so knows it came.
    params["additional_parameters"] = {**params.get("additional_parameters", {}),
                                       "signal": f"B:{s.signal}@{s.signal_margin_s}"}
    restarts = spec.recovery.max_restarts > 0  # recovery requeues the job after a failure
    if s.max_requeues == 0 and not restarts:  # SLURM requeues batch jobs on node failure by default (JobRequeue=1)
        params["additional_parameters"] = {**params.get("additional_parameters", {}), "no-requeue": True}
    elif s.requeue != "never" or restarts:  # sites with JobRequeue=0 refuse scontrol requeue unless the job asked
        params["additional_parameters"] = {**params.get("additional_parameters", {}), "requeue": True}
    if restarts and "node_failure" in spec.recovery.on:
        # A lost node ends the ranks' step, not the job: its agent requeues it without that node.
        params["additional_parameters"] = {**params.get("additional_parameters", {}), "no-kill": True}
    for option in ("nodelist", "exclude"):
        if getattr(s, option):
            params["additional_parameters"] = {**params.get("additional_parameters", {}), option: getattr(s, option)}
    if s.mem:
        params["additional_parameters"] = {**params.get("additional_parameters", {}), "mem": s.mem}
    # Options submitit has no parameter for, or one it warns about: its cpus_per_gpu warns that it
    # "requires gpus_per_task", which SLURM does not (--cpus-per-gpu works with --gpus-per-node).
    for option, value in (("cpus-per-gpu", s.cpus_per_gpu), ("reservation", s.reservation)):
        if value is not None:
            params["additional_parameters"] = {**params.get("additional_parameters", {}), option: value}
    return params


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask: taskset, an salloc on a big node, a
    cgroup cpuset), not the machine's core count."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def python_command(python: str | None) -> str:
    """The interpreter as the shell must see it: one quoted word (submitit pastes its ``python``
    argument into the srun line as written, so it always gets this, never the raw field)."""
    return shlex.quote(python if python is not None else sys.executable)


def job_command(run_dir: str, python: str | None, point_base: int = 0) -> str:
    """The batch script's one command: the job's agent (stdlib only; no submitit, no pickle). It
    replaces the batch shell (exec), so the time-limit signal (B:USR2) reaches it and nothing else."""
    argv = module_argv(python if python is not None else sys.executable, "orchestrator.slurm_job",
                       str(RunFolder.of(run_dir).payload))
    words = ["exec", python_command(python), *map(shlex.quote, argv[1:])]
    return " ".join(words + ([f"--point-base {point_base}"] if point_base else []))


def srun_argv(rank_log: str, run_dir: str, python: str, cpus_per_task: int | str = 1,
              container: ContainerSettings | None = None, gpus_per_node: int = 0, workdir: str = "") -> list[str]:
    """What the agent runs: one srun task per rank, each the stdlib-only SLURM rank entry. An argv,
    never a shell line. Logs are named as submitit names them (<job>_<task>_log.out).

    ``--cpus-per-task`` again: since SLURM 22.05 srun no longer inherits it from the batch job,
    so under task/affinity every rank would be bound to one CPU while OMP_NUM_THREADS says more
    (and its DataLoader workers would inherit that one-CPU mask). ``cpus_per_task`` may be the
    rule ``rank_env.cpu_share_rule``, which the agent resolves before it runs srun.

    ``container``: the rank runs inside it (``orchestrator.container``); srun and the agent stay on the host."""
    head = ["srun", "--unbuffered", "--output", rank_log, "--kill-on-bad-exit=1", f"--cpus-per-task={cpus_per_task}"]
    payload = str(RunFolder.of(run_dir).payload)
    if container is not None:
        return head + srun_tail(container, run_dir, workdir or os.getcwd(), payload, gpus_per_node)
    return head + module_argv(python, "orchestrator.slurm_rank", payload)


def render_sbatch(params: dict[str, Any], folder: str, command: str, n_points: int = 0) -> str:
    """Render with submitit's own template, exactly as the SLURM executor submits it."""
    from orchestrator import submitit_adapter  # the module that will submit it

    return submitit_adapter.render_sbatch(params, folder, command, n_points)


def array_chunks(n_points: int, max_array_size: int) -> list[list[int]]:
    """Split sweep indices into arrays that each fit under MaxArraySize (task ids < MaxArraySize)."""
    size = max(1, max_array_size - 1)
    return [list(range(i, min(i + size, n_points))) for i in range(0, n_points, size)]

