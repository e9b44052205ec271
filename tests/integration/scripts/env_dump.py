"""A plain torchrun-style script (no orchestrator import): joins, writes the environment it was
given and its working directory to --out/env-RANK.json, and leaves."""
import argparse
import json
import os

import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()
dist.init_process_group("gloo")
with open(os.path.join(args.out, f"env-{dist.get_rank()}.json"), "w") as fh:
    json.dump({"env": dict(os.environ), "cwd": os.getcwd()}, fh)
dist.barrier()
dist.destroy_process_group()
