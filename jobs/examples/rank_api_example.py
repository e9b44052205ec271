"""Your own training script on the rank API: DDP, checkpoints, bit-exact resume after preemption.

Run it on 2 emulated nodes x 2 CPU ranks, on SLURM, under torchrun, or as one process:

    orchestrator run jobs/examples/rank_api_example.yaml
    orchestrator submit jobs/examples/rank_api_example.yaml --set executor=slurm
    torchrun --nproc-per-node 2 -m jobs.examples.rank_api_example --epochs 2
    python -m jobs.examples.rank_api_example

At USR2 (SLURM's time-limit or preemption signal) or SIGTERM (cancel, Ctrl-C) every rank stops at
the same step, they checkpoint together, and the next attempt (a requeue, or running the same
spec again) resumes to the very weights an uninterrupted run would reach.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Sequence

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import jobs


def make_data(n: int = 4096, seed: int = 0) -> TensorDataset:
    """A synthetic 4-class problem, generated in memory the same way on every rank."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=g)
    y = (x @ torch.randn(32, 4, generator=g)).argmax(1)
    return TensorDataset(x, y)


def main(argv: Sequence[str] = ()) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="rank_api_example")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep per step (to interrupt it)")
    args = p.parse_args(list(argv))

    with jobs.StopFlag() as stop, jobs.process_group() as ctx:  # signals first, then the group
        jobs.seed_everything(args.seed)
        data = make_data(seed=args.seed)
        net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 4))
        model = jobs.wrap_model(net, ctx)  # DDP with the runtime's defaults (one process: the model)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        sampler = jobs.ResumableDistributedSampler(data, num_replicas=ctx.world_size, rank=ctx.rank,
                                                   seed=args.seed, drop_last=True)
        # Its own generator: starting an epoch then draws nothing from the global RNG (dropout's),
        # so an epoch restarted mid-way after a resume sees the masks an uninterrupted run would.
        loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                            generator=torch.Generator())
        steps_per_epoch = sampler.num_samples // args.batch_size
        total = steps_per_epoch * args.epochs

        ckpt = jobs.Checkpointer(ctx)  # the spec's checkpoint folder, interval and keep_last
        resumed = ckpt.load_latest(model, opt)  # model, optimizer and every rank's RNG state
        step, loss_value = (resumed.step, resumed.extra["loss"]) if resumed else (0, float("nan"))
        if resumed and ctx.is_main:
            print(f"resumed from {resumed.path} at step {step}", flush=True)
        # <run>/metrics/rank-N.jsonl, for `orchestrator report`; start_step: after a resume each step shows once
        with jobs.MetricsWriter(start_step=step) as metrics:
            for epoch in range(step // steps_per_epoch, args.epochs):
                sampler.set_epoch(epoch)
                sampler.set_start(step % steps_per_epoch * args.batch_size)  # mid-epoch after a resume
                t0, seen = time.perf_counter(), 0
                for x, y in loader:
                    x, y = x.to(ctx.device), y.to(ctx.device)
                    opt.zero_grad()
                    loss = nn.functional.cross_entropy(model(x), y)
                    loss.backward()
                    opt.step()
                    step, seen = step + 1, seen + len(y)
                    jobs.heartbeat(step, total, samples=len(y))  # progress line and stall watchdog
                    loss_value = loss.item()
                    metrics.train(step, loss_value)  # rank 0 writes, the others skip
                    time.sleep(args.step_delay)
                    if stop.should_stop(ctx.device):  # collective: all ranks agree at this step
                        ckpt.save(step, model, opt, loss=loss_value)  # extras: any picklable values
                        stop.checkpointed()  # tells SLURM's agent it may requeue (slurm.requeue: auto)
                        if ctx.is_main:
                            print(f"stopped at step {step} by {stop.signal_name or 'a peer'}; checkpoint written",
                                  flush=True)
                        return {"stopped": stop.signal_name or "peer", "step": step, "loss": loss_value}
                    if ckpt.due(step):
                        ckpt.save(step, model, opt, loss=loss_value)
                metrics.throughput(epoch, seen, time.perf_counter() - t0)
                ckpt.save(step, model, opt, loss=loss_value)
        if ctx.is_main:
            print(f"done: step {step}/{total}, loss {loss_value:.6f}", flush=True)
        return {"stopped": None, "step": step, "loss": loss_value}


if __name__ == "__main__":
    main(sys.argv[1:])
