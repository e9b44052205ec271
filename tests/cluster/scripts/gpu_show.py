"""Prints and writes what this rank was given on a (fake-)GPU SLURM node, after one gloo
all_reduce across the job (no CUDA: the GPUs of the deploy cluster are GRES on /dev/null).

    gpu_show.py --out DIR    -> DIR/gpu-<RANK>.json
"""
import json
import os
import socket
import sys

import torch
import torch.distributed as dist

KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS",
        "GPU_DEVICE_ORDINAL", "SLURM_GPUS_PER_NODE", "SLURM_GPUS_ON_NODE", "SLURMD_NODENAME", "SLURM_JOB_NODELIST")

seen = {k: os.environ.get(k) for k in KEYS}
seen["hostname"] = socket.gethostname()
print(" ".join(f"{k}={v}" for k, v in seen.items()), flush=True)
dist.init_process_group("gloo", init_method="env://")
total = torch.tensor([float(int(os.environ["RANK"]) + 1)])
dist.all_reduce(total)
seen["sum"] = total.item()
out = sys.argv[sys.argv.index("--out") + 1]
with open(os.path.join(out, f"gpu-{os.environ['RANK']}.json"), "w") as fh:
    json.dump(seen, fh)
dist.destroy_process_group()
