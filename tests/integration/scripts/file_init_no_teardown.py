"""A user's script that joins through the file:// URL it is given and ends without tearing the
process group down, as many scripts do. With an argument OUT, its own exit hook (atexit) uses the
group once more, as under plain python it can, and writes OUT/left-<rank>: the sum it got.

argv: [OUT]"""
import atexit
import datetime
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method=os.environ["ORCH_INIT_METHOD"], rank=int(os.environ["RANK"]),
                        world_size=int(os.environ["WORLD_SIZE"]), timeout=datetime.timedelta(seconds=60))
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == float(os.environ["WORLD_SIZE"])
if len(sys.argv) > 1:
    left = os.path.join(sys.argv[1], f"left-{os.environ['RANK']}")

    def last_words() -> None:
        dist.all_reduce(t)
        with open(left, "w") as fh:
            fh.write(str(t.item()))

    atexit.register(last_words)
