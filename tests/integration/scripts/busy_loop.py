"""A plain torch.distributed script that keeps training-like steps going (everything in a
function of its own, train_step) until SECONDS have passed; each rank writes alive-<rank> in OUT
after every step.

argv: OUT SECONDS"""
import os
import sys
import time

import torch
import torch.distributed as dist


def train_step(t: torch.Tensor, stop: torch.Tensor, end: float) -> bool:
    dist.all_reduce(t)
    time.sleep(0.05)
    stop.fill_(1.0 if time.time() > end else 0.0)
    dist.all_reduce(stop)
    return stop.item() > 0


def main() -> None:
    out, seconds = sys.argv[1], float(sys.argv[2])
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    t, stop = torch.ones(1024), torch.zeros(1)
    end = time.time() + seconds
    steps = 0
    while True:
        done = train_step(t, stop, end)
        steps += 1
        with open(os.path.join(out, f"alive-{rank}.tmp"), "w") as fh:
            fh.write(f"{steps} {time.time()}\n")
        os.replace(os.path.join(out, f"alive-{rank}.tmp"), os.path.join(out, f"alive-{rank}"))
        if done:
            break
    dist.destroy_process_group()


main()
