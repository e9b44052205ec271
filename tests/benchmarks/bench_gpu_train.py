"""On a machine with CUDA GPUs: a torchrun-style script that indexes by LOCAL_RANK, and P6
(one-GPU ``jobs.train`` against the same training loop under torchrun), side by side.

    python tests/benchmarks/bench_gpu_train.py --out DIR [--rounds 3] [--epochs 3]

1. ``local_rank_script``: a script written for torchrun, as in PyTorch's DDP tutorial
   (``torch.cuda.set_device(LOCAL_RANK)``, ``DDP(model, device_ids=[LOCAL_RANK])``), written to a
   folder outside this repository and started unmodified by ``orchestrator run`` with one rank
   per GPU of the machine (``local.devices`` lists them: locally the default is a CPU dry run),
   then by torchrun. Every rank must find its device, and see the GPUs
   torchrun's rank sees.
2. ``p6``: ``orchestrator run`` of ``jobs.train`` (resnet18, fake data, nccl, 1 GPU) and the same
   loop written by hand (same data, model, sampler, loader, optimizer and logging, no rank API)
   under ``torchrun --standalone --nproc-per-node 1``, alternated ``--rounds`` times. Throughput
   is samples/s per epoch after the first (warm-up) epoch, as each loop times it; the wall time is
   the launch to exit. Target: jobs.train within 5 % of torchrun.

Nothing sets a variable a user would not set. Writes ``DIR/gpu_train.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}

TUTORIAL = textwrap.dedent('''
    """A torchrun-style script as PyTorch's DDP tutorial writes it: the device is LOCAL_RANK."""
    import json, os, sys
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    model = DDP(torch.nn.Linear(64, 8).to(local_rank), device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(20):
        opt.zero_grad()
        model(torch.randn(32, 64, device=local_rank)).square().mean().backward()
        opt.step()
    seen = {"rank": dist.get_rank(), "local_rank": local_rank, "device": torch.cuda.current_device(),
            "device_count": torch.cuda.device_count(), "name": torch.cuda.get_device_name(local_rank),
            "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
    with open(os.path.join(sys.argv[1], f"rank-{dist.get_rank()}.json"), "w") as fh:
        json.dump(seen, fh)
    dist.destroy_process_group()
''')


# ---------------------------------------------------------------- the hand-written loop (torchrun)
def hand(args: argparse.Namespace) -> None:
    """jobs.train's loop without the rank API: what a user would write for torchrun."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    from jobs import data, models
    from jobs.rng import seed_everything

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    seed_everything(0)
    train = data.build("fake", True, None, False, True, None, args.fake_size)
    model = models.build("resnet18", data.in_channels("fake"), 10).to(local_rank)
    model = DistributedDataParallel(model, device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
    g = torch.Generator()
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                        num_workers=args.workers, generator=g)
    rates, step = [], 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        g.manual_seed(epoch)
        t0, seen = time.perf_counter(), 0
        for x, y in loader:
            x, y = x.to(local_rank, non_blocking=True), y.to(local_rank, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            step, seen = step + 1, seen + len(y)
            if rank == 0 and step % 10 == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
        rates.append(seen / (time.perf_counter() - t0))
    Path(args.out, f"hand-{rank}.json").write_text(json.dumps(rates))
    dist.destroy_process_group()


# ---------------------------------------------------------------- the driver
def _run(cmd: list[str], cwd: Path | None = None) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=ENV, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    took = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])}... exited {proc.returncode}:\n{proc.stdout[-4000:]}")
    return took


def local_rank_script(tmp: Path) -> dict[str, Any]:
    import torch

    gpus = torch.cuda.device_count()
    user = tmp / "user-project"  # outside this repository
    user.mkdir()
    (user / "ddp_tutorial.py").write_text(TUTORIAL)
    seen: dict[str, Any] = {}
    for launcher in ("orchestrator", "torchrun"):
        out = tmp / f"seen-{launcher}"
        out.mkdir()
        if launcher == "orchestrator":
            spec = user / "job.yaml"
            spec.write_text(f"name: tutorial\nentrypoint: ddp_tutorial.py\nworkdir: {user}\nnodes: 1\n"
                            f"gpus_per_node: {gpus}\nruns_dir: {tmp / 'runs'}\nextra_args: [{out}]\n"
                            # locally GPUs are used only where listed (the default is a CPU dry run)
                            f"local: {{devices: {list(range(gpus))}}}\n")
            _run([PY, "-m", "orchestrator", "run", str(spec), "--fresh"], cwd=user)
        else:
            _run([PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
                  str(user / "ddp_tutorial.py"), str(out)], cwd=user)
        seen[launcher] = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(gpus)]
    for row in seen["orchestrator"]:
        assert row["device"] == row["local_rank"] == row["rank"], row
    # torchrun leaves CUDA_VISIBLE_DEVICES unset; the orchestrator sets it to the listed devices:
    # every other fact a rank sees (its device, how many GPUs, their names) must be the same.
    same = [{k: v for k, v in r.items() if k != "CUDA_VISIBLE_DEVICES"} for r in seen["orchestrator"]]
    peer = [{k: v for k, v in r.items() if k != "CUDA_VISIBLE_DEVICES"} for r in seen["torchrun"]]
    assert same == peer, f"the ranks saw other devices than under torchrun: {seen}"
    return {"gpus": gpus, "ranks": seen["orchestrator"]}


def p6(tmp: Path, a: argparse.Namespace) -> dict[str, Any]:
    train_args = {"dataset": "fake", "fake-size": a.fake_size, "model": "resnet18", "epochs": a.epochs,
                  "batch-size": a.batch_size, "workers": a.workers}
    rates: dict[str, list[float]] = {"jobs.train": [], "torchrun": []}
    walls: dict[str, list[float]] = {"jobs.train": [], "torchrun": []}
    for r in range(a.rounds):
        order = ("jobs.train", "torchrun") if r % 2 == 0 else ("torchrun", "jobs.train")
        for side in order:
            out = Path(tempfile.mkdtemp(dir=tmp))
            if side == "jobs.train":
                spec = out / "spec.json"
                spec.write_text(json.dumps({"name": "p6", "entrypoint": "jobs.train:main", "nodes": 1,
                                            "gpus_per_node": 1, "local": {"devices": [0]},
                                            "runs_dir": str(out / "runs"), "args": train_args}))
                walls[side].append(_run([PY, "-m", "orchestrator", "run", str(spec), "--fresh"]))
                metrics = next((out / "runs").glob("p6-*/metrics/rank-0.jsonl"))
                per_epoch = [json.loads(ln)["samples_per_s"] for ln in metrics.read_text().splitlines()
                             if json.loads(ln).get("kind") == "throughput"]
            else:
                walls[side].append(_run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
                                          str(HERE), "hand", "--out", str(out), "--epochs", str(a.epochs),
                                          "--fake-size", str(a.fake_size), "--batch-size", str(a.batch_size),
                                          "--workers", str(a.workers)]))
                per_epoch = json.loads((out / "hand-0.json").read_text())
            rates[side].extend(per_epoch[1:])  # the first epoch warms cudnn and the allocator up
            print(f"[p6] round {r + 1} {side}: {[round(x) for x in per_epoch]} samples/s per epoch, "
                  f"{walls[side][-1]:.1f} s wall", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    wall = {k: statistics.median(v) for k, v in walls.items()}
    return {"train_args": train_args, "rounds": a.rounds, "samples_per_s_median": med,
            "samples_per_s_all": rates, "wall_s_median": wall,
            "ratio_jobs_train_over_torchrun": med["jobs.train"] / med["torchrun"],
            "within_5_percent": med["jobs.train"] >= 0.95 * med["torchrun"]}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", nargs="?", default="driver", choices=["driver", "hand"])
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--fake-size", type=int, default=8192)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--only", nargs="*", default=None)
    a = p.parse_args()
    if a.mode == "hand":
        hand(a)
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="gpu-train-"))
    results: dict[str, Any] = {}
    for name, fn in (("local_rank_script", lambda: local_rank_script(tmp)), ("p6", lambda: p6(tmp, a))):
        if a.only and name not in a.only:
            continue
        t0 = time.monotonic()
        try:
            results[name] = {"ok": True, **fn()}
        except Exception as exc:  # one failed check is reported and the next still runs
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        results[name]["seconds"] = round(time.monotonic() - t0, 1)
        print(f"{name}: {json.dumps(results[name], default=str)}", flush=True)
    (out / "gpu_train.json").write_text(json.dumps(results, indent=2, default=str))
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
