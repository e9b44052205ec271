"""A 16-node x 2-rank job's heartbeats for `orchestrator top`: every rank 'works' 10 ms a step
(rank 21: 40 ms, a straggler) and reports through the rank API, without a process group."""
import os
import time

from jobs.progress import heartbeat

rank = int(os.environ["RANK"])
work = 0.040 if rank == 21 else 0.010
for step in range(1, 3001):
    began = time.perf_counter()
    time.sleep(work)
    heartbeat(step, 3000, samples=32, busy_s=time.perf_counter() - began)
    time.sleep(0.05)
