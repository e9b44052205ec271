"""A torch-free rank that records who forked it and what it found imported, then fails once:
rank 1 raises on its first ``--fail-attempts`` attempts (1); with ``--kill-parent-on A`` rank 0
SIGKILLs its parent (the local zygote) on attempt A. Attempts count from 0 (``ORCH_ATTEMPT``). ``--out DIR``: one ``attempt-<A>-rank-<R>.json`` per rank and attempt
({"ppid", "torch_loaded"}), written before the crash."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--fail-attempts", type=int, default=1)
parser.add_argument("--kill-parent-on", type=int, default=-1, help="rank 0 kills its parent on this attempt")
args = parser.parse_args()
rank, attempt = int(os.environ["RANK"]), int(os.environ["ORCH_ATTEMPT"])
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
(out / f"attempt-{attempt}-rank-{rank}.json").write_text(
    json.dumps({"ppid": os.getppid(), "torch_loaded": "torch" in sys.modules}))
if rank == 0 and attempt == args.kill_parent_on:
    os.kill(os.getppid(), signal.SIGKILL)  # the zygote: this rank dies with it (its parent-death signal)
    time.sleep(30)
if rank == 1 and attempt < args.fail_attempts:
    raise SystemExit(f"injected failure on attempt {attempt}")
