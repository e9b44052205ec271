"""The parent of a local run's ranks: import torch once, then fork one child per rank.

N ranks that each import torch cost N imports, and importing torch is the launch's largest cost
(the "floor" of docs/PERFORMANCE.md). The zygote imports torch once, while the CLI is still
validating and planning, then forks the ranks, which share the imported modules copy-on-write.
Each child starts its own session (so the supervisor can signal its process group), redirects
its output to its log file, replaces its environment with the rank's, and runs the same
``orchestrator.launcher`` code as a spawned rank. Forking after ``import torch`` is what
PyTorch's own DataLoader workers do; CUDA is never initialised before the fork.

With ``--exec`` it imports nothing and every child execs a fresh interpreter
(``local.preload_torch: false``, exactly as on SLURM); the ranks are still its children.

The zygote is a child subreaper dedicated to one run: a rank's grandchild that left the rank's
session (setsid, daemonised) is re-parented to it, not to init. When every rank has ended, or
the zygote is told to stop (SIGTERM), it stops and reaps all its remaining descendants, so no
process a run started outlives it.

Protocol, one JSON object per line. stdin: ``{"rank", "env", "payload", "log", "fresh"}`` per rank, then
``{"done": true}``. stdout: ``{"rank", "pid"}`` per fork, then ``{"rank", "exit"}`` as each
rank ends (a negative exit is the signal that killed it, as in ``subprocess``), and finally
``{"leftovers": [pid, ...]}``: the processes it had to stop after the ranks ended.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
from typing import Any, NoReturn

from orchestrator import procs
from orchestrator.interpreter import module_argv


def emit(message: dict[str, Any]) -> None:
    """Report to the supervisor. If it is gone (a broken pipe), stop every rank and leave: ranks
    never run on without a supervisor."""
    try:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError):
        _stop_and_exit(signal.SIGPIPE, None)


def child(msg: dict[str, Any], fresh: bool) -> NoReturn:
    """Runs in the forked rank; never returns. ``fresh``: exec a new interpreter (the zygote's
    mode, or the rank's own ``"fresh"``: its environment sets variables read only at start-up)."""
    code = 1
    ran = False
    try:
        os.setsid()
        # The zygote never ends before its ranks unless it is killed (SIGKILL, the OOM killer):
        # then the ranks go too, at once, rather than train on with nothing watching them.
        procs.set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != msg["zygote"]:
            os._exit(1)  # it died before the line above took effect
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        log = os.open(msg["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        if fresh:
            os.execve(sys.executable, module_argv(sys.executable, "orchestrator.launcher", msg["payload"]),
                      msg["env"])
        os.environ.clear()
        os.environ.update(msg["env"])
        from orchestrator.launcher import main

        ran = True
        code = main([msg["payload"]])
    except BaseException:  # report anything, then leave without running the zygote's cleanup
        import traceback

        traceback.print_exc()
    finally:
        leave(code if isinstance(code, int) else 1, ran)


def leave(code: int, ran: bool) -> NoReturn:
    """End a forked rank the way the interpreter's own exit ends a script, minus the teardown of its
    modules (once torch is imported, most of a fresh interpreter's exit, which every fresh
    interpreter pays; see docs/PERFORMANCE.md): once the rank ran, join the non-daemon threads
    the script left, run the atexit hooks (the script's, logging's, multiprocessing's, the
    launcher's group release), and flush every file still open, which module teardown would have
    closed. A bare ``os._exit`` lost all of that: work that the same script keeps under
    ``python``, torchrun or srun.
    """
    try:
        if ran:
            import atexit
            import gc
            import io
            import threading

            threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx does first
            atexit._run_exitfuncs()  # prints what a hook raised, as at a normal exit
            drop_user_namespaces()
            gc.collect()
            writers = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)
            for obj in gc.get_objects():
                if type(obj) in writers:
                    try:
                        obj.flush()
                    except Exception:  # closed, or its disk is gone: as at a normal exit
                        pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def drop_user_namespaces() -> None:
    """What the interpreter's exit does to the script's own objects, without tearing down the
    modules torch and the orchestrator live in: clear the namespace of ``__main__`` and of every
    module of the user's own (not the standard library's, not an installed package's, not ours),
    newest first, as module teardown would. Whatever only they held is finalized then, whatever it
    is: a gzip file gets its trailer, a zip archive its central directory, an object its
    ``__del__``. A finalizer that fails prints "Exception ignored", as at a normal exit."""
    from orchestrator.stacks import is_framework

    for name, module in reversed(list(sys.modules.items())):
        path = getattr(module, "__file__", None)
        if name == "__main__" or (isinstance(path, str) and not is_framework(path)):
            namespace = getattr(module, "__dict__", None)
            if isinstance(namespace, dict):
                for key in [k for k in namespace if not (k.startswith("__") and k.endswith("__"))]:
                    namespace.pop(key, None)


def _stop_and_exit(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    procs.stop_descendants(grace_s=STOP_GRACE_S)
    os._exit(128 + signum)


#: How long the ranks have to end on SIGTERM when the zygote is told to stop, or its supervisor is
#: gone, before SIGKILL.
STOP_GRACE_S = 5.0


def main(argv: list[str]) -> int:
    fresh = "--exec" in argv
    parent = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("--parent=")), None)
    procs.become_subreaper()
    signal.signal(signal.SIGTERM, _stop_and_exit)
    # The supervisor's death, however it dies (SIGKILL, the OOM killer, a closed terminal), reaches
    # the zygote as SIGTERM: it stops every rank and whatever they started, then leaves.
    procs.set_parent_death_signal(signal.SIGTERM)
    if parent is not None and os.getppid() != parent:
        return 1  # the supervisor was already gone: start nothing
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides; the ranks get signals directly
    for module in [] if fresh else [m for m in argv if not m.startswith("-")] or ["torch"]:
        try:
            importlib.import_module(module)
        except ImportError:
            pass  # the ranks will report it with a proper traceback
    try:  # set up in the parent: a forked rank clears its environment, after which setproctitle cannot start
        import setproctitle

        with procs.kept_comm():
            setproctitle.getproctitle()
    except ImportError:
        pass
    children: dict[int, int] = {}
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("done"):
            break
        sys.stdout.flush()
        sys.stderr.flush()
        msg["zygote"] = os.getpid()
        pid = os.fork()
        if pid == 0:
            child(msg, fresh or bool(msg.get("fresh")))
        children[pid] = msg["rank"]
        emit({"rank": msg["rank"], "pid": pid})
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        rank = children.pop(pid, None)  # adopted orphans are reaped here too, and ignored
        if rank is not None:
            emit({"rank": rank, "exit": os.waitstatus_to_exitcode(status)})
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    emit({"leftovers": procs.stop_descendants()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
