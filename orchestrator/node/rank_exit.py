"""How a rank's process ends: the interpreter's exit work for the script, without module teardown.

Once torch is imported, most of an interpreter's exit is the teardown of torch's modules: clearing
tens of thousands of objects one module at a time, for a process about to be gone (with
``torch._dynamo`` loaded, as DistributedDataParallel loads it, about three times what ``leave``
costs; docs/PERFORMANCE.md, "Exit"). Every rank ends through ``leave`` instead: a forked local rank (``executors.zygote``), a fresh
local rank (``orchestrator.node.launcher``) and an srun task (``orchestrator.backends.slurm.node.slurm_rank``). It does
what the script could see of a normal exit, in its order: join the threads the script left
running, run the exit hooks (the script's, logging's, multiprocessing's, the launcher's release
of a process group), finalize what the script's own modules held, flush every file still open
(Python's and C's), and only then end the process with its exit code.

Standard library only: it runs on every rank.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, NoReturn

from orchestrator.core.module_origin import is_users_own


def leave(code: int, ran: bool, preloaded: Mapping[str, int]) -> NoReturn:
    """End this rank with ``code``. ``ran``: the entrypoint ran (its threads, hooks and objects
    get their exit; otherwise only the standard streams are flushed). ``preloaded``: the modules
    (name to ``id``) that are known never to be the user's, left alone (a forked rank's zygote had
    them before the fork; its objects were frozen out of the collector, so neither the collection
    nor the search for open files walks torch's 300,000 objects again in every rank)."""
    try:
        if ran:
            import atexit
            import gc
            import io
            import threading

            threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx does first
            atexit._run_exitfuncs()  # prints what a hook raised, as at a normal exit
            drop_user_namespaces(preloaded)
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
            _flush_c_streams()
        finally:
            os._exit(code)


def _flush_c_streams() -> None:
    """C's buffered streams (``printf`` and ``std::cout`` from an extension, NCCL's log): the C
    library's ``exit`` flushes them, ``_exit`` does not."""
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except Exception:  # no C library to find (not on Linux or macOS): nothing buffered we could reach
        pass


def drop_user_namespaces(preloaded: Mapping[str, int]) -> None:
    """What the interpreter's exit does to the script's own objects, without tearing down the
    modules torch and the orchestrator live in: clear the namespace of ``__main__`` and of every
    module of the user's own (not the standard library's, not an installed package's, not ours),
    newest first, as module teardown would. Whatever only they held is finalized then, whatever it
    is: a gzip file gets its trailer, a zip archive its central directory, an object its
    ``__del__``. A finalizer that fails prints "Exception ignored", as at a normal exit. The
    modules in ``preloaded`` are not looked at, unless the name now holds another module: the
    script's own ``__main__`` replaced the one the process started with."""
    for name, module in reversed(list(sys.modules.items())):
        if name != "__main__" and preloaded.get(name) == id(module):
            continue
        path = getattr(module, "__file__", None)
        if name == "__main__" or (isinstance(path, str) and is_users_own(path)):
            namespace = getattr(module, "__dict__", None)
            if isinstance(namespace, dict):
                for key in [k for k in namespace if not (k.startswith("__") and k.endswith("__"))]:
                    namespace.pop(key, None)
