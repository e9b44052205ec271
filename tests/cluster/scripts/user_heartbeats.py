"""A torch-free, torchrun-style script on the rank API's heartbeat, as an ordinary user would run
it: STEPS steps of 0.3 s, each reported (``jobs.heartbeat``) and snapshotted per rank, so a
restarted rank resumes where it was (argv: OUT STEPS)."""

import json
import os
import sys
import time

import jobs

out, steps = sys.argv[1], int(sys.argv[2])
rank = int(os.environ["RANK"])
snapshot = os.path.join(out, f"snapshot-{rank}.json")
start = json.load(open(snapshot))["step"] if os.path.exists(snapshot) else 0
for step in range(start + 1, steps + 1):
    time.sleep(0.3)
    jobs.heartbeat(step, total=steps)
    with open(snapshot + ".tmp", "w") as fh:
        json.dump({"step": step}, fh)
    os.replace(snapshot + ".tmp", snapshot)
print(f"rank {rank}: steps {start + 1}..{steps} done as uid {os.getuid()}", flush=True)
