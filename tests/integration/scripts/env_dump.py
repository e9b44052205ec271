"""A plain torchrun-style script (no orchestrator import): joins, writes the environment it was
given, its working directory, the interface routing to MASTER_ADDR (by the ip command) and how its
C heap behaves to --out/env-RANK.json, and leaves."""
import argparse
import ctypes
import json
import os
import resource
import socket
import subprocess

import torch.distributed as dist

BLOCK, BLOCKS = 12 << 20, 8  # 96 MiB in blocks below glibc's largest mmap threshold


def heap_faults_per_cycle(cycles: int = 3) -> float:
    """Page faults of allocating, touching and freeing 96 MiB, after a first cycle: ~0 when the
    heap keeps freed memory for the next cycle, ~24,600 when it hands it back to the kernel."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def cycle() -> None:
        blocks = [libc.malloc(BLOCK) for _ in range(BLOCKS)]
        for b in blocks:
            ctypes.memset(b, 1, BLOCK)
        for b in reversed(blocks):
            libc.free(b)

    cycle()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(cycles):
        cycle()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / cycles


def own_name_ip() -> str | None:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


def routing_interface(host: str) -> str:
    """The interface carrying this host's address for ``host``, else the one routing to it. Where
    ``host`` is this node's own name and resolves to loopback (Debian's 127.0.1.1 line), the peers
    reach it over the network: then the interface that routes to another node of the job."""
    ip = socket.gethostbyname(host)
    if ip.startswith("127.") and os.environ.get("SLURM_JOB_NODELIST"):
        nodes = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                               capture_output=True, text=True).stdout.split()
        others = [socket.gethostbyname(n) for n in nodes if n != host]
        ip = next((o for o in others if not o.startswith("127.")), ip)
    for line in subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout.splitlines():
        parts = line.split()
        if parts[3].split("/")[0] == ip and parts[1] != "lo":
            return parts[1]
    route = subprocess.run(["ip", "-o", "route", "get", ip], capture_output=True, text=True).stdout.split()
    return route[route.index("dev") + 1]


parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()
dist.init_process_group("gloo")
with open(os.path.join(args.out, f"env-{dist.get_rank()}.json"), "w") as fh:
    json.dump({"env": dict(os.environ), "cwd": os.getcwd(), "heap_faults_per_cycle": heap_faults_per_cycle(),
               "routing_interface": routing_interface(os.environ["MASTER_ADDR"]),
               "own_name_ip": own_name_ip()}, fh)
dist.barrier()
dist.destroy_process_group()
