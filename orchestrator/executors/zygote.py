"""A pre-imported parent for local ranks: import torch once, then fork one child per rank.

On a 2-core machine N ranks that each import torch cost N imports (the "floor" of
PERFORMANCE-BASELINES). The zygote imports torch once, while the CLI is still validating and
planning, then forks the ranks, which share the imported modules copy-on-write. Each child
starts its own session (so the supervisor can signal its process group), redirects its output
to its log file, replaces its environment with the rank's, and runs the same
``orchestrator.launcher`` code as a spawned rank. Forking after ``import torch`` is what
PyTorch's own DataLoader workers do; CUDA is never initialised before the fork.

Protocol, one JSON object per line. stdin: ``{"rank", "env", "payload", "log"}`` per rank, then
``{"done": true}``. stdout: ``{"rank", "pid"}`` per fork, then ``{"rank", "exit"}`` as each
rank ends (a negative exit is the signal that killed it, as in ``subprocess``).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
from typing import Any


def emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def child(msg: dict[str, Any]) -> None:
    """Runs in the forked rank; never returns."""
    code = 1
    try:
        os.setsid()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        log = os.open(msg["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.environ.clear()
        os.environ.update(msg["env"])
        from orchestrator.launcher import main

        code = main([msg["payload"]])
    except BaseException:  # report anything, then leave without running the zygote's cleanup
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


def main(argv: list[str]) -> int:
    for module in argv or ["torch"]:
        try:
            importlib.import_module(module)
        except ImportError:
            pass  # the ranks will report it with a proper traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides; the ranks get signals directly
    children: dict[int, int] = {}
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("done"):
            break
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            child(msg)
        children[pid] = msg["rank"]
        emit({"rank": msg["rank"], "pid": pid})
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        rank = children.pop(pid, None)
        if rank is not None:
            emit({"rank": rank, "exit": os.waitstatus_to_exitcode(status)})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
