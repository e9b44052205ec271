"""A user's script whose last work happens as the interpreter exits, as ``python script.py``
(torchrun, srun) runs it: a non-daemon thread still writing after the script's last line, an
atexit hook, and a file it opened and never closed (flushed when the interpreter shuts down).

argv: OUT"""
import atexit
import os
import sys
import threading
import time

out, rank = sys.argv[1], os.environ["RANK"]


def late_write() -> None:
    time.sleep(1.0)
    with open(os.path.join(out, f"thread-{rank}"), "w") as fh:
        fh.write("done")


threading.Thread(target=late_write).start()
atexit.register(lambda: open(os.path.join(out, f"atexit-{rank}"), "w").write("done"))
metrics = open(os.path.join(out, f"unclosed-{rank}"), "w")
metrics.write("done")
