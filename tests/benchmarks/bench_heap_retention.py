"""What a rank keeps after a memory peak, under each C heap setting (the cost side of
orchestrator/node/malloc.py's defaults; the benefit side is bench_resnet.py's page faults and throughput).

Each case is a fresh ``python`` that imports torch, allocates ~1.5 GB (``--gb``) as tensors of training-like
sizes (256 KiB to 16 MiB) interleaved with small long-lived ones (so freed memory is not at the
top of the heap, as in a real step), frees the large ones, and reports its RSS: at the peak,
after the free (idle), and after ``malloc_trim(0)``. Cases, side by side in one run:

- glibc: the C library's own settings (plain ``python``, torchrun);
- defaults: the orchestrator's (``MALLOC_MMAP_THRESHOLD_`` 32 MiB, ``MALLOC_TRIM_THRESHOLD_`` 1 GiB);
- override: the README's way back (both 131072).

    .venv/bin/python tests/benchmarks/bench_heap_retention.py [--repeats 3] [--gb 1.5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import ctypes, json, random, sys, torch
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) * 1024
random.seed(0)
base = rss()
big, small = [], []
total = 0
while total < float(sys.argv[1]) * 1e9:
    n = random.choice([64, 256, 1024, 4096]) * 1024  # floats: 256 KiB .. 16 MiB
    big.append(torch.ones(n))
    small.append(torch.ones(random.randint(16, 2048)))  # long-lived, between the big ones
    total += n * 4
peak = rss()
del big
idle = rss()
ctypes.CDLL(None).malloc_trim(0)
trimmed = rss()
print(json.dumps({"base": base, "peak": peak, "idle": idle, "trimmed": trimmed}))
"""

CASES = {
    "glibc": {},
    "defaults": {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)},
    "override": {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"},
}


def measure(extra: dict[str, str], gb: float) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(extra)
    out = subprocess.run([sys.executable, "-c", CHILD, str(gb)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--gb", type=float, default=1.5, help="the peak allocated (the suite's smoke run takes less)")
    args = p.parse_args()
    rows: dict[str, list[dict[str, int]]] = {name: [] for name in CASES}
    for _ in range(args.repeats):  # alternated, so drift hits every case alike
        for name, extra in CASES.items():
            rows[name].append(measure(extra, args.gb))
    gb = lambda v: f"{v / 1e9:.2f}"  # noqa: E731
    print(f"{'case':10} {'peak GB':>8} {'idle GB':>8} {'after trim GB':>14}   (median of {args.repeats}; RSS)")
    for name, runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("peak", "idle", "trimmed")}
        print(f"{name:10} {gb(med['peak']):>8} {gb(med['idle']):>8} {gb(med['trimmed']):>14}")


if __name__ == "__main__":
    main()
