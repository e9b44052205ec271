"""A torchrun-style script, unchanged: it reads only the standard env:// variables.

It also writes down how it was started (its parent, its command line) and the interface
variables it saw, for the tests that check the launch itself."""
import json
import os
import sys

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
local_rank = int(os.environ["LOCAL_RANK"])
world = int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method="env://")
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
out = sys.argv[sys.argv.index("--out") + 1]
with open("/proc/self/cmdline", "rb") as fh:
    cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
with open(os.path.join(out, f"byo-{rank}.json"), "w") as fh:
    json.dump({"rank": rank, "local_rank": local_rank, "world": world, "sum": t.item(),
               "node_rank": int(os.environ["NODE_RANK"]), "master": os.environ["MASTER_ADDR"],
               "pid": os.getpid(), "ppid": os.getppid(), "cmdline": cmdline,
               "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
               "nccl_ifname": os.environ.get("NCCL_SOCKET_IFNAME")}, fh)
dist.destroy_process_group()
