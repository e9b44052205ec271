"""A plain script with no signal handlers that works until something ends it, saying so every
second (what most training scripts are, to SLURM)."""
import time

start = time.time()
while True:
    print(f"alive {time.time() - start:.0f}s", flush=True)
    time.sleep(1)
