"""An unmodified torchrun-style DDP script whose SIGTERM handler does a collective, as Lightning's
does (its handler broadcasts a flag from rank 0): the pattern that cannot end on a SIGTERM that
reaches the ranks while they are at different places.

A Python signal handler runs between bytecodes of the main thread only. Rank 0 loads its batches
slowly, in Python (1 s a step, so that even on a busy machine its peers are nearly always inside
the all-reduce), so when SIGTERM comes it runs the handler at once and broadcasts; the others wait
inside DDP's gradient all-reduce, in C++, and would run their handlers only once that returns.
Rank 0's broadcast is matched against their all-reduce: neither completes until the timeout.

It names no orchestrator module. In argv[1] it notes ``training-<rank>`` once it has trained a
few steps, ``sigterm-<rank>`` when its handler starts, and ``finally-<rank>`` from its finally
block (which a rank killed while stuck never reaches).
"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

out = sys.argv[1]
rank = int(os.environ["RANK"])
stop = False


def note(name: str) -> None:
    with open(os.path.join(out, f"{name}-{rank}"), "w") as fh:
        fh.write(str(time.time()))


class Batches(Dataset):
    """Random samples; rank 0's take a moment each (its data pipeline is the slow one)."""

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if rank == 0:
            time.sleep(0.25)
        return torch.randn(8), torch.randn(1)


def on_term(signum, frame):
    """Tell every rank to stop, as Lightning's handler does: a broadcast from rank 0."""
    global stop
    note("sigterm")
    flag = torch.tensor([1])
    dist.broadcast(flag, src=0)
    stop = True


signal.signal(signal.SIGTERM, on_term)
dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
try:
    for step, (x, y) in enumerate(DataLoader(Batches(), batch_size=4)):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # DDP's all-reduce of the gradients
        optimizer.step()
        if step == 3:
            note("training")
        if stop:
            break
finally:
    note("finally")
