"""A user's own training loop on the rank API with jobs.Healer (the README's example): DDP on a
linear model, one step every ``--step-s``. ``--crash R:S ...``: rank R exits with code 3 on
reaching step S, every time it does (a replacement that resumes at S fails there again; with
``--once`` only the rank's first process does); ``--hang R:S ...``: rank R sleeps for ever there. Prints the final step and a checksum of the weights on rank 0."""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn

import jobs

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--step-s", type=float, default=0.05)
parser.add_argument("--crash", nargs="*", default=[], help="R:S ... rank R exits with code 3 at step S")
parser.add_argument("--hang", nargs="*", default=[], help="R:S ... rank R sleeps for ever at step S")
parser.add_argument("--once", action="store_true", help="only a rank's first process fails, not its replacement")
parser.add_argument("--say-steps", action="store_true", help="print each step trained (its output, echoed)")
args = parser.parse_args()
crashes = {tuple(map(int, c.split(":"))) for c in args.crash}
hangs = {tuple(map(int, c.split(":"))) for c in args.hang}

with jobs.process_group() as ctx:
    healer = jobs.Healer(ctx)
    torch.manual_seed(0)
    module = nn.Linear(8, 1).to(ctx.device)
    opt = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
    got = healer.receive(module, opt)
    step = got["step"] if got else 0
    model = jobs.wrap_model(module, ctx)
    while step < args.steps:
        try:
            if (ctx.rank, step) in crashes and not (args.once and healer.replacement):
                os._exit(3)
            if (ctx.rank, step) in hangs and not (args.once and healer.replacement):
                time.sleep(3600)  # outside any collective: its peers wait for it in the next one
            g = torch.Generator().manual_seed(step * 1000 + ctx.rank)
            x = torch.randn(16, 8, generator=g)
            opt.zero_grad(set_to_none=True)
            model(x).pow(2).mean().backward()
            opt.step()
            step += 1
            jobs.heartbeat(step, args.steps)
            if args.say_steps:
                print(f"trained step {step}", flush=True)
            time.sleep(args.step_s)
        except Exception as exc:
            if not healer.can_heal(exc):
                raise
            model = None
            step = healer.heal(module, opt, {"step": step})["step"]
            model = jobs.wrap_model(module, ctx)
    if ctx.rank == 0:
        print(f"final step {step} checksum {sum(p.double().sum().item() for p in module.parameters()):.12f}", flush=True)
