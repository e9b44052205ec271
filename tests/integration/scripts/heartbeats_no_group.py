"""Every rank reports a few steps through the rank API's heartbeat and never joins a process group
(a data-parallel job that shards by RANK itself), then every rank stops reporting: a stall the
watchdog must see from the heartbeats alone, not at the init deadline (issue 51, item 5).

argv: STEPS"""
import sys
import time

from jobs.progress import heartbeat

steps = int(sys.argv[1])
for step in range(1, steps + 1):
    heartbeat(step, 100)
    time.sleep(0.3)
print("stopped reporting", flush=True)
time.sleep(3600)
