"""Writes what this rank was given (used by the fake-GPU cluster test)."""
import json
import os
import sys

out = sys.argv[sys.argv.index("--out") + 1]
with open(os.path.join(out, f"dev-{os.environ['RANK']}.json"), "w") as fh:
    json.dump({k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES")}, fh)
