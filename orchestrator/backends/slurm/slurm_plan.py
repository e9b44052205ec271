"""SLURM's part of a plan: the sbatch parameters (submitit's names) and script, rendered by
submitit's own template through ``orchestrator.backends.slurm.submitit_adapter`` (so what ``plan`` shows is
what is submitted), the srun argv the job's agent runs, the rank table with the values only the
job knows shown as their rules, and the sweep's split into arrays under MaxArraySize. It
refuses a runs_dir, checkpoint.dir or rendezvous folder that is node-local once resolved from the
folder the job is planned in (``resolved_path_problems``): only here, on the host that submits,
is that folder the one the job is submitted from.

``SlurmPlanner`` is what the generic planner (``orchestrator.plan``) asks, through
``orchestrator.backends``; the SLURM executor imports the rest. Pure: the cluster's MaxArraySize
is asked by ``api.plan_for`` (as submit asks it) and given to the plan.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import TYPE_CHECKING, Any, Mapping

from orchestrator.node.container import container_settings, srun_tail
from orchestrator.core.interpreter import module_argv
from orchestrator.core.netif import InterfaceChoice
from orchestrator.core.payload import ContainerSettings, Payload, RecoverySettings
from orchestrator.plan.plan_model import Launcher, Layout, RankRow, paused_gc
from orchestrator.node.rank_env import RankEnv, cpu_share_rule, installed_torch_version, planned_interfaces, rank_environment
from orchestrator.core.rendezvous import init_url, rendezvous_file
from orchestrator.core.run_folder import RunFolder
from orchestrator.backends.slurm import submitit_adapter
from orchestrator.backends.slurm.node.slurm_task import ATTEMPT_VARIABLE, DEFAULT_MAX_ARRAY_SIZE, POINT_BASE_OPTION
from orchestrator.code.snapshot import Snapshot
from orchestrator.core.errors import SpecError
from orchestrator.spec import validators as v
from orchestrator.spec.models import JobSpec, allocated_nodes

if TYPE_CHECKING:
    from orchestrator.plan.plan_model import LaunchPlan


#: What a SLURM rank's values are made of, where only the job knows them.
SLURM_RULES = {
    "master_addr": "<first host of the ranks' step (SLURM_STEP_NODELIST)>",
    "port": "<derive_port(SLURM_JOB_ID, attempt), or the next port free on the master's node: 20000-31999>",
    "interface": "<interface that routes to MASTER_ADDR>",
    "job": "<SLURM_JOB_ID>",
    "restart": "<restart>",
    "attempt": "<the job's attempt: 0, then one more per requeue or restart (ORCH_JOB_ATTEMPT)>",
    "visible": "<the node's GPUs as SLURM sets them; LOCAL_RANK indexes them>",
}


def slurm_rows(spec: JobSpec, payload: Payload) -> list[RankRow]:
    """Every SLURM rank's environment, with the values only the job knows shown as their rules
    (``SLURM_RULES``); built by the same ``rank_environment`` each rank calls."""
    rpn, d = payload.ranks_per_node, spec.distributed
    addr, iface = SLURM_RULES["master_addr"], ",".join(d.interface_names()) or SLURM_RULES["interface"]
    port = d.port if d.port != "auto" else SLURM_RULES["port"]
    rfile = rendezvous_file(payload.rendezvous_dir, SLURM_RULES["job"], SLURM_RULES["restart"])
    marker = str(RunFolder.of(payload.run_dir).requeue_marker(SLURM_RULES["job"], SLURM_RULES["restart"]))  # type: ignore[arg-type]
    torch_version = installed_torch_version(payload.env)
    interfaces = planned_interfaces(payload, False, SLURM_RULES["interface"])
    # One template per local rank, copied per node (a C-level dict copy): linear, and several times
    # faster than building each row's dict in a plan of tens of thousands of ranks.
    templates = []
    for local in range(rpn):
        contract = RankEnv(rank="", local_rank=local, world_size=spec.world_size, local_world_size=rpn, node_rank="",
                           nnodes=spec.nodes, master_addr=addr, master_port=port,
                           init_method=init_url(d.init_method, addr, port, rfile), interface=iface,
                           visible_devices=SLURM_RULES["visible"] if spec.gpus_per_node else None, source="plan",
                           interfaces=interfaces)
        template = rank_environment(contract, payload, SLURM_RULES["attempt"], marker, torch_version)
        template[ATTEMPT_VARIABLE] = SLURM_RULES["attempt"]  # the job's agent gives it to each step it starts
        templates.append(template)
    rows = []
    for node in range(spec.nodes):
        node_text, host = str(node), f"<node {node} of the allocation>"
        for local, template in enumerate(templates):
            rank = node * rpn + local
            env = template.copy()
            env["RANK"], env["NODE_RANK"], env["GROUP_RANK"] = str(rank), node_text, node_text
            rows.append(RankRow(rank=rank, local_rank=local, node_rank=node, host=host, env=env))
    return rows



class SlurmPlanner:
    """The SLURM backend's decisions in a plan (``plan_model.BackendPlanner``)."""

    def layout(self, spec: JobSpec) -> Layout:
        """The job's shape; first, the refusal of a path that is node-local once resolved here
        (``resolved_path_problems``): the plan asks the layout before anything else."""
        refuse_node_local_paths(spec)
        spares = spec.recovery.spares
        notes = [f"recovery.spares: {spares}: the job holds {allocated_nodes(spec)} nodes; the ranks run on {spec.nodes} "
                 f"of them (the first healthy ones) and a failed node is replaced by a spare inside the job"] if spares else []
        return Layout(nodes=spec.nodes, ranks_per_node=spec.ranks_per_node, backend=spec.resolved_backend,
                      interface=",".join(spec.distributed.interface_names()) or "auto", devices=None, notes=notes)

    def threads(self, spec: JobSpec, local_ranks: int) -> int | str:
        """``slurm.cpus_per_task``, or without it the rank's share of its node's granted CPUs, a
        rule the job's agent resolves (``rank_env.cpu_share_rule``)."""
        return spec.slurm.cpus_per_task if spec.slurm.cpus_per_task is not None else cpu_share_rule(spec.ranks_per_node)

    def python(self, spec: JobSpec) -> str:
        return spec.slurm.python if spec.slurm.python is not None else sys.executable

    def launcher(self, spec: JobSpec, run_dir: str, python: str, code: Snapshot | None, sweep: bool) -> Launcher:
        rank_log = str(RunFolder.of(run_dir).slurm_log("%A_%a" if sweep else "%j", "%t"))
        srun = srun_argv(rank_log, run_dir, python, srun_cpus_per_task(spec), container_settings(spec, run_dir, code),
                         spec.gpus_per_node, os.path.abspath(spec.workdir) if spec.workdir else os.getcwd(),
                         kill_on_bad_exit=spec.recovery.survivors != "keep")
        return Launcher(srun=srun, rank_log=rank_log)

    def rank_start(self, spec: JobSpec, env: Mapping[str, str]) -> tuple[str, str | None]:
        return "fresh", None

    def cpus_line(self, spec: JobSpec, ranks: int, default: int | str) -> str:
        s, rpn = spec.slurm, spec.ranks_per_node
        if s.cpus_per_task is not None:
            cpus = srun_cpus_per_task(spec)
            dp = f" (slurm.cpus_per_task {s.cpus_per_task} x {max(1, spec.gpus_per_node)} GPU(s): strategy dp's one " \
                 f"rank per node)" if spec.strategy == "dp" and cpus != s.cpus_per_task else ""
            return (f"{cpus} per rank{dp}, as slurm.cpus_per_task asks (sbatch and the ranks' srun "
                    f"--cpus-per-task={cpus}); OMP_NUM_THREADS={default}")
        asked = (f"slurm.cpus_per_gpu asks for {s.cpus_per_gpu} per GPU (--cpus-per-gpu={s.cpus_per_gpu}, "
                 f"{s.cpus_per_gpu * spec.gpus_per_node} per node)" if s.cpus_per_gpu is not None else
                 "the job asks for no CPU count (no slurm.cpus_per_task or slurm.cpus_per_gpu), so the site's "
                 "defaults decide each node's CPUs (DefCpuPerGPU; at least 1 per rank)")
        return (f"{default} per rank, known when the job starts: {asked}; the job's agent shares the CPUs SLURM "
                f"granted a node equally among its {rpn} rank(s) (srun --cpus-per-task, OMP_NUM_THREADS)")

    def interfaces(self, payload: Payload) -> InterfaceChoice:
        return planned_interfaces(payload, False, SLURM_RULES["interface"])

    def launch_fields(self, spec: JobSpec, run_id: str, run_dir: str, shown: Payload, n_points: int,
                      max_array_size: int | None) -> dict[str, Any]:
        """The submission: submitit's parameters, one sbatch script per array chunk (the first
        chunk's alone without a sweep), and the rank table. ``max_array_size``: the cluster's
        (``api.plan_for`` asks it); None: SLURM's default is assumed, and the plan says so."""
        params = submitit_parameters(spec, n_points=n_points)
        folder = str(RunFolder.of(run_dir).slurm)
        chunks = array_chunks(n_points, max_array_size or DEFAULT_MAX_ARRAY_SIZE)
        render = submitit_adapter.render_sbatch  # submitit's own template, exactly as the SLURM executor submits it
        scripts = [render(params, folder, job_command(run_dir, spec.slurm.python, chunk[0]), n_points=len(chunk))
                   for chunk in chunks] or [render(params, folder, job_command(run_dir, spec.slurm.python))]
        with paused_gc():
            rows = slurm_rows(spec, shown)
        return dict(ranks=rows, submitit=params, sbatch_script=scripts[0], sbatch_scripts=scripts, array_chunks=chunks)

    def array_note(self, n_points: int, max_array_size: int | None, why: str | None) -> str | None:
        """The plan's line on how a sweep is split into arrays, and by which MaxArraySize."""
        if not n_points:
            return None
        size = max_array_size or DEFAULT_MAX_ARRAY_SIZE
        arrays = len(array_chunks(n_points, size))
        where = (f"this cluster's MaxArraySize={size}" if max_array_size is not None else
                 f"SLURM's default MaxArraySize={size}, assumed: {why or 'no cluster answered'}; submit "
                 "splits by the cluster's own")
        return f"sweep: {n_points} point(s) in {arrays} job array(s) of at most {max(1, size - 1)} task(s) ({where})"

    def environment_lines(self, launch: LaunchPlan) -> list[str]:
        """The SBATCH_* defaults of this environment that sbatch will apply to the job (account,
        partition, QOS...), so a job's partition or account is never a mystery."""
        from orchestrator.backends.slurm.slurm_env import sbatch_env_line

        return [sbatch_env_line(launch.sbatch_scripts)]

    def recovery_how(self, recovery: RecoverySettings) -> str:
        return recovery_how(recovery)

    def steps_line(self, nodes: int, world: int, per_node: int, payload: Payload) -> str:
        """One srun step for the ranks, and where the health gate runs (in it, or a step before)."""
        from orchestrator.backends.slurm.node.gate_step import runs_in_step
        from orchestrator.node.health import TOKEN_WAIT_S

        ranks = f"one srun step starts the {world} rank(s), {per_node} a node"
        if not payload.recovery.health_check:
            return ranks
        checks = (f"checks itself, and that it sees the job agent's token in the folders the nodes share: one "
                  f"listing of a one-name folder, up to {TOKEN_WAIT_S:g}s for a filesystem slow to show it")
        if runs_in_step(payload, spares_held=payload.recovery.spares > 0):
            return (f"{ranks}; each node's first rank runs the health gate ({checks}), and no entrypoint starts "
                    f"before the job's agent has every node's verdict")
        held = nodes + payload.recovery.spares
        return f"one srun step runs the health gate on the {held} node(s) (each {checks}), then {ranks}"


