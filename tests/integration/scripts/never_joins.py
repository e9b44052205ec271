"""A plain torch.distributed script in which one rank never calls init_process_group (it waits
in a function of its own); the others call it and wait for that rank.

argv: ABSENT_RANK"""
import os
import sys
import time

import torch.distributed as dist


def wait_for_data() -> None:
    time.sleep(3600)


rank = int(os.environ["RANK"])
if rank == int(sys.argv[1]):
    wait_for_data()
dist.init_process_group("gloo")
dist.barrier()
