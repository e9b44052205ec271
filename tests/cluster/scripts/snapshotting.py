"""An unmodified user script that snapshots itself every epoch and resumes from its snapshot:
no signal handling, no orchestrator imports. It runs EPOCHS epochs of EPOCH_S seconds."""

import json
import os
import sys
import time

out, epochs, epoch_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
rank = os.environ["RANK"]
snapshot = os.path.join(out, f"snapshot-{rank}.json")
start = json.load(open(snapshot))["epoch"] if os.path.exists(snapshot) else 0
attempt = os.environ.get("SLURM_RESTART_COUNT", "0")
with open(os.path.join(out, f"attempts-{rank}.log"), "a") as fh:
    fh.write(f"attempt {attempt} starts at epoch {start}\n")
for epoch in range(start, epochs):
    time.sleep(epoch_s)
    with open(snapshot + ".tmp", "w") as fh:
        json.dump({"epoch": epoch + 1}, fh)
    os.replace(snapshot + ".tmp", snapshot)
    print(f"epoch {epoch + 1}/{epochs} done", flush=True)
