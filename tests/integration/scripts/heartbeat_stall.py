"""A script using the rank API's heartbeat whose logs never go quiet (a thread keeps printing)
while rank STUCK stops in a function of its own and the others wait for it in all_reduce: the
heartbeats, not the log output, tell the watchdog that no rank progresses.

argv: STUCK"""
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

from jobs.progress import heartbeat


def chatter() -> None:
    while True:
        print("still printing", flush=True)
        time.sleep(0.5)


def stuck_in_io() -> None:
    time.sleep(600)


def main() -> None:
    stuck, rank = int(sys.argv[1]), int(os.environ["RANK"])
    threading.Thread(target=chatter, daemon=True).start()
    dist.init_process_group("gloo")
    t = torch.ones(8)
    for step in range(10_000):
        if step == 5 and rank == stuck:
            stuck_in_io()
        dist.all_reduce(t)
        heartbeat(step)
        time.sleep(0.2)


main()
