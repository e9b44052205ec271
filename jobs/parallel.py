"""Model wrapping: DDP with one process per device, or DataParallel in one process per node.

DataParallel gathers outputs and computes the loss on the first GPU, so that GPU runs out of
memory first. ``BalancedDataParallel`` gives it a smaller share of the batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.parallel import DataParallel, DistributedDataParallel
from torch.nn.parallel._functions import Scatter

if TYPE_CHECKING:
    from jobs.distributed import DistContext


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


#: What wrap_model gives DistributedDataParallel unless the caller says otherwise. Measured with
#: tests/benchmarks/bench_resnet.py --tune (how, and the figures: docs/PERFORMANCE.md):
#: gradient_as_bucket_view, static_graph, bucket_cap_mb 5/50/100 and batched_grad_copy all
#: stayed within the run-to-run spread.
#: Bucket views are kept for what they surely do: gradients live in DDP's buckets, one model-sized
#: copy less per step and in memory. static_graph is no default: it breaks models whose set of
#: used parameters changes between steps, for no measured gain.
DDP_DEFAULTS: dict[str, Any] = {"gradient_as_bucket_view": True}


def wrap_model(model: nn.Module, ctx: DistContext, *, first_device_batch: int | None = None,
               **ddp_options: Any) -> nn.Module:
    """The model on this rank's device, wrapped the way the job's strategy asks.

    - ``ddp`` with a process group: DistributedDataParallel with ``DDP_DEFAULTS`` (any keyword given
      here wins), the spec's ``distributed.grad_compression`` (ORCH_GRAD_COMPRESSION) as a comm hook,
      and DDP's gradient buckets laid out before the first training step (see ``_settle_on_first_step``).
    - ``dp``: DataParallel over this process's GPUs, ``first_device_batch`` samples on GPU 0.
    - one process without a group: the model itself, on the device.
    """
    model = model.to(ctx.device)
    if ctx.config.strategy == "dp":
        if ctx.device.type == "cuda" and torch.cuda.device_count() > 1:
            return BalancedDataParallel(model, first_device_batch=first_device_batch)
        return model
    if ctx.backend is None:
        return model
    options = {**DDP_DEFAULTS, **ddp_options}
    ddp = DistributedDataParallel(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
                                  **options)
    _compress(ddp, ctx.config.grad_compression)
    _settle_on_first_step(ddp)
    return ddp


def _compress(ddp: DistributedDataParallel, compression: str) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    hooks = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}
    if compression in hooks:
        ddp.register_comm_hook(None, hooks[compression])  # state None: the default process group


def _settle_on_first_step(ddp: DistributedDataParallel) -> None:
    """Lay DDP's gradient buckets out for good before the first training step, on its own batch.

    DDP fills its first buckets in parameter order and rebuilds them, after the first backward, in
    gradient-ready order. The layout decides in which order gloo and nccl sum each element, so a
    run resumed mid-way (whose first step after the restart would use the initial layout) would
    differ in the last bits from an uninterrupted one. So the first training forward (grad enabled,
    train mode, gradients synchronised, none accumulated) first runs one forward and backward of
    the same batch, with no optimizer step; buffers (BatchNorm statistics) and RNG state are put
    back and the gradients cleared, so nothing but the layout changes. Every run does it once per
    process, so resumed runs are bit-identical to uninterrupted ones.
    """
    handle: Any = None

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not (torch.is_grad_enabled() and module.training and ddp.require_backward_grad_sync):
            return  # an evaluation or a no_sync step: wait for the first synchronised training step
        handle.remove()
        grads = [p.grad for p in module.parameters() if p.requires_grad]
        if any(g is not None and bool(g.any()) for g in grads):
            return  # gradients already accumulated: clearing them would change the training
        _settle(module, args, kwargs, set_to_none=all(g is None for g in grads))

    handle = ddp.register_forward_pre_hook(hook, with_kwargs=True)


def _settle(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], set_to_none: bool) -> None:
    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    total = _float_sum(module(*args, **kwargs))
    if total is not None:
        total.backward()
    module.zero_grad(set_to_none=set_to_none)
    with torch.no_grad():
        for buf, saved in buffers:
            buf.copy_(saved)
    torch.set_rng_state(rng)
    if cuda_rng is not None:
        torch.cuda.set_rng_state_all(cuda_rng)


def _float_sum(output: Any) -> torch.Tensor | None:
    """A scalar that every floating-point tensor in a model's output (tensor, sequence or mapping) feeds."""
    if torch.is_tensor(output):
        return output.float().sum() if output.is_floating_point() and output.requires_grad else None
    parts = output.values() if isinstance(output, dict) else output if isinstance(output, (list, tuple)) else []
    sums = [s for s in map(_float_sum, parts) if s is not None]
    return torch.stack(sums).sum() if sums else None
