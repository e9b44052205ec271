"""An unmodified Lightning user script that trains until something stops it: the shipped
BoringModel for as many short steps as it is given time, with Lightning's own SIGTERM handling
(its handler broadcasts a flag from rank 0; its loops raise SIGTERMException). It names no
orchestrator module.

Rank 0's data pipeline is the slow one (each sample takes a moment, in Python), as a straggler's
is: when SIGTERM comes, rank 0 runs Lightning's handler at once while its peers wait for it in
DDP's all-reduce, in C++, where no Python handler runs until it returns. That is the order in
which the handler's broadcast meets the peers' all-reduce and neither completes; without the
straggler the same happens only now and then (when SIGTERM reaches the ranks at different times,
as on SLURM).

It notes in --out what it saw: ``training-<rank>`` once the rank has trained a few steps,
``<exception>-<rank>`` when an exception (Lightning's SIGTERMException) reached its on_exception
callback, ``finally-<rank>`` from its own finally block."""
import argparse
import os
import time

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import DataLoader

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()
rank = os.environ["RANK"]


def note(name: str) -> None:
    with open(os.path.join(args.out, f"{name}-{rank}"), "w") as fh:
        fh.write(str(time.time()))


class SlowOnRankZero(RandomDataset):
    def __getitem__(self, index: int) -> torch.Tensor:
        if rank == "0":
            time.sleep(0.1)
        return super().__getitem__(index)


class Model(BoringModel):
    def train_dataloader(self) -> DataLoader:
        return DataLoader(SlowOnRankZero(32, 64), batch_size=2)


class Notes(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # noqa: D102
        if trainer.global_step == 10:
            note("training")

    def on_exception(self, trainer, pl_module, exception):  # noqa: D102
        note(type(exception).__name__)


trainer = Trainer(max_steps=-1, max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, default_root_dir=args.out, callbacks=[Notes()])
try:
    trainer.fit(Model())
finally:
    note("finally")
