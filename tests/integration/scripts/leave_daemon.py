"""A user script that leaves processes behind: a grandchild that starts its own session and
ignores SIGTERM (a 'daemonised' helper), and a plain child in the rank's session. It records
their PIDs and start times, then ends as ``LEAVE_MODE`` says: exit 0, or raise."""

import os
import signal
import subprocess
import sys
import time

run_dir = os.environ["ORCH_RUN_DIR"]
rank = os.environ["RANK"]
daemon = subprocess.Popen(
    [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
    start_new_session=True)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
for proc, kind in ((daemon, "daemon"), (child, "child")):
    with open(os.path.join(run_dir, f"left-{kind}-{rank}.pid"), "w") as fh:
        fh.write(str(proc.pid))
time.sleep(0.5)
if os.environ.get("LEAVE_MODE") == "raise" and rank == "1":
    raise RuntimeError("rank 1 fails while its helpers keep running")
if os.environ.get("LEAVE_MODE") == "raise":
    signal.pause()  # wait to be stopped by fail-fast
