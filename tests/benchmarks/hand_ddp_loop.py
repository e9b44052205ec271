"""The peer for training throughput: a hand-written DDP loop (same model, data, batch, optimizer
as jobs.train), launched with torchrun. Prints samples/s per epoch for rank 0."""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from jobs import data, models

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--batch-size", type=int, default=32)
p.add_argument("--out", required=True)
args = p.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
train = data.digits(True)
model = DistributedDataParallel(models.build("smallcnn", 1, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, drop_last=True)
rates = []
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    t0, seen = time.perf_counter(), 0
    for x, y in loader:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        seen += len(y)
    rates.append(seen / (time.perf_counter() - t0))
with open(os.path.join(args.out, f"hand-{rank}.json"), "w") as fh:
    json.dump(rates, fh)
dist.destroy_process_group()
