"""A user's script whose last work happens as the interpreter exits, as ``python script.py``
(torchrun, srun) runs it: a non-daemon thread still writing after the script's last line, an
atexit hook, a file it opened and never closed (flushed when the interpreter shuts down), and a C
stream an extension wrote to and never closed (flushed by the C library's exit).

argv: OUT"""
import atexit
import ctypes
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
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.fputs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
libc.fputs(b"done", libc.fopen(os.path.join(out, f"cstdio-{rank}").encode(), b"w"))  # buffered until exit
