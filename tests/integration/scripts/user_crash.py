"""A plain torchrun-style script (no orchestrator import): every rank joins; rank 1 raises inside
a function of its own, the others then wait in all_reduce for it and fail when it is gone."""
import time

import torch
import torch.distributed as dist


def load_shard(rank: int) -> None:
    if rank == 1:
        raise ValueError("shard 1 is corrupt")


def main() -> None:
    dist.init_process_group("gloo")
    time.sleep(0.5)
    load_shard(dist.get_rank())
    dist.all_reduce(torch.ones(1))
    time.sleep(60)


if __name__ == "__main__":
    main()
