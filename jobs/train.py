"""Image classification with DDP (or DataParallel): the main job.

Entrypoint ``jobs.train:main``; it reads the env:// variables, so it runs the same under
``orchestrator run``, ``orchestrator submit`` or torchrun (``torchrun -m jobs.train ...``, or
``python -m jobs.train ...`` for one process). Reads top to bottom: set up, resume,
train with a stop check at every step boundary, evaluate, checkpoint, clean up.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from jobs import checkpoint as ckpt
from jobs import data, models, parallel
from jobs.argtypes import non_negative_float, non_negative_int, positive_int
from jobs.distributed import DistContext, distributed
from jobs.metrics import MetricsWriter
from jobs.preemption import StopFlag, mark_checkpointed_for_requeue
from jobs.sampling import ResumableDistributedSampler, shard_indices


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="jobs.train", description=__doc__)
    p.add_argument("--dataset", default="digits", choices=["digits", "fake", "cifar10", "stl10", "imagefolder"])
    p.add_argument("--data-dir", default=None)
    p.add_argument("--download", action="store_true", help="allow torchvision to download the dataset")
    p.add_argument("--no-verify", action="store_true",
                   help="skip torchvision's md5 checks (CIFAR10 copies and test sets)")
    p.add_argument("--image-size", type=positive_int, default=None)
    p.add_argument("--fake-size", type=positive_int, default=512)
    p.add_argument("--model", default="smallcnn")
    p.add_argument("--epochs", type=positive_int, default=10)
    p.add_argument("--batch-size", type=positive_int, default=32, help="per rank (per process for dp)")
    p.add_argument("--first-gpu-batch", type=positive_int, default=None,
                   help="dp only: a smaller share of the batch for GPU 0, which also holds the outputs")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=non_negative_int, default=0, help="stop after this many steps (0: no limit)")
    p.add_argument("--step-delay", type=non_negative_float, default=0.0, help="sleep per step (tests of preemption)")
    p.add_argument("--log-every", type=positive_int, default=10)
    p.add_argument("--stop-check-every", type=positive_int, default=10,
                   help="steps between the collective stop-flag checks (each costs one tiny all_reduce)")
    p.add_argument("--workers", type=non_negative_int, default=0, help="DataLoader workers (0 is fastest for small data on few cores)")
    return p.parse_args(list(argv))


@dataclass
class Progress:
    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def gather_rng(ctx: DistContext) -> list[dict[str, Any]]:
    mine = rng_state()
    if ctx.backend is None:
        return [mine]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, mine)
    return out


def save(ctx: DistContext, model: nn.Module, opt: torch.optim.Optimizer, prog: Progress,
         args: argparse.Namespace) -> None:
    rngs = gather_rng(ctx)  # collective: every rank calls it
    state = {
        "model": ckpt.unwrapped_state(model), "optimizer": opt.state_dict(),
        "epoch": prog.epoch, "step_in_epoch": prog.step_in_epoch, "global_step": prog.global_step,
        "rng": rngs, "world_size": ctx.world_size, "args": vars(args),
    }
    cfg = ctx.config
    ckpt.save_checkpoint(state, cfg.checkpoint_dir, prog.global_step, cfg.checkpoint_keep, ctx.is_main, ctx.barrier)


def maybe_resume(ctx: DistContext, model: nn.Module, opt: torch.optim.Optimizer) -> Progress:
    cfg = ctx.config
    if ctx.is_main:
        for orphan in ckpt.prune_orphans(cfg.checkpoint_dir):
            print(f"[train] removed {orphan.name}, left by a checkpoint write that was killed", flush=True)
    path = ckpt.latest_checkpoint(cfg.checkpoint_dir) if cfg.resume else None
    if path is None:
        return Progress()
    state = ckpt.load_checkpoint(path, ctx.device)
    ckpt.load_model_state(model, state["model"])
    opt.load_state_dict(state["optimizer"])
    rngs = state.get("rng") or []
    if len(rngs) == ctx.world_size:
        set_rng_state(rngs[ctx.rank])
    if ctx.is_main:
        print(f"[train] resumed from {path} (epoch {state['epoch']}, step {state['global_step']})", flush=True)
    return Progress(state["epoch"], state["step_in_epoch"], state["global_step"])


def evaluate(ctx: DistContext, model: nn.Module, test_set: Dataset, batch_size: int) -> tuple[float, float]:
    """Exact accuracy and loss: each sample counted once across ranks, summed with all_reduce."""
    shard = Subset(test_set, shard_indices(len(test_set), ctx.rank, ctx.world_size))  # type: ignore[arg-type]
    loader = DataLoader(shard, batch_size=batch_size * 4)
    totals = torch.zeros(3, dtype=torch.float64, device=ctx.device)
    model.eval()
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(ctx.device), y.to(ctx.device)
            out = model(x)
            totals += torch.tensor([(out.argmax(1) == y).sum().item(),
                                    nn.functional.cross_entropy(out, y, reduction="sum").item(), len(y)],
                                   dtype=torch.float64, device=ctx.device)
    model.train()
    if ctx.backend is not None:
        dist.all_reduce(totals)
    correct, loss_sum, n = totals.tolist()
    return correct / max(n, 1), loss_sum / max(n, 1)


def main(argv: Sequence[str] = ()) -> dict[str, Any]:
    args = parse_args(argv)
    stop = StopFlag()
    try:
        with distributed() as ctx:
            return train(ctx, args, stop)
    finally:
        stop.restore()


def train(ctx: DistContext, args: argparse.Namespace, stop: StopFlag) -> dict[str, Any]:
    seed_everything(args.seed)
    train_set = data.build(args.dataset, True, args.data_dir, args.download, not args.no_verify,
                           args.image_size, args.fake_size)
    test_set = data.build(args.dataset, False, args.data_dir, args.download, not args.no_verify,
                          args.image_size, args.fake_size)
    model = models.build(args.model, data.in_channels(args.dataset), data.num_classes(args.dataset, train_set))
    model = parallel.wrap(model, ctx.config.strategy, ctx.device, ctx.backend is not None, args.first_gpu_batch)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    sampler = ResumableDistributedSampler(train_set, num_replicas=ctx.world_size, rank=ctx.rank,
                                          shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                        num_workers=args.workers)
    steps_per_epoch = sampler.num_samples // args.batch_size
    metrics = MetricsWriter(ctx.config.run_dir, ctx.rank)
    prog = maybe_resume(ctx, model, opt)
    resumed_from = prog.global_step if prog.global_step else None
    parallel.settle_ddp_buckets(model, train_set[0][0].unsqueeze(0).to(ctx.device))
    total_steps = steps_per_epoch * args.epochs
    interval = ctx.config.checkpoint_interval
    accuracy = loss_value = float("nan")
    stopped = None
    try:
        while prog.epoch < args.epochs and stopped is None:
            sampler.set_epoch(prog.epoch)  # a new shuffle every epoch, the same on every rank
            sampler.set_start(prog.step_in_epoch * args.batch_size)
            t0, seen = time.perf_counter(), 0
            for x, y in loader:
                x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
                opt.zero_grad(set_to_none=True)
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                prog.step_in_epoch += 1
                prog.global_step += 1
                seen += len(y)
                if args.step_delay:
                    time.sleep(args.step_delay)
                if ctx.is_main and (prog.global_step % args.log_every == 0 or prog.step_in_epoch == steps_per_epoch):
                    loss_value = loss.item()
                    metrics.log("train", epoch=prog.epoch, step=prog.global_step, total_steps=total_steps,
                                loss=loss_value, lr=opt.param_groups[0]["lr"])
                    print(f"[train] epoch {prog.epoch + 1}/{args.epochs} step {prog.global_step}/{total_steps} "
                          f"loss {loss_value:.4f}", flush=True)
                if prog.global_step % args.stop_check_every == 0 and stop.should_stop(ctx.device):
                    stopped = stop.signal_name or "peer"
                    break
                if args.max_steps and prog.global_step >= args.max_steps:
                    stopped = "max_steps"
                    break
                if interval and prog.global_step % interval == 0:
                    save(ctx, model, opt, prog, args)
            elapsed = time.perf_counter() - t0
            metrics.log("throughput", epoch=prog.epoch, samples=seen, seconds=elapsed,
                        samples_per_s=seen / elapsed if elapsed > 0 else 0.0)
            if stopped is None:
                prog.epoch, prog.step_in_epoch = prog.epoch + 1, 0
                accuracy, eval_loss = evaluate(ctx, model, test_set, args.batch_size)
                if ctx.is_main:
                    metrics.log("eval", epoch=prog.epoch, step=prog.global_step, accuracy=accuracy, loss=eval_loss)
                    print(f"[train] epoch {prog.epoch}/{args.epochs} test accuracy {accuracy:.4f} "
                          f"loss {eval_loss:.4f}", flush=True)
            save(ctx, model, opt, prog, args)
        if stopped is None and accuracy != accuracy:  # resumed after the last epoch: report its accuracy
            accuracy, _ = evaluate(ctx, model, test_set, args.batch_size)
    finally:
        metrics.close()
    if stopped is not None and ctx.is_main:
        print(f"[train] stopped at step {prog.global_step} ({stopped}); checkpoint written", file=sys.stderr, flush=True)
        if stopped != "max_steps":
            mark_checkpointed_for_requeue()
    return {"stopped": stopped, "epoch": prog.epoch, "global_step": prog.global_step,
            "test_accuracy": accuracy, "world_size": ctx.world_size, "resumed_from_step": resumed_from,
            "init_method": ctx.config.init_method if ctx.backend is not None else None}


if __name__ == "__main__":  # python -m jobs.train, or torchrun -m jobs.train
    main(sys.argv[1:])
