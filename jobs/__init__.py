"""What runs on every rank: the rank API for your own training script, and the jobs built on it
(``jobs.train``, ``jobs.infer``, ``jobs.allreduce``). Reads only env:// and ORCH_* variables;
never imports submitit or the executors.

    import jobs

    with jobs.StopFlag() as stop, jobs.process_group() as ctx: # process group, device, timeouts
        model = jobs.wrap_model(Net(), ctx)                      # DDP with the runtime's defaults
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ckpt = jobs.Checkpointer(ctx)
        resumed = ckpt.load_latest(model, opt)                   # None on a fresh start
        step = resumed.step if resumed else 0
        ...
            jobs.heartbeat(step, total, samples=len(x))          # progress for the stall watchdog
            if stop.should_stop(ctx.device):                     # USR2 (time limit) or SIGTERM
                ckpt.save(step, model, opt)
                stop.checkpointed()                              # the job may be requeued
                break

``jobs.SeededDataset(train_set, seed)`` makes a dataset's random augmentations depend only on (seed,
epoch, index), so a resume with DataLoader workers draws what an uninterrupted run did.

``import jobs`` stays cheap (no torch): each name is imported when first used.
See jobs/examples/rank_api_example.py for a complete script.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobs.checkpoint import Checkpointer, Resumed
    from jobs.distributed import DistContext
    from jobs.distributed import distributed as process_group
    from jobs.heal import Healer
    from jobs.progress import heartbeat
    from jobs.metrics import MetricsWriter
    from jobs.parallel import wrap_model
    from jobs.preemption import StopFlag, mark_checkpointed_for_requeue
    from jobs.rng import SeededDataset, seed_everything
    from jobs.runtime import RuntimeConfig
    from jobs.sampling import ResumableDistributedSampler

_WHERE = {
    "process_group": "jobs.distributed", "DistContext": "jobs.distributed",
    "RuntimeConfig": "jobs.runtime",
    "wrap_model": "jobs.parallel",
    "StopFlag": "jobs.preemption", "mark_checkpointed_for_requeue": "jobs.preemption",
    "Checkpointer": "jobs.checkpoint", "Resumed": "jobs.checkpoint",
    "MetricsWriter": "jobs.metrics",
    "heartbeat": "jobs.progress",
    "Healer": "jobs.heal",
    "ResumableDistributedSampler": "jobs.sampling",
    "seed_everything": "jobs.rng", "SeededDataset": "jobs.rng",
}

# jobs.process_group is jobs.distributed.distributed under a name no submodule has: importing the
# module jobs.distributed sets the attribute jobs.distributed to that module, over any function.
_ALIASES = {"process_group": "distributed"}

__all__ = [
    "Checkpointer", "DistContext", "Healer", "MetricsWriter", "Resumed", "ResumableDistributedSampler", "RuntimeConfig",
    "SeededDataset", "StopFlag", "heartbeat", "mark_checkpointed_for_requeue", "process_group", "seed_everything",
    "wrap_model",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'jobs' has no attribute {name!r}; the rank API is: {', '.join(__all__)}")
    value = getattr(importlib.import_module(module), _ALIASES.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
