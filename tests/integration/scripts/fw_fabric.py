"""A Lightning Fabric user script written for `fabric run`, as the Fabric docs write one: Fabric()
with no arguments (the launcher's LT_* variables decide) and no fabric.launch() (which Fabric
refuses under `fabric run`: its processes already exist), a few DDP steps, then what Fabric itself
made of the world, to --out/fabric-<global rank>.json."""
import argparse
import json
import os

import torch
from lightning.fabric import Fabric

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=2)
args = parser.parse_args()

fabric = Fabric()
fabric.seed_everything(0)
model = torch.nn.Linear(32, 2)
model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
data = fabric.setup_dataloaders(torch.utils.data.DataLoader(torch.randn(64, 32), batch_size=4))
for step, batch in zip(range(args.steps), data):
    loss = model(batch).sum()
    fabric.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
ranks = fabric.all_gather(torch.tensor(fabric.global_rank)).tolist()
state = {"world_size": fabric.world_size, "global_rank": fabric.global_rank, "node_rank": fabric.node_rank,
         "gathered_ranks": ranks, "strategy": type(fabric.strategy).__name__, "device": str(fabric.device),
         "environment": type(fabric.strategy.cluster_environment).__name__}
fabric.print("fabric rank 0 of", fabric.world_size)
print("fabric", json.dumps(state), flush=True)
with open(os.path.join(args.out, f"fabric-{fabric.global_rank}.json"), "x") as f:
    json.dump(state, f)
