"""The local and debug executors' part of a plan: the emulated shape on this machine (and the
notes on what a dry run changes), how each rank's process starts (forked from the zygote that
imported torch, a fresh interpreter, or in this process), and the rank table as the supervisor
builds it for the first attempt.

``LocalPlanner`` is what the generic planner (``orchestrator.plan``) asks, through
``orchestrator.backends``.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Mapping

from orchestrator.core import platform_caps
from orchestrator.core.netif import InterfaceChoice
from orchestrator.core.payload import Payload
from orchestrator.plan.plan_model import Launcher, Layout, RankRow, paused_gc, usable_cpus
from orchestrator.node.rank_env import (installed_torch_version, local_rank_env, planned_interfaces, rank_environment,
                                   startup_variables, thread_count_local)
from orchestrator.core.rendezvous import derive_port, rendezvous_file
from orchestrator.code.snapshot import Snapshot
from orchestrator.spec.models import ExecutorName, JobSpec

if TYPE_CHECKING:
    from orchestrator.core.payload import RecoverySettings
    from orchestrator.plan.plan_model import LaunchPlan


class LocalPlanner:
    """The local executor's decisions in a plan (``plan_model.BackendPlanner``); ``debug=True``:
    the debug executor's (one rank, in this process)."""

    def __init__(self, debug: bool = False) -> None:
        self.debug = debug
        self.name: ExecutorName = "debug" if debug else "local"

    def layout(self, spec: JobSpec) -> Layout:
        notes: list[str] = []
        if self.debug:
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
        return Layout(nodes=nodes, ranks_per_node=rpn, backend=backend, interface=platform_caps.loopback_interface(),
                      devices=spec.local.devices, notes=notes)

    def threads(self, spec: JobSpec, local_ranks: int) -> int | str:
        """This machine's usable CPUs divided among the ranks."""
        return thread_count_local(usable_cpus(), local_ranks)

    def python(self, spec: JobSpec) -> str:
        return sys.executable

    def launcher(self, spec: JobSpec, run_dir: str, python: str, code: Snapshot | None, sweep: bool) -> Launcher:
        return Launcher()  # the supervisor (or this process) starts the ranks itself

    def rank_start(self, spec: JobSpec, env: Mapping[str, str]) -> tuple[str, str | None]:
        """How the ranks' processes start, and the plan's note when that is not the default. A forked
        rank cannot honour a variable read at interpreter start-up (PYTHONPATH, PYTHONHASHSEED,
        LD_PRELOAD...), so a job whose ``env`` sets one starts fresh interpreters instead."""
        if self.debug:
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

    def cpus_line(self, spec: JobSpec, ranks: int, default: int | str) -> str:
        return (f"locally the {ranks} rank(s) share this machine's {usable_cpus()} usable CPU(s) "
                f"(OMP_NUM_THREADS={default} each)")

    def interfaces(self, payload: Payload) -> InterfaceChoice:
        return planned_interfaces(payload, True, "")

    def launch_fields(self, spec: JobSpec, run_id: str, run_dir: str, shown: Payload, n_points: int,
                      max_array_size: int | None) -> dict[str, Any]:
        with paused_gc():
            return dict(ranks=local_rows(run_id, shown))

    def array_note(self, n_points: int, max_array_size: int | None, why: str | None) -> str | None:
        return None  # a local sweep runs its points one after the other

    def environment_lines(self, launch: LaunchPlan) -> list[str]:
        return []  # no scheduler's defaults to pick up

    def recovery_how(self, recovery: RecoverySettings) -> str:
        return "restarts the ranks in place, forked from the run's warm zygote"

    def steps_line(self, nodes: int, world: int, per_node: int, payload: Payload) -> str:
        return f"{world} rank process(es) on this machine ({nodes} emulated node(s) of {per_node})"


def local_rows(run_id: str, payload: Payload) -> list[RankRow]:
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
