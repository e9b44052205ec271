"""A torch-free "training" for the --fresh tests: look in $ORCH_CHECKPOINT_DIR for the marker an
earlier attempt left, note in --out/<tag>.jsonl whether one was there, then leave a marker of its
own (its count: 1 on a run that started from nothing, 2 on one that resumed once...). With
--seconds it then sleeps (a run that stays active)."""
import json
import os
import sys
import time


def arg(name: str, default: str | None = None) -> str | None:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


ckpt = os.environ["ORCH_CHECKPOINT_DIR"]
os.makedirs(ckpt, exist_ok=True)
marker = os.path.join(ckpt, "marker.txt")
old = open(marker).read().strip() if os.path.exists(marker) else None
with open(marker, "w") as fh:
    fh.write(str(int(old or 0) + 1))
with open(os.path.join(arg("--out"), f"{arg('--tag', 'run')}.jsonl"), "a") as fh:
    fh.write(json.dumps({"ckpt": ckpt, "found": old}) + "\n")
time.sleep(float(arg("--seconds", "0")))
