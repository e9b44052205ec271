"""A Lightning Trainer user script (Lightning ships no runnable example, only demo classes): the
shipped BoringModel, trained by a Trainer that names no devices, num_nodes or accelerator, as
under `srun` or `torchrun` with those left to the launcher. Writes what Lightning itself made of
the world to --out/lightning-<global rank>.json."""
import argparse
import json
import os

from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--max_steps", type=int, default=2)
args = parser.parse_args()

trainer = Trainer(max_steps=args.max_steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, default_root_dir=args.out)
trainer.fit(BoringModel())
state = {"world_size": trainer.world_size, "global_rank": trainer.global_rank, "node_rank": trainer.node_rank,
         "num_devices": trainer.num_devices, "num_nodes": trainer.num_nodes, "steps": trainer.global_step,
         "strategy": type(trainer.strategy).__name__,
         "environment": type(trainer.strategy.cluster_environment).__name__}
print("lightning", json.dumps(state), flush=True)
with open(os.path.join(args.out, f"lightning-{trainer.global_rank}.json"), "x") as f:
    json.dump(state, f)
