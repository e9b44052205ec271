"""A plain torch.distributed script that keeps training-like steps going (everything in a
function of its own, train_step, the marker file included, so that a stack taken at any moment
is inside it) until SECONDS have passed; each rank writes alive-<rank> in OUT after every step.

argv: OUT SECONDS"""
import os
import sys
import time

import torch
import torch.distributed as dist


def train_step(t: torch.Tensor, stop: torch.Tensor, end: float, alive: str, step: int) -> bool:
    dist.all_reduce(t)
    time.sleep(0.05)
    stop.fill_(1.0 if time.time() > end else 0.0)
    dist.all_reduce(stop)
    with open(alive + ".tmp", "w") as fh:
        fh.write(f"{step} {time.time()}\n")
    os.replace(alive + ".tmp", alive)
    return stop.item() > 0


def main() -> None:
    out, seconds = sys.argv[1], float(sys.argv[2])
    alive = os.path.join(out, f"alive-{os.environ['RANK']}")
    dist.init_process_group("gloo")
    t, stop = torch.ones(1024), torch.zeros(1)
    end = time.time() + seconds
    step = 0
    while not train_step(t, stop, end, alive, step + 1):
        step += 1
    dist.destroy_process_group()


main()
