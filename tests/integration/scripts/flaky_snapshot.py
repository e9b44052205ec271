"""A torchrun-style script that snapshots itself (no rank API) and fails on purpose, once or always:
the recovery tests start it unmodified. ``--mode crash_once | hang_once | crash_always | kill_once``.

Every step all-reduces across the ranks, prints a line and sleeps a little; rank 0 saves the step
to <ckpt>/state.json every ``--every`` steps, and every rank resumes from it.
"""

import argparse
import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", required=True)
    p.add_argument("--mode", default="crash_once")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--fail-at", type=int, default=7)
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--sleep", type=float, default=0.2)
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ckpt = Path(a.ckpt)
    ckpt.mkdir(parents=True, exist_ok=True)
    state = ckpt / "state.json"
    start = json.loads(state.read_text())["step"] if state.exists() else 0
    print(f"rank {rank}: attempt {os.environ.get('ORCH_ATTEMPT')} starts at step {start}", flush=True)
    marker = ckpt / f"failed-once-{a.mode}"
    if a.mode == "crash_always" and rank == 0:
        raise RuntimeError("this script always fails before its first checkpoint")
    total = torch.zeros(1)
    for step in range(start, a.steps):
        if step == a.fail_at and rank == world - 1 and not marker.exists():
            marker.write_text("1")
            print(f"rank {rank}: failing ({a.mode}) at {time.time():.3f}", flush=True)
            if a.mode == "crash_once":
                raise RuntimeError(f"injected crash at step {step}")
            if a.mode == "hang_once":
                print(f"rank {rank}: hanging at step {step}", flush=True)
                time.sleep(3600)
            if a.mode == "kill_once":
                os.kill(os.getpid(), signal.SIGBUS)
        t = torch.ones(1)
        dist.all_reduce(t)
        total += t
        print(f"rank {rank}: step {step} first_step_time {time.time():.3f}" if step == start else
              f"rank {rank}: step {step}", flush=True)
        if rank == 0 and (step + 1) % a.every == 0:
            tmp = ckpt / "state.json.tmp"
            tmp.write_text(json.dumps({"step": step + 1}))
            os.replace(tmp, state)
        time.sleep(a.sleep)
    dist.barrier()
    if rank == 0:
        (ckpt / "done.json").write_text(json.dumps({"steps": a.steps, "start": start}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
