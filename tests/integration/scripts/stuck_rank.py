"""A plain torch.distributed script (no orchestrator import) in which one rank stops inside a
function of its own while the others wait for it in all_reduce.

argv: STUCK_RANK [SECONDS]: the rank that stops, and for how long (default 600)."""
import os
import sys
import time

import torch
import torch.distributed as dist


def stuck_here(seconds: float) -> None:
    time.sleep(seconds)  # the straggler: not in any collective


def step(t: torch.Tensor) -> None:
    dist.all_reduce(t)  # the others wait here for the straggler


def main() -> None:
    stuck = int(sys.argv[1])
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 600.0
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    t = torch.ones(4)
    for i in range(3):
        step(t)
        print(f"rank {rank} step {i}", flush=True)
    if rank == stuck:
        stuck_here(seconds)
    step(t)
    dist.destroy_process_group()


main()
