"""JobSpec -> LaunchPlan: the generic planner. Pure: no subprocess, no writes, nothing read from
the cluster.

The plan is what ``orchestrator plan`` prints and what the executors carry out: the run folder,
the payload each rank reads, the table of every rank's environment, and what the backend adds
(for SLURM the submitit parameters and the sbatch scripts, rendered by submitit's own code). What
differs between backends is asked of the executor's planner (``orchestrator.backends``:
``local_plan``, ``slurm_plan``); this module imports no backend.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from orchestrator.core import lean_record
from orchestrator import backends
from orchestrator.node import tracking
from orchestrator.node.container import container_settings
from orchestrator.node.malloc import MALLOC_DEFAULTS
from orchestrator.core.payload import (PAYLOAD_VERSION, CheckpointSettings, CodeSettings, Payload, RecoverySettings,
                                  WatchdogSettings, is_script)
from orchestrator.plan.plan_model import (BackendPlanner, Launcher, LaunchPlan, Layout, RankRow, SweepPoint, paused_gc,
                                     usable_cpus)
from orchestrator.core.run_folder import RunFolder
from orchestrator.code.snapshot import Snapshot
from orchestrator.spec.models import ExecutorName, JobSpec, render_value
from orchestrator.spec.validators import printable

#: Re-exported: what the executors, display and tests import from here.
__all__ = ["LaunchPlan", "RankRow", "SweepPoint", "paused_gc", "plan", "render_argv", "run_id_for", "usable_cpus"]


def run_id_for(spec: JobSpec) -> str:
    """A stable id: a spec that trains the same thing always maps to the same run folder (and
    resumes there), whatever its operational fields say (``orchestrator.spec.identity`` has the rule)."""
    from orchestrator.spec.identity import run_id

    return run_id(spec)


def render_argv(args: dict[str, Any], extra: list[str], bools: str = "flag") -> list[str]:
    """{'lr': 0.1, 'amp': True, 'sizes': [1, 2]} -> ['--lr', '0.1', '--amp', '--sizes', '1', '2'].
    ``bools``: the spec's ``bool_args``; with 'value', {'amp': False} -> ['--amp', 'false']."""
    argv: list[str] = []
    for key, value in args.items():
        if value is not False or bools == "value":
            argv += [f"--{key}", *render_value(value, bools)]
    return argv + list(extra)


def plan(spec: JobSpec, executor: ExecutorName | None = None, max_array_size: int | None = None,
         code: Snapshot | None = None, array_limit_why: str | None = None) -> LaunchPlan:
    """``spec``: validated (``api.plan_for`` validates once, with the executor it plans for).
    ``executor``: another executor than the spec's, whose own rules apply (local caps, node-local
    paths): the spec is validated again for it by its constructor. ``max_array_size``: the
    cluster's MaxArraySize, which ``api.plan_for`` asks as submit does; None: SLURM's default is
    assumed, and the plan says so (with ``array_limit_why``, why no cluster answered). ``code``:
    the scanned project (``snapshot.scan``); the ranks then import from its tree. The scan reads
    the disk and runs git, so it is the caller's (``api.plan_for``), not the plan's."""
    executor = executor or spec.executor
    if executor != spec.executor:
        spec = JobSpec(**{**spec.model_dump(mode="json", exclude_defaults=True), "executor": executor})
    backend = backends.planner(executor)
    run_id = run_id_for(spec)
    run_dir = os.path.abspath(os.path.join(os.path.expanduser(spec.runs_dir), run_id))
    layout = backend.layout(spec)
    threads = backend.threads(spec, layout.nodes * layout.ranks_per_node)
    env = job_environment(spec, run_dir, layout.backend, threads, os.environ)
    chosen_env = dict(env)  # what decides how ranks start: the snapshot's rewrite needs no fresh interpreter
    env.update(snapshot_variables(code, env, os.environ))
    sweep = _sweep(spec, run_dir)
    python = backend.python(spec)
    payload = _payload(spec, run_id, run_dir, layout, env, python, backend.launcher(spec, run_dir, python, code,
                                                                                    bool(sweep)), code)
    start, start_note = backend.rank_start(spec, chosen_env)
    array_note = backend.array_note(len(sweep), max_array_size, array_limit_why)
    launch = LaunchPlan(
        run_id=run_id, run_dir=run_dir, executor=executor, spec=spec,
        nodes=layout.nodes, ranks_per_node=layout.ranks_per_node,
        world_size=layout.nodes * layout.ranks_per_node, backend=layout.backend,
        notes=layout.notes + [n for n in (start_note, array_note) if n], payload=payload, sweep=sweep,
        rank_start=start, code=code.summary() if code is not None else None,
        cpus=cpus_line(backend, spec, layout.nodes * layout.ranks_per_node, env.get("OMP_NUM_THREADS"), threads),
        interfaces=backend.interfaces(payload).line(),
        **backend.launch_fields(spec, run_id, run_dir, _shown_payload(payload, bool(sweep)), len(sweep),
                                max_array_size))
    launch._snapshot = code
    return launch


