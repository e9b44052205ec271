"""A rank-API script (jobs.process_group, jobs.Checkpointer) whose last rank raises once at step
``--fail-at``, after the checkpoint the spec's interval wrote: recovery restarts it and it resumes
from that checkpoint. Prints ``resumed at step N`` and, at the end, ``finished at step N``."""

import argparse
import os
from pathlib import Path

import torch
from torch import nn

import jobs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--fail-at", type=int, default=7)
    a = p.parse_args()
    with jobs.process_group() as ctx:
        torch.manual_seed(0)
        model = jobs.wrap_model(nn.Linear(8, 1), ctx)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        ckpt = jobs.Checkpointer(ctx)
        resumed = ckpt.load_latest(model, opt)
        step = resumed.step if resumed else 0
        if resumed:
            print(f"rank {ctx.rank}: resumed at step {step}", flush=True)
        marker = Path(ckpt.directory) / "crashed-once"
        while step < a.steps:
            x = torch.randn(4, 8)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            jobs.heartbeat(step, a.steps)
            if ckpt.due(step):
                ckpt.save(step, model, opt)
            if step == a.fail_at and ctx.rank == ctx.world_size - 1 and not marker.exists():
                marker.write_text(os.environ.get("ORCH_ATTEMPT", ""))
                raise RuntimeError(f"injected crash at step {step}")
        print(f"rank {ctx.rank}: finished at step {step}", flush=True)


if __name__ == "__main__":
    main()
