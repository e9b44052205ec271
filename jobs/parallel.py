"""Model wrapping: DDP with one process per device, or DataParallel in one process per node.

DataParallel gathers outputs and computes the loss on the first GPU, so that GPU runs out of
memory first. ``BalancedDataParallel`` gives it a smaller share of the batch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DataParallel, DistributedDataParallel
from torch.nn.parallel._functions import Scatter


def balanced_chunks(batch: int, n_devices: int, first_device_batch: int | None) -> list[int]:
    """Split a batch with ``first_device_batch`` on device 0 and the rest spread evenly."""
    if n_devices <= 1 or first_device_batch is None:
        base, extra = divmod(batch, max(1, n_devices))
        return [base + (1 if i < extra else 0) for i in range(max(1, n_devices))]
    first = max(1, min(first_device_batch, batch))  # device 0 always gets some: DataParallel replicates in order
    rest, extra = divmod(batch - first, n_devices - 1)
    return [first] + [rest + (1 if i < extra else 0) for i in range(n_devices - 1)]


class BalancedDataParallel(DataParallel):
    def __init__(self, module: nn.Module, first_device_batch: int | None = None, **kwargs: Any) -> None:
        super().__init__(module, **kwargs)
        self.first_device_batch = first_device_batch

    def scatter(self, inputs: Any, kwargs: Any, device_ids: Any) -> Any:
        """Scatter tensor inputs with our chunk sizes (torch's scatter only splits evenly)."""
        batch = inputs[0].size(self.dim)
        sizes = balanced_chunks(batch, len(device_ids), self.first_device_batch)
        used = [d for d, s in zip(device_ids, sizes) if s > 0]
        sizes = [s for s in sizes if s > 0]
        per_input = [Scatter.apply(used, sizes, self.dim, x) if torch.is_tensor(x) else [x] * len(used)
                     for x in inputs]
        scattered = [tuple(parts[i] for parts in per_input) for i in range(len(used))]
        return scattered, [dict(kwargs or {}) for _ in used]


def wrap(model: nn.Module, strategy: str, device: torch.device, distributed: bool,
         first_device_batch: int | None = None) -> nn.Module:
    model = model.to(device)
    if strategy == "dp":
        if device.type == "cuda" and torch.cuda.device_count() > 1:
            return BalancedDataParallel(model, first_device_batch=first_device_batch)
        return model
    if distributed:
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model


def settle_ddp_buckets(model: nn.Module, sample: torch.Tensor) -> None:
    """One forward/backward with no optimizer step, so DDP rebuilds its gradient buckets now.

    DDP lays out its first bucket in parameter order and rebuilds it, after the first backward,
    in gradient-ready order. The layout decides which elements gloo sums in which ring order, so
    a run resumed mid-way (whose first step after the restart would use the initial layout) would
    differ from an uninterrupted run in the last bits. Settling the layout before the first real
    step, in every run, makes resumed runs bit-identical. Eval mode keeps BatchNorm statistics
    untouched; the gradients are thrown away.
    """
    if not isinstance(model, DistributedDataParallel):
        return
    was_training = model.training
    model.eval()
    model(sample).float().sum().backward()
    model.zero_grad(set_to_none=True)
    model.train(was_training)
