"""Image classification with DDP (or DataParallel): the main job.

Entrypoint ``jobs.train:main``; it reads the env:// variables, so it runs the same under
``orchestrator run``, ``orchestrator submit`` or torchrun (``torchrun -m jobs.train ...``, or
``python -m jobs.train ...`` for one process). Built on the public rank API (``import jobs``) and
nothing else of the runtime. Reads top to bottom: set up, resume, train with a stop check at
step boundaries, evaluate, checkpoint, clean up.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

import jobs
from jobs import data, models
from jobs.argtypes import non_negative_float, non_negative_int, positive_int
from jobs.distributed import DistContext
from jobs.preemption import StopFlag
from jobs.rng import seed_everything
from jobs.sampling import shard_indices


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="jobs.train", description=__doc__)
    p.add_argument("--dataset", default="digits",
                   choices=["digits", "digits-aug", "fake", "cifar10", "stl10", "imagefolder"],
                   help="digits-aug: digits with a random augmentation per sample (tests of exact resume)")
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



__all__ = ["main", "parse_args", "seed_everything", "train"]


def evaluate(ctx: DistContext, model: nn.Module, test_set: Dataset, batch_size: int) -> tuple[float, float]:
    """Exact accuracy and loss: each sample counted once across ranks, summed with all_reduce."""
    shard = Subset(test_set, shard_indices(len(test_set), ctx.rank, ctx.world_size))  # type: ignore[arg-type]
    totals = torch.zeros(3, dtype=torch.float64, device=ctx.device)
    model.eval()
    with torch.no_grad():
        for x, y in DataLoader(shard, batch_size=batch_size * 4):
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
    with jobs.StopFlag() as stop, jobs.process_group() as ctx:
        return train(ctx, args, stop)


def train(ctx: DistContext, args: argparse.Namespace, stop: StopFlag) -> dict[str, Any]:
    seed_everything(args.seed)
    train_set, test_set = (data.build(args.dataset, split, args.data_dir, args.download, not args.no_verify,
                                      args.image_size, args.fake_size) for split in (True, False))
    model = models.build(args.model, data.in_channels(args.dataset), data.num_classes(args.dataset, train_set))
    # Random augmentations drawn in DataLoader workers: each sample's draws from (seed, epoch, index)
    # alone, whichever worker reads it, so a resume draws what an uninterrupted run did. Without
    # workers they come from this process's generators, which the checkpoint holds: nothing to do.
    drawn = data.drawn_generators(args.dataset)  # most datasets draw nothing
    if drawn and args.workers > 0:
        train_set = jobs.SeededDataset(train_set, args.seed, generators=drawn)
    model = model.to(ctx.device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    # recovery.survivors: keep: a rank forked to replace a lost one gets a survivor's state here,
    # and a survivor rejoins in the loop below (jobs.heal); otherwise both are no-ops.
    healer = jobs.Healer(ctx)
    received = healer.receive(model, opt)
    module, model = model, jobs.wrap_model(model, ctx, first_device_batch=args.first_gpu_batch)
    sampler = jobs.ResumableDistributedSampler(train_set, num_replicas=ctx.world_size, rank=ctx.rank,
                                               shuffle=True, seed=args.seed, drop_last=True)
    loader_rng = torch.Generator()  # reseeded every epoch: workers' seeds never draw from the global RNG
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                        num_workers=args.workers, generator=loader_rng)
    steps_per_epoch = sampler.num_samples // args.batch_size
    total_steps = steps_per_epoch * args.epochs
    ckpt = jobs.Checkpointer(ctx)
    resumed = None if received is not None else ckpt.load_latest(model, opt)
    epoch, step_in_epoch, step = (resumed.extra["epoch"], resumed.extra["step_in_epoch"], resumed.step) \
        if resumed else (0, 0, 0)
    if received is not None:
        epoch, step_in_epoch, step = received["epoch"], received["step_in_epoch"], received["step"]
    if resumed and ctx.is_main:
        print(f"[train] resumed from {resumed.path} (epoch {epoch}, step {step})", flush=True)

    def save() -> None:  # collective
        ckpt.save(step, model, opt, epoch=epoch, step_in_epoch=step_in_epoch, global_step=step, args=vars(args))

    accuracy = float("nan")
    stopped = None
    # The records of steps after the checkpoint that an earlier attempt wrote were rolled back.
    with jobs.MetricsWriter(ctx.config.run_dir, ctx.rank, start_step=step, start_epoch=epoch) as metrics:
        while epoch < args.epochs and stopped is None:
            try:
                sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
                if isinstance(train_set, jobs.SeededDataset):
                    train_set.set_epoch(epoch)  # new augmentations every epoch
                sampler.set_start(step_in_epoch * args.batch_size)
                loader_rng.manual_seed(args.seed + epoch)
                t0, seen = time.perf_counter(), 0
                own_from = t0  # this rank's own work since here, outside collectives (busy_s)
                for x, y in loader:
                    x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
                    opt.zero_grad(set_to_none=True)
                    loss = nn.functional.cross_entropy(model(x), y)
                    busy_s = time.perf_counter() - own_from
                    loss.backward()  # DDP's all-reduce: every rank waits here for the slowest
                    # This rank's own work runs from here to the next backward (the optimizer, the loop's
                    # own pace, the next batch, its forward), the collectives between left out: a rank
                    # slowed anywhere outside them is the one its peers wait for.
                    own_from = time.perf_counter()
                    opt.step()
                    step_in_epoch, step, seen = step_in_epoch + 1, step + 1, seen + len(y)
                    jobs.heartbeat(step, total_steps, samples=len(y), busy_s=busy_s)
                    if args.step_delay:
                        time.sleep(args.step_delay)
                    if ctx.is_main and (step % args.log_every == 0 or step_in_epoch == steps_per_epoch):
                        loss_value = loss.item()
                        metrics.train(step, loss_value, epoch=epoch, total_steps=total_steps, lr=opt.param_groups[0]["lr"])
                        print(f"[train] epoch {epoch + 1}/{args.epochs} step {step}/{total_steps} loss {loss_value:.4f}",
                              flush=True)
                    waited = time.perf_counter()
                    if stop.should_stop(ctx.device, step=step, every=args.stop_check_every):
                        stopped = stop.signal_name or "peer"
                        break
                    if args.max_steps and step >= args.max_steps:
                        stopped = "max_steps"
                        break
                    if ckpt.due(step):
                        save()
                    own_from += time.perf_counter() - waited  # the stop check's all-reduce and a save: collectives
                elapsed = time.perf_counter() - t0
                metrics.throughput(epoch, seen, elapsed)
                if stopped is None:
                    epoch, step_in_epoch = epoch + 1, 0
                    accuracy, eval_loss = evaluate(ctx, model, test_set, args.batch_size)
                    metrics.evaluation(epoch, step, accuracy, eval_loss)
                    if ctx.is_main:
                        print(f"[train] epoch {epoch}/{args.epochs} test accuracy {accuracy:.4f} "
                              f"loss {eval_loss:.4f}", flush=True)
                save()
            except Exception as exc:  # a peer lost mid-collective: rejoin when the launcher keeps survivors
                if not healer.can_heal(exc):
                    raise
                position = {"epoch": epoch, "step_in_epoch": step_in_epoch, "step": step}
            else:
                continue
            # DDP's reducer (and the last step's graph) hold the broken group: gone before a new one
            model = loss = None  # type: ignore[assignment]
            gc.collect()
            position = healer.heal(module, opt, position)
            epoch, step_in_epoch, step = position["epoch"], position["step_in_epoch"], position["step"]
            model = jobs.wrap_model(module, ctx, first_device_batch=args.first_gpu_batch)
        if stopped is None and accuracy != accuracy:  # resumed after the last epoch: report its accuracy
            accuracy, _ = evaluate(ctx, model, test_set, args.batch_size)
    if stopped is not None and ctx.is_main:
        print(f"[train] stopped at step {step} ({stopped}); checkpoint written", file=sys.stderr, flush=True)
    stop.checkpointed()  # after a signal stop: the job may be requeued (slurm.requeue: auto)
    return {"stopped": stopped, "epoch": epoch, "global_step": step, "test_accuracy": accuracy,
            "world_size": ctx.world_size, "resumed_from_step": resumed.step if resumed and resumed.step else None,
            "init_method": ctx.config.init_method if ctx.backend is not None else None}


if __name__ == "__main__":  # python -m jobs.train, or torchrun -m jobs.train
    main(sys.argv[1:])
