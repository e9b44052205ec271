"""A torch-free, torchrun-style script on the rank API's heartbeat, as an ordinary user would run
it: STEPS steps of 0.3 s, each reported (``jobs.heartbeat``) and snapshotted per rank, so a
restarted rank resumes where it was (argv: OUT STEPS [HANG_AT]). Every step ends with a barrier
through OUT (each rank waits until every other has snapshotted the step), as DDP's collectives
make ranks wait for each other. With HANG_AT, the last rank stops at that step once (a marker in
OUT says it did), and so every rank stops reporting: a hang for the watchdog's stall_s."""

import json
import os
import sys
import time

import jobs

out, steps = sys.argv[1], int(sys.argv[2])
hang_at = int(sys.argv[3]) if len(sys.argv) > 3 else None
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
snapshot = os.path.join(out, f"snapshot-{rank}.json")
start = json.load(open(snapshot))["step"] if os.path.exists(snapshot) else 0
marker = os.path.join(out, "hung-once")


def step_of(peer: int) -> int:
    try:
        with open(os.path.join(out, f"snapshot-{peer}.json")) as fh:
            return int(json.load(fh)["step"])
    except (OSError, ValueError, KeyError):
        return 0


def barrier(step: int) -> None:
    while any(step_of(peer) < step for peer in range(world) if peer != rank):
        time.sleep(0.05)


for step in range(start + 1, steps + 1):
    if step == hang_at and rank == world - 1 and not os.path.exists(marker):
        open(marker, "w").close()
        print(f"rank {rank}: hanging at step {step}", flush=True)
        time.sleep(3600)
    time.sleep(0.3)
    jobs.heartbeat(step, total=steps)
    with open(snapshot + ".tmp", "w") as fh:
        json.dump({"step": step}, fh)
    os.replace(snapshot + ".tmp", snapshot)
    barrier(step)
print(f"rank {rank}: steps {start + 1}..{steps} done as uid {os.getuid()}", flush=True)
