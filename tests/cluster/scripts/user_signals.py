"""An unmodified user script of the kind people bring: its own SIGTERM and USR2 handlers and a
finally block, no orchestrator imports, never joins a process group. It records what it saw in
OUT (argv[1]) so the test can check the signals really reached it."""

import os
import signal
import sys
import time

out = sys.argv[1]
rank = os.environ["RANK"]


def note(name: str) -> None:
    with open(os.path.join(out, f"{name}-{rank}"), "w") as fh:
        fh.write(str(time.time()))


def on_term(signum, frame):
    note("sigterm")
    sys.exit(0)  # clean exit: the finally block below still runs


signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGUSR2, lambda signum, frame: note("usr2"))
note("started")
try:
    while True:
        time.sleep(0.2)
finally:
    time.sleep(1.0)  # a clean-up that takes a moment, as flushing a log or a checkpoint does
    note("finally")