# ---- paths as the host that submits resolves them ------------------------------------------
#: Why a node-local runs_dir or checkpoint.dir cannot work, as the spec's own check says it.
_WHY_SHARED = {
    "runs_dir": "the nodes read the job's payload there and write its logs and checkpoints where `status` reads them",
    "checkpoint.dir": "a requeued or multi-node job resumes only where the same node wrote, and ranks on other "
                      "nodes find nothing",
}


def resolved_path_problems(spec: JobSpec, cwd: str) -> list[str]:
    """The spec's refusal of node-local paths (``models._node_local_problems``, ``_file_init_problems``),
    made on runs_dir, checkpoint.dir and distributed.rendezvous_dir as the plan resolves them from
    ``cwd``: the default ``runs`` in a project under /tmp, or '../x' reaching it, is as node-local
    as '/tmp/x'. Made here, in the plan, on the host that submits (under ``--remote``, the login
    node, in its checkout), never where the spec is only validated: the laptop's folder is not the
    one the job is submitted from. The same fields lift it (slurm.assume_shared_paths;
    distributed.rendezvous_dir_is_shared for the rendezvous)."""
    problems = [] if spec.slurm.assume_shared_paths else [
        f"{field}: {v.shown(value)} is {v.shown(where, 300)} here, node-local on a cluster: {_WHY_SHARED[field]}; "
        f"give {field} a path on a shared filesystem (absolute, or submit from a folder on one), or set "
        "slurm.assume_shared_paths: true if it really is shared"
        for field, value in (("runs_dir", spec.runs_dir), ("checkpoint.dir", spec.checkpoint.dir))
        if value and (where := v.node_local_from(value, cwd)) is not None]
    return problems + _rendezvous_problems(spec, cwd)


