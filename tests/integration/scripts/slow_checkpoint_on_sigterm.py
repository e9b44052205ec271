"""An unmodified torchrun-style script that checkpoints on SIGTERM, and takes its time doing it:
the handler only sets a flag, the ranks agree on it at every step (an all-reduce), then rank 0
writes its checkpoint for several seconds while the others wait for it in a barrier. Every rank
is inside a collective for most of the stop but rank 0, which is not: a stop under way, which
must keep its stop_grace_s.

It names no orchestrator module. In argv[1] it notes ``training-<rank>`` once it has trained a
few steps, ``checkpoint`` once rank 0 wrote it, and ``finally-<rank>`` from its finally block.
"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

out = sys.argv[1]
write_s = float(sys.argv[2]) if len(sys.argv) > 2 else 5.0
rank = int(os.environ["RANK"])
stop = torch.tensor([0])


def note(name: str) -> None:
    with open(os.path.join(out, name), "w") as fh:
        fh.write(str(time.time()))


def on_term(signum, frame):
    stop[0] = 1


signal.signal(signal.SIGTERM, on_term)
dist.init_process_group("gloo")
weights = torch.zeros(1000)
try:
    step = 0
    while True:
        grad = torch.randn(1000)
        dist.all_reduce(grad)
        weights -= 0.01 * grad
        agreed = stop.clone()
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)  # every rank stops at the same step
        if agreed.item():
            break
        step += 1
        if step == 10:
            note(f"training-{rank}")
        time.sleep(0.01)
    if rank == 0:
        time.sleep(write_s)  # a checkpoint that takes a while to write (a large model, a slow disk)
        torch.save({"step": step, "weights": weights}, os.path.join(out, "checkpoint.pt"))
        note("checkpoint")
    dist.barrier()  # the others wait here for rank 0's write
finally:
    note(f"finally-{rank}")
