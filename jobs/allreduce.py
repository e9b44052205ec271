"""All-reduce bandwidth check: a preflight of the interconnect across sizes.

Reports algorithm bandwidth (size / time) and bus bandwidth (algbw * 2(n-1)/n, the traffic
each link carries in a ring all-reduce, comparable across world sizes, as nccl-tests does).
Entrypoint ``jobs.allreduce:main``; rank 0 returns (and writes to the run folder) the table.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Sequence

import torch
import torch.distributed as dist

from jobs.argtypes import non_negative_int, positive_float, positive_int
from jobs.distributed import distributed
from orchestrator.core.run_folder import RunFolder


def measure(size_bytes: int, iters: int, warmup: int, device: torch.device) -> float:
    """Median seconds per all_reduce of a float32 tensor of ``size_bytes``."""
    tensor = torch.ones(max(1, size_bytes // 4), dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(tensor)
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dist.all_reduce(tensor)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    # The slowest rank defines the collective's time.
    t = torch.tensor([sorted(times)[len(times) // 2]], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def main(argv: Sequence[str] = ()) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="jobs.allreduce")
    p.add_argument("--sizes-mb", type=positive_float, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--iters", type=positive_int, default=10)
    p.add_argument("--warmup", type=non_negative_int, default=2)
    args = p.parse_args(list(argv))
    with distributed() as ctx:
        if ctx.backend is None:
            raise RuntimeError("the all-reduce check needs at least 2 ranks")
        n = ctx.world_size
        rows = []
        for mb in args.sizes_mb:
            size = int(mb * 1024 * 1024)
            seconds = measure(size, args.iters, args.warmup, ctx.device)
            algbw = size / seconds / 1e9
            rows.append({"size_mb": mb, "seconds": seconds, "algbw_gbps": algbw,
                         "busbw_gbps": algbw * 2 * (n - 1) / n})
        result = {"world_size": n, "backend": ctx.backend, "rows": rows}
        if ctx.is_main:
            print(f"{'size MB':>8} {'time ms':>9} {'algbw GB/s':>11} {'busbw GB/s':>11}", flush=True)
            for r in rows:
                print(f"{r['size_mb']:8.1f} {r['seconds'] * 1e3:9.2f} {r['algbw_gbps']:11.3f} {r['busbw_gbps']:11.3f}",
                      flush=True)
            out = RunFolder.of(ctx.config.run_dir).allreduce
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=2))
        return result