def refuse_node_local_paths(spec: JobSpec, cwd: str | None = None) -> None:
    """Raise SpecError with every ``resolved_path_problems`` from ``cwd`` (default: this process's
    folder, the one the plan resolves relative paths from)."""
    problems = resolved_path_problems(spec, os.getcwd() if cwd is None else cwd)
    if problems:
        raise SpecError(problems)


def _rendezvous_problems(spec: JobSpec, cwd: str) -> list[str]:
    """file:// init across nodes on a folder that is node-local once resolved from ``cwd``."""
    d = spec.distributed
    if d.init_method != "file" or spec.nodes == 1 or d.rendezvous_dir_is_shared:
        return []
    field, value = ("distributed.rendezvous_dir", d.rendezvous_dir) if d.rendezvous_dir else ("runs_dir", spec.runs_dir)
    where = v.node_local_from(value, cwd)
    if where is None:
        return []
    return [f"{field}: file:// init across {spec.nodes} nodes needs a path every node sees, but {v.shown(value)} is "
            f"{v.shown(where, 300)} here, node-local; use a shared filesystem path, init_method tcp, or set "
            "distributed.rendezvous_dir_is_shared: true if it really is shared"]


# ---- SLURM rendering -----------------------------------------------------------------------
def submitit_parameters(spec: JobSpec, n_points: int = 0) -> dict[str, Any]:
    """The parameters given to submitit's SlurmExecutor.update_parameters, by submitit's names."""
    s = spec.slurm
    params: dict[str, Any] = {
        "job_name": spec.name,
        "nodes": allocated_nodes(spec),  # the spares too (recovery.spares): the agent picks the ranks' nodes
        "ntasks_per_node": spec.ranks_per_node,
        "time": s.time_minutes,
        "signal_delay_s": s.signal_margin_s,
        # The batch script runs the job's agent (orchestrator.backends.slurm.node.slurm_job), which runs srun itself.
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
    extra = params["additional_parameters"] = dict(params.get("additional_parameters", {}))
    # The time-limit signal goes to the batch shell only (B:): the agent forwards it to the ranks
    # through srun, and so knows it came.
    extra["signal"] = f"B:{s.signal}@{s.signal_margin_s}"
    restarts = spec.recovery.max_restarts > 0  # recovery requeues the job after a failure
    if s.max_requeues == 0 and not restarts:  # SLURM requeues batch jobs on node failure by default (JobRequeue=1)
        extra["no-requeue"] = True
    elif s.requeue != "never" or restarts:  # sites with JobRequeue=0 refuse scontrol requeue unless the job asked
        extra["requeue"] = True
    if restarts and "node_failure" in spec.recovery.on:
        # A lost node ends the ranks' step, not the job: its agent requeues it without that node.
        extra["no-kill"] = True
    # Options given to sbatch as written. For cpus-per-gpu submitit has a parameter, which warns that it
    # "requires gpus_per_task", which SLURM does not (--cpus-per-gpu works with --gpus-per-node).
    for option, value in (("nodelist", s.nodelist or None), ("exclude", s.exclude or None),
                          ("mem", s.mem or None), ("cpus-per-gpu", s.cpus_per_gpu), ("reservation", s.reservation)):
        if value is not None:
            extra[option] = value
    return params



def recovery_how(recovery: RecoverySettings) -> str:
    """What a restart is on SLURM, as ``plan``'s recovery line says it: with
    ``recovery.in_allocation`` (the default) the job's agent restarts the ranks' step inside the
    job, on the nodes it holds (a blamed node swapped for a spare), and requeues only when too few
    healthy nodes are left; without it every restart is a requeue. (The agent decides this in
    ``agent_recovery``; this sentence must follow it, not say "requeue" for both.)"""
    blamed = " without the nodes blamed" if recovery.exclude_failed_nodes else ""
    if not recovery.in_allocation:
        return f"requeues the job{blamed} (recovery.in_allocation: false)"
    which = "lost or blamed" if recovery.exclude_failed_nodes else "lost"
    spares = f", a {which} node swapped for one of its {recovery.spares} spare(s)" if recovery.spares else ""
    return (f"restarts the ranks inside the allocation (no requeue){spares}; requeues the job{blamed} only when "
            "too few healthy nodes are left in it (recovery.in_allocation)")


def srun_cpus_per_task(spec: JobSpec) -> int | str:
    """The ranks' srun --cpus-per-task: ``slurm.cpus_per_task`` (times the node's GPUs for strategy
    dp's one rank), as sbatch asks for it; without it the rank's share of its node's granted CPUs,
    resolved by the job's agent (``rank_env.cpu_share_rule``)."""
    s = spec.slurm
    if s.cpus_per_task is None:
        return cpu_share_rule(spec.ranks_per_node)
    return s.cpus_per_task * (max(1, spec.gpus_per_node) if spec.strategy == "dp" else 1)


def job_command(run_dir: str, python: str | None, point_base: int = 0) -> str:
    """The batch script's one command: the job's agent (stdlib only; no submitit, no pickle). It
    replaces the batch shell (exec), so the time-limit signal (B:USR2) reaches it and nothing else.
    Every word quoted for the shell, the interpreter too (submitit pastes the command as written)."""
    argv = module_argv(python if python is not None else sys.executable, "orchestrator.backends.slurm.node.slurm_job",
                       str(RunFolder.of(run_dir).payload))
    return " ".join(["exec", *map(shlex.quote, argv), *([f"{POINT_BASE_OPTION} {point_base}"] if point_base else [])])


def srun_argv(rank_log: str, run_dir: str, python: str, cpus_per_task: int | str = 1,
              container: ContainerSettings | None = None, gpus_per_node: int = 0, workdir: str = "",
              kill_on_bad_exit: bool = True) -> list[str]:
    """What the agent runs: one srun task per rank, each the stdlib-only SLURM rank entry. An argv,
    never a shell line. Logs are named as submitit names them (<job>_<task>_log.out).

    ``--cpus-per-task`` again: since SLURM 22.05 srun no longer inherits it from the batch job,
    so under task/affinity every rank would be bound to one CPU while OMP_NUM_THREADS says more
    (and its DataLoader workers would inherit that one-CPU mask). ``cpus_per_task`` may be the
    rule ``rank_env.cpu_share_rule``, which the agent resolves before it runs srun.

    ``container``: the rank runs inside it (``orchestrator.node.container``); srun and the agent stay on the host.
    ``kill_on_bad_exit``: False for ``recovery.survivors: keep``, whose survivors run on when a rank
    fails, or a node (``--no-kill``: 22.05 then keeps the other nodes' tasks running, checked by hand)
    (``orchestrator.backends.slurm.node.agent_survivors``); the agent ends them when they cannot."""
    head = ["srun", "--unbuffered", "--output", rank_log, f"--kill-on-bad-exit={int(kill_on_bad_exit)}",
            *([] if kill_on_bad_exit else ["--no-kill"]), f"--cpus-per-task={cpus_per_task}"]
    payload = str(RunFolder.of(run_dir).payload)
    if container is not None:
        return head + srun_tail(container, run_dir, workdir or os.getcwd(), payload, gpus_per_node)
    return head + module_argv(python, "orchestrator.backends.slurm.node.slurm_rank", payload)


def array_chunks(n_points: int, max_array_size: int) -> list[list[int]]:
    """Split sweep indices into arrays that each fit under MaxArraySize (task ids < MaxArraySize)."""
    size = max(1, max_array_size - 1)
    return [list(range(i, min(i + size, n_points))) for i in range(0, n_points, size)]
