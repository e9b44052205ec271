"""Entry point for the Python API tests: every rank joins, all-reduces its rank, notes what it saw
in --out and prints one line; rank 0 returns the sum (the run's result)."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        total = torch.tensor([float(rank)])
        dist.all_reduce(total)
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as fh:
            title = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
        seen = {"rank": rank, "world": world, "sum": total.item(), "node_rank": int(os.environ["NODE_RANK"]),
                "title": title, "api_job_env": os.environ.get("API_JOB_ENV")}  # for a spec's env: entry
        Path(args.out, f"rank-{rank}.json").write_text(json.dumps(seen))
        print(f"api_job: rank {rank} of {world} sum {total.item():g}", flush=True)
        return {"world": world, "sum": total.item()}
    finally:
        dist.destroy_process_group()
