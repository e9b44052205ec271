"""The peer for the bandwidth check: a bare torch.distributed timing loop (torchrun-launched)."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
size_mb = float(sys.argv[sys.argv.index("--size-mb") + 1])
out = sys.argv[sys.argv.index("--out") + 1]
t = torch.ones(int(size_mb * 1024 * 1024) // 4)
for _ in range(2):
    dist.all_reduce(t)
times = []
for _ in range(10):
    t0 = time.perf_counter()
    dist.all_reduce(t)
    times.append(time.perf_counter() - t0)
# Same statistic as jobs.allreduce: each rank's median, then the slowest rank's.
med = torch.tensor([sorted(times)[len(times) // 2]], dtype=torch.float64)
dist.all_reduce(med, op=dist.ReduceOp.MAX)
if dist.get_rank() == 0:
    with open(os.path.join(out, "bare.json"), "w") as fh:
        json.dump({"seconds": med.item(), "gbps": size_mb * 1024 * 1024 / med.item() / 1e9}, fh)
dist.destroy_process_group()
