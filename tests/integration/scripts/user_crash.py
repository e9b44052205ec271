"""A plain torchrun-style script (no orchestrator import): every rank joins; rank 1 raises inside
a function of its own, the others then wait in all_reduce for it and fail when it is gone.
With --abort-at-exit the failing rank then dies of SIGABRT at interpreter exit, as torch does now
and then when a gloo group is still up there.

argv: [--abort-at-exit]"""
import atexit
import os
import sys
import time

import torch
import torch.distributed as dist


def load_shard(rank: int) -> None:
    if rank == 1:
        if "--abort-at-exit" in sys.argv:
            atexit.register(os.abort)
        raise ValueError("shard 1 is corrupt")


def main() -> None:
    dist.init_process_group("gloo")
    time.sleep(0.5)
    load_shard(dist.get_rank())
    dist.all_reduce(torch.ones(1))
    time.sleep(60)


if __name__ == "__main__":
    main()
