"""A torchrun-style rank: import torch, join, one all_reduce, write the wall time it got there."""
import os
import sys
import time

import torch
import torch.distributed as dist

t_import = time.time()
dist.init_process_group("gloo", init_method="env://")
dist.all_reduce(torch.ones(1))
t_done = time.time()
out = sys.argv[sys.argv.index("--out") + 1]
with open(os.path.join(out, f"rank-{os.environ['RANK']}.txt"), "w") as fh:
    fh.write(f"{t_import} {t_done}\n")
dist.destroy_process_group()
