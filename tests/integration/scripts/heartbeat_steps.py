"""A script on the rank API's heartbeat: STEPS steps of 0.1 s, reporting each (argv: STEPS)."""
import sys
import time

import torch
import torch.distributed as dist

import jobs

steps = int(sys.argv[1])
dist.init_process_group("gloo")
for step in range(1, steps + 1):
    dist.all_reduce(torch.ones(1))
    time.sleep(0.1)
    jobs.heartbeat(step, total=steps, samples=32)
dist.destroy_process_group()
