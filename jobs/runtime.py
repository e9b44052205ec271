"""Settings every rank reads from its environment, with defaults so a job also runs under torchrun.

The launcher exports these (``ORCH_*``) next to the standard env:// variables. Nothing here
imports torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from orchestrator.core.payload import Defaults
from orchestrator.node.rank_env import OrchVar
from orchestrator.core.run_folder import RunFolder


@dataclass(frozen=True)
class RuntimeConfig:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    backend: str
    init_method: str
    init_timeout_s: float
    collective_timeout_s: float
    run_dir: str
    checkpoint_dir: str
    checkpoint_interval: int
    checkpoint_keep: int
    resume: bool
    strategy: str
    grad_compression: str  # none, fp16 or bf16: DDP's all-reduce in that precision (jobs.wrap_model)
    attempt: int  # 0 for the first attempt, then one more per requeue or resume on SLURM

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RuntimeConfig:
        """From the variables ``rank_env.rank_environment`` sets; under torchrun (no ORCH_*), the
        spec's defaults."""
        e = os.environ if environ is None else environ
        d = Defaults
        run_dir = e.get(OrchVar.RUN_DIR, os.getcwd())
        world = int(e.get("WORLD_SIZE", "1"))
        return cls(
            rank=int(e.get("RANK", "0")),
            local_rank=int(e.get("LOCAL_RANK", "0")),
            world_size=world,
            local_world_size=int(e.get("LOCAL_WORLD_SIZE", str(world))),
            backend=e.get(OrchVar.BACKEND, d.BACKEND),
            init_method=e.get(OrchVar.INIT_METHOD, "env://"),
            init_timeout_s=float(e.get(OrchVar.INIT_TIMEOUT_S, d.INIT_TIMEOUT_S)),
            collective_timeout_s=float(e.get(OrchVar.COLLECTIVE_TIMEOUT_S, d.COLLECTIVE_TIMEOUT_S)),
            run_dir=run_dir,
            checkpoint_dir=e.get(OrchVar.CHECKPOINT_DIR, str(RunFolder.of(run_dir).checkpoints)),
            checkpoint_interval=int(e.get(OrchVar.CHECKPOINT_INTERVAL, d.CHECKPOINT_INTERVAL)),
            checkpoint_keep=int(e.get(OrchVar.CHECKPOINT_KEEP, d.CHECKPOINT_KEEP)),
            resume=e.get(OrchVar.RESUME, "1" if d.RESUME else "0") == "1",
            strategy=e.get(OrchVar.STRATEGY, d.STRATEGY),
            grad_compression=_choice(e, OrchVar.GRAD_COMPRESSION, d.GRAD_COMPRESSION, GRAD_COMPRESSIONS),
            attempt=int(e.get(OrchVar.ATTEMPT, "0")))


GRAD_COMPRESSIONS = ("none", "fp16", "bf16")


def _choice(environ: Mapping[str, str], name: str, default: str, allowed: tuple[str, ...]) -> str:
    value = environ.get(name, default) or default
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(allowed)}: fix the variable (or the spec field "
                         "that sets it, distributed.grad_compression)")
    return value
