"""The names modules had before the package move (issue 34), still importable, and still runnable
with ``python -m``: a job queued before an upgrade calls ``python -m orchestrator.slurm_job`` from
its batch script, a running agent imports ``orchestrator.health`` inside a function after the
upgrade, a detached local supervisor was started as ``orchestrator.executors.local``. Each old
name is an alias of the module's new one (the same module object, not a copy), through a finder
``orchestrator/__init__.py`` puts last on ``sys.meta_path``: the old name is tried only when
nothing else has it. Standard library only (every rank imports the package).
"""

from __future__ import annotations

import importlib
import sys
from importlib.machinery import ModuleSpec

#: ``typing`` is not imported at run time: every process the orchestrator starts on a node (each
#: rank, each health gate task) imports this package first, and typing alone is ~10 ms of them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import CodeType, ModuleType
    from typing import Optional, Sequence

#: old module name -> its new one. Frozen: a name is added here when a module moves, and never
#: removed while a job started by a release that used it may still be queued.
MOVED = {
    "orchestrator.after": "orchestrator.spec.after",
    "orchestrator.agent_decisions": "orchestrator.backends.slurm.node.agent_decisions",
    "orchestrator.agent_recovery": "orchestrator.backends.slurm.node.agent_recovery",
    "orchestrator.agent_requeue": "orchestrator.backends.slurm.node.agent_requeue",
    "orchestrator.agent_state": "orchestrator.backends.slurm.node.agent_state",
    "orchestrator.agent_watch": "orchestrator.backends.slurm.node.agent_watch",
    "orchestrator.attempt_logs": "orchestrator.core.attempt_logs",
    "orchestrator.attempt_times": "orchestrator.core.attempt_times",
    "orchestrator.chaos": "orchestrator.front.chaos",
    "orchestrator.chaos_node": "orchestrator.node.chaos_node",
    "orchestrator.backends.slurm.node.chaos_node": "orchestrator.node.chaos_node",
    "orchestrator.node.gate_step": "orchestrator.backends.slurm.node.gate_step",
    "orchestrator.node.module_origin": "orchestrator.core.module_origin",
    "orchestrator.cli_commands": "orchestrator.cli.cli_commands",
    "orchestrator.cli_streams": "orchestrator.cli.cli_streams",
    "orchestrator.code_redirect": "orchestrator.node.code_redirect",
    "orchestrator.container": "orchestrator.node.container",
    "orchestrator.container_check": "orchestrator.backends.slurm.container_check",
    "orchestrator.display": "orchestrator.front.display",
    "orchestrator.errors": "orchestrator.core.errors",
    "orchestrator.executors.debug": "orchestrator.backends.local.debug",
    "orchestrator.executors.forked": "orchestrator.backends.local.forked",
    "orchestrator.executors.local": "orchestrator.backends.local.executor",
    "orchestrator.executors.slurm": "orchestrator.backends.slurm.executor",
    "orchestrator.executors.slurm_checks": "orchestrator.backends.slurm.slurm_checks",
    "orchestrator.executors.slurm_env": "orchestrator.backends.slurm.slurm_env",
    "orchestrator.executors.slurm_status": "orchestrator.backends.slurm.slurm_status",
    "orchestrator.executors.supervisor": "orchestrator.backends.local.supervisor",
    "orchestrator.executors.zygote": "orchestrator.backends.local.zygote",
    "orchestrator.failures": "orchestrator.core.failures",
    "orchestrator.forensics": "orchestrator.node.forensics",
    "orchestrator.frameworks": "orchestrator.node.frameworks",
    "orchestrator.fs_checks": "orchestrator.core.fs_checks",
    "orchestrator.health": "orchestrator.node.health",
    "orchestrator.hostlist": "orchestrator.core.hostlist",
    "orchestrator.identity": "orchestrator.spec.identity",
    "orchestrator.interpreter": "orchestrator.core.interpreter",
    "orchestrator.join_hook": "orchestrator.node.join_hook",
    "orchestrator.launcher": "orchestrator.node.launcher",
    "orchestrator.loading": "orchestrator.spec.loading",
    "orchestrator.local_plan": "orchestrator.backends.local.local_plan",
    "orchestrator.malloc": "orchestrator.node.malloc",
    "orchestrator.module_origin": "orchestrator.core.module_origin",
    "orchestrator.netif": "orchestrator.core.netif",
    "orchestrator.operations": "orchestrator.front.operations",
    "orchestrator.ownership": "orchestrator.core.ownership",
    "orchestrator.payload": "orchestrator.core.payload",
    "orchestrator.pipeline": "orchestrator.front.pipeline",
    "orchestrator.pipeline_graph": "orchestrator.front.pipeline_graph",
    "orchestrator.plan_model": "orchestrator.plan.plan_model",
    "orchestrator.planning": "orchestrator.front.planning",
    "orchestrator.platform_caps": "orchestrator.core.platform_caps",
    "orchestrator.previous_attempt": "orchestrator.executors.previous_attempt",
    "orchestrator.procs": "orchestrator.core.procs",
    "orchestrator.progress": "orchestrator.core.progress",
    "orchestrator.rank_env": "orchestrator.node.rank_env",
    "orchestrator.rank_exit": "orchestrator.node.rank_exit",
    "orchestrator.records": "orchestrator.core.records",
    "orchestrator.recovery": "orchestrator.core.recovery",
    "orchestrator.remote_checkout": "orchestrator.remote.remote_checkout",
    "orchestrator.remote_protocol": "orchestrator.remote.remote_protocol",
    "orchestrator.remote_receive": "orchestrator.remote.remote_receive",
    "orchestrator.remote_settings": "orchestrator.remote.remote_settings",
    "orchestrator.remote_ship": "orchestrator.remote.remote_ship",
    "orchestrator.remote_ssh": "orchestrator.remote.remote_ssh",
    "orchestrator.rendezvous": "orchestrator.core.rendezvous",
    "orchestrator.report": "orchestrator.front.report",
    "orchestrator.run_files": "orchestrator.front.run_files",
    "orchestrator.run_folder": "orchestrator.core.run_folder",
    "orchestrator.run_stacks": "orchestrator.front.run_stacks",
    "orchestrator.slurm_controller": "orchestrator.backends.slurm.node.slurm_controller",
    "orchestrator.slurm_job": "orchestrator.backends.slurm.node.slurm_job",
    "orchestrator.slurm_plan": "orchestrator.backends.slurm.slurm_plan",
    "orchestrator.slurm_rank": "orchestrator.backends.slurm.node.slurm_rank",
    "orchestrator.slurm_task": "orchestrator.backends.slurm.node.slurm_task",
    "orchestrator.snapshot": "orchestrator.code.snapshot",
    "orchestrator.snapshot_files": "orchestrator.code.snapshot_files",
    "orchestrator.snapshot_model": "orchestrator.code.snapshot_model",
    "orchestrator.snapshot_prune": "orchestrator.front.snapshot_prune",
    "orchestrator.snapshot_scan": "orchestrator.code.snapshot_scan",
    "orchestrator.snapshot_store": "orchestrator.code.snapshot_store",
    "orchestrator.spec_data": "orchestrator.spec.spec_data",
    "orchestrator.stack_files": "orchestrator.core.stack_files",
    "orchestrator.stack_requests": "orchestrator.node.stack_requests",
    "orchestrator.stacks": "orchestrator.core.stacks",
    "orchestrator.stacks_probe": "orchestrator.backends.slurm.node.stacks_probe",
    "orchestrator.states": "orchestrator.core.states",
    "orchestrator.stop_judge": "orchestrator.node.stop_judge",
    "orchestrator.submitit_adapter": "orchestrator.backends.slurm.submitit_adapter",
    "orchestrator.sync": "orchestrator.front.sync",
    "orchestrator.tracking": "orchestrator.node.tracking",
    "orchestrator.validators": "orchestrator.spec.validators",
    "orchestrator.views": "orchestrator.core.views",
    "orchestrator.watchdog": "orchestrator.node.watchdog",
    "orchestrator.yaml_text": "orchestrator.spec.yaml_text",
}


class _Alias:
    """The loader of an old name: the new module itself, and its code for ``python -m``."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec  # the import machinery set the old name's: keep the module's own

    def get_code(self, name: str) -> Optional[CodeType]:  # runpy: ``python -m OLD`` runs NEW as __main__
        import importlib.util

        spec = importlib.util.find_spec(self.new)
        loader = spec.loader if spec is not None else None
        return loader.get_code(self.new) if loader is not None and hasattr(loader, "get_code") else None

    def is_package(self, name: str) -> bool:
        return False


class OldNames:
    """A meta path finder for the names in ``MOVED``."""

    @staticmethod
    def find_spec(fullname: str, path: Optional[Sequence[str]] = None, target: Optional[ModuleType] = None
                  ) -> Optional[ModuleSpec]:
        new = MOVED.get(fullname)
        # a Loader by its methods: neither typing's cast nor importlib.abc (tempfile with it) is imported here
        return ModuleSpec(fullname, _Alias(new)) if new is not None else None  # type: ignore[arg-type]


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (last: an old name is never a real file now)."""
    if not any(isinstance(f, OldNames) for f in sys.meta_path):
        sys.meta_path.append(OldNames())