def _shown_payload(payload: Payload, sweep: bool) -> Payload:
    """The payload the rank table is built from: in a sweep every point has its own folder and
    checkpoints, shown as the rule that names them."""
    if not sweep:
        return payload
    index = tracking.POINT_RULE
    return lean_record.replace(payload, run_dir=str(RunFolder.of(payload.run_dir).points / index),
                               run_id=f"{payload.run_id}-point-{index}",
                               checkpoint=lean_record.replace(payload.checkpoint,
                                                              dir=os.path.join(payload.checkpoint.dir, f"point-{index}")))


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


def cpus_line(backend: BackendPlanner, spec: JobSpec, ranks: int, threads: str | None, default: int | str) -> str:
    """Where each rank's CPU count comes from, in one line for ``plan``. ``threads`` may come from
    the user's environment, so its control characters are escaped (it must not write to the terminal)."""
    line = backend.cpus_line(spec, ranks, default)
    if threads is not None and threads != str(default):
        line += f"; OMP_NUM_THREADS={printable(threads)} as you set it"
    return "CPUs: " + line


def job_environment(spec: JobSpec, run_dir: str, backend: str, threads: int | str,
                    environ: Mapping[str, str]) -> dict[str, str]:
    """The variables every rank gets on top of the rank contract, computed once (the payload carries
    them, the plan's rows show them): the CPU thread default (on SLURM without slurm.cpus_per_task
    the rule the job's agent resolves: the backend planner's ``threads``), the C heap settings
    (``orchestrator.node.malloc``), the NCCL aids for nccl jobs, then the spec's ``env``, which wins.
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


def _payload(spec: JobSpec, run_id: str, run_dir: str, layout: Layout, env: dict[str, str], python: str,
             launcher: Launcher, code: Snapshot | None) -> Payload:
    d, c, r = spec.distributed, spec.checkpoint, spec.recovery
    entry = os.path.abspath(spec.entrypoint) if is_script(spec.entrypoint) else spec.entrypoint
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
        watchdog=WatchdogSettings(stall_s=spec.watchdog.stall_s, stacks_on_failure=spec.watchdog.stacks_on_failure,
                                  straggler_factor=spec.watchdog.straggler_factor,
                                  straggler_window_s=spec.watchdog.straggler_window_s),
        recovery=RecoverySettings(max_restarts=r.max_restarts, on=tuple(r.on), exclude_failed_nodes=r.exclude_failed_nodes,
                                  health_check=r.health_check, node_check=tuple(r.node_check) if r.node_check else None,
                                  stop_without_progress=r.stop_without_progress, spares=r.spares,
                                  in_allocation=r.in_allocation, survivors=r.survivors,
                                  standbys=r.standbys),
        python=python,
        code=CodeSettings(id=code.id, live_root=code.root, tree=code.tree) if code is not None else None,
        run_id=run_id,
        tracking=tracking.settings(spec.tracking, spec.env, os.environ),
        framework=spec.framework,
        container=container_settings(spec, run_dir, code),
        srun=tuple(launcher.srun) if launcher.srun else None,
        rank_log=launcher.rank_log)


def _sweep(spec: JobSpec, run_dir: str) -> list[SweepPoint]:
    points = [{**spec.args, **point} for point in spec.sweep_points()] if spec.sweep else []
    return [SweepPoint(index=i, args=args, argv=render_argv(args, spec.extra_args, spec.bool_args),
                       run_dir=str(RunFolder.of(run_dir).point(i).root)) for i, args in enumerate(points)]

