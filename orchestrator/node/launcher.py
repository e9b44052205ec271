"""What runs on every rank once its environment is in place: enter the workdir, import the
entrypoint, call it, and record the outcome.

Locally each rank is a fork of the zygote running ``main``, or a fresh ``python -m
orchestrator.node.launcher <payload.json>`` (with ``--parent-pipe=FD`` where the kernel cannot end it
with its parent: ``watch_parent_pipe``), started with the environment
``rank_env.rank_environment`` built for it. On SLURM each srun task is ``python -m
orchestrator.backends.slurm.node.slurm_rank <payload.json>``, which builds that environment from SLURM's variables
and calls ``run_rank``: the same code path from there on. Standard library only until the
entrypoint imports torch.
"""

from __future__ import annotations

import atexit
import builtins
import importlib
import json
import os
from pathlib import Path
import runpy
import sys
import time
import types

from orchestrator.core import rank_error
from orchestrator.core.atomic_files import write_json_atomic
from orchestrator.core.payload import Payload, is_script
from orchestrator.core.rendezvous import remove_rendezvous_file
from orchestrator.core.run_folder import RunFolder
from orchestrator.node import malloc
from orchestrator.node.rank_env import OrchVar

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a rank imports this module)
if TYPE_CHECKING:
    from typing import Any


def call_entrypoint(entrypoint: str, argv: list[str], source_dir: str | None = None, as_main: bool = True,
                    snapshot: bool = False, live_folder: str | None = None) -> Any:
    """``pkg.module:function`` is called with the argument list; a script runs as __main__
    (``as_main=False``: through ``runpy``, which gives the caller's ``__main__`` back after).
    ``snapshot``: ``source_dir`` is the CLI's folder in the code snapshot, searched before the
    working directory (which may be the live project). ``live_folder``: a script's folder in the
    live project, searched after its folder in the snapshot (for what the snapshot lacks)."""
    if is_script(entrypoint):
        saved = sys.argv
        sys.argv = [entrypoint, *argv]
        sys.path.insert(0, str(Path(entrypoint).parent))
        if live_folder and live_folder not in sys.path:
            sys.path.insert(1, live_folder)
        try:
            if as_main:
                run_script(entrypoint)
            else:
                runpy.run_path(entrypoint, run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise
        finally:
            sys.argv = saved
        return None
    module_name, func_name = entrypoint.split(":")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if source_dir and source_dir not in sys.path:  # where the user ran the CLI: their modules
        sys.path.insert(0 if snapshot else 1, source_dir)
    func = getattr(importlib.import_module(module_name), func_name)
    return func(argv)


def run_script(path: str) -> None:
    """Run a script as ``python path`` does: as the real ``__main__`` module, which stays in
    ``sys.modules`` after it ends, so the interpreter's exit finalizes it as it finalizes any
    script. (``runpy.run_path`` drops the script's namespace when it returns: a file the
    script wrote and never closed lost its buffered tail.) Its own ``from __future__`` flags
    only: nothing leaks in from this module."""
    from importlib.machinery import SourceFileLoader

    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __builtins__=builtins, __spec__=None,
                         __loader__=SourceFileLoader("__main__", path))
    code = compile(Path(path).read_bytes(), path, "exec", dont_inherit=True)
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


_FIRST_TITLE: list[str] = []  # the process's own title, before any rank renamed it


def name_process(payload: Payload, rank: int) -> None:
    """``ps`` and ``top`` show the job and the rank ("orchestrator: digits rank 3/4 (python3 -u -m
    ...)"). The original command line stays in the title, so what matches on it still does.
    Optional: without the setproctitle package, nothing changes."""
    try:
        import setproctitle
    except ImportError:
        return
    from orchestrator.core.procs import kept_comm

    with kept_comm():
        if not _FIRST_TITLE:
            _FIRST_TITLE.append(setproctitle.getproctitle())
        world = os.environ.get("WORLD_SIZE", "")
        setproctitle.setproctitle(f"orchestrator: {payload.job_name} rank {rank}{'/' + world if world else ''} "
                                  f"({_FIRST_TITLE[0]})")


def enter_workdir(payload: Payload) -> None:
    """The rank's working directory (spec ``workdir``; default: where the CLI was called), created
    if missing, as ``sbatch --chdir`` would need it to be; and the NCCL flight recorder's folder."""
    workdir = payload.workdir
    if workdir:
        try:
            os.makedirs(workdir, exist_ok=True)
            os.chdir(workdir)
        except OSError as exc:  # a file there, no permission, a read-only filesystem: say which
            raise OSError(exc.errno, f"the spec's workdir {workdir} cannot be entered on this node "
                                     f"({exc.strerror}); set workdir to a folder the ranks can create or use") from None
    trace = os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if trace:
        os.makedirs(os.path.dirname(trace) or ".", exist_ok=True)


def run_rank(payload: Payload, rank: int, own_process: bool = True) -> Any:
    """Run the entrypoint on this rank; record the result (rank 0) or the traceback (any rank).
    A failure is printed once, trimmed of our frames (``failures.user_traceback``), and recorded
    in full in ``<run>/errors/rank-N.json``; the exception then propagates.

    ``own_process``: the process is the rank's and ends with it (not the debug executor's
    caller): a script stays its ``__main__``, and a process group the entrypoint returned
    without destroying is destroyed at exit, after the script's own exit hooks."""
    from orchestrator.core.failures import FAILED_MARK, message_of, user_traceback

    name_process(payload, rank)
    run_dir = Path(payload.run_dir)
    install_watch_hooks(run_dir, rank)
    returned: list[bool] = []  # set once the entrypoint has returned normally
    if own_process:
        atexit.register(release_if_returned, returned)  # registered first, so it runs last
    finder = None
    if payload.code is not None:  # the project's imports come from the job's code snapshot
        from orchestrator.node import code_redirect

        finder = code_redirect.install(payload.code.live_root, payload.code.tree)
    try:
        enter_workdir(payload)
        result = call_entrypoint(payload.entrypoint, list(payload.argv), payload.source_dir, as_main=own_process,
                                 snapshot=payload.code is not None, live_folder=_live_folder(payload))
    except BaseException as exc:
        if isinstance(exc, SystemExit) and exc.code in (None, 0):
            returned.append(True)  # sys.exit(0) is a normal return
            raise
        from traceback import format_exc

        trimmed = user_traceback(exc)
        rank_error.write(RunFolder(run_dir).error(rank), rank_error.RankError(
            rank=rank, time=time.time(), attempt=int(os.environ.get(OrchVar.ATTEMPT, "0")), type=type(exc).__name__,
            message=exit_message(exc, message_of(exc)), traceback=format_exc(), user_traceback=trimmed))
        if not isinstance(exc, (SystemExit, KeyboardInterrupt)):
            sys.stderr.write(f"{FAILED_MARK.format(rank=rank)}{type(exc).__name__}: {message_of(exc)}\n{trimmed}")
            sys.stderr.flush()
        raise
    finally:
        remove_rendezvous_file(os.environ.get(OrchVar.INIT_METHOD, ""))
        from orchestrator.core import progress

        progress.leave()  # the rank's last heartbeat published; the node's staging folder gone with its last rank
        if finder is not None and not own_process:
            from orchestrator.node import code_redirect

            code_redirect.uninstall(finder)
    if rank == 0:
        write_json_atomic(RunFolder(run_dir).result, {"finished": time.time(), "result": _jsonable(result)})
    returned.append(True)
    return result


#: The exit code argparse ends a script with when it refuses its arguments (``ArgumentParser.error``).
USAGE_EXIT = 2
#: The most of argparse's line kept in the record's message (the arguments it quotes may be long).
MAX_USAGE_LINE = 500


def exit_message(exc: BaseException, message: str) -> str:
    """The record's message for ``exc``: ``message``, and for a ``SystemExit`` with argparse's
    usage code, what argparse said ("2 (train.py: error: unrecognized arguments: --lr 1)"), which
    the bare "SystemExit: 2" and its traceback into argparse leave out; without that line (a
    parser that prints its own error, a script that exits with 2 itself), where to look."""
    if not isinstance(exc, SystemExit) or exc.code != USAGE_EXIT:
        return message
    line = argparse_line(exc)
    if line:
        return f"{message} ({line})"
    return f"{message} (the code argparse exits with when it refuses the arguments: see the rank's output above)"


def argparse_line(exc: BaseException) -> str | None:
    """The "<prog>: error: ..." line argparse printed before raising ``exc``, read from the frames
    of ``ArgumentParser.exit`` (the text as printed) or else ``ArgumentParser.error`` (its prog and
    message) in the exception's traceback: no output is read back. None if argparse did not raise
    it. Never raises: it runs on a rank's way out."""
    try:
        printed = refused = None
        tb = exc.__traceback__
        while tb is not None:
            code, names = tb.tb_frame.f_code, tb.tb_frame.f_locals
            if os.path.basename(code.co_filename) == "argparse.py":
                message = names.get("message")
                if code.co_name == "exit" and isinstance(message, str) and message.strip():
                    printed = message
                elif code.co_name == "error" and isinstance(message, str):
                    refused = f"{getattr(names.get('self'), 'prog', None) or 'argparse'}: error: {message}"
            tb = tb.tb_next
        line = " ".join((printed or refused or "").split())  # one line, as a record's headline is
        if not line:
            return None
        return line if len(line) <= MAX_USAGE_LINE else f"{line[:MAX_USAGE_LINE]}... (shortened)"
    except Exception:  # a frame's locals that misbehave: the bare exit code stands
        return None


def _live_folder(payload: Payload) -> str | None:
    """A script entrypoint's folder in the live project, when it runs from the code snapshot."""
    code = payload.code
    if code is None or not payload.entrypoint.startswith(code.tree + os.sep):
        return None
    return os.path.join(code.live_root, os.path.relpath(os.path.dirname(payload.entrypoint), code.tree))


def release_if_returned(returned: list[bool]) -> None:
    """The exit hook ``run_rank`` registers: release the group only after a normal return."""
    if returned:
        release_process_group()


RELEASE_TIMEOUT_S = 60.0  # the most a rank's exit waits on the teardown of a group left to it


def release_process_group(timeout_s: float = RELEASE_TIMEOUT_S) -> None:
    """Destroy the default process group an entrypoint returned without destroying.

    Many scripts never call ``destroy_process_group()``. torch then leaves its gloo threads to
    the interpreter's exit, and there it aborts now and then: "terminate called without an active
    exception", SIGABRT, a finished rank reported as killed (under plain ``python`` too, not only
    here; how often: docs/PERFORMANCE.md); for nccl it warns that the group leaks. Runs
    as the last exit hook (after the script's threads ended and its own hooks ran, which may
    still use the group), and only after a normal return: every collective the script waited
    on is over, and teardown is local to the rank. After an exception the group is left alone,
    as a gloo worker may still wait on a peer that is gone. Bounded: should teardown still wait
    after ``timeout_s`` (work the script never waited for), the rank says so and ends with its
    entrypoint's success, as it would have without this.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    import threading

    def give_up() -> None:
        print(f"[launcher] destroying the process group the entrypoint left took over {timeout_s:.0f}s; "
              "exiting without it", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(0)

    timer = threading.Timer(timeout_s, give_up)
    timer.daemon = True
    try:
        if dist.is_available() and dist.is_initialized():
            timer.start()
            dist.destroy_process_group()
    except Exception as exc:  # the entrypoint's result stands; say why teardown failed
        print(f"[launcher] could not destroy the process group the entrypoint left: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        timer.cancel()


def install_watch_hooks(run_dir: Path, rank: int) -> None:
    """What lets the orchestrator see into a rank from outside, for any script: its stacks on a
    signal (``stack_requests.install``: faulthandler, no cost until asked) and the moment it joins its
    process group (``join_hook.install``: a wrapper around init_process_group)."""
    from orchestrator.node import join_hook, stack_requests

    stack_requests.install(run_dir, rank)
    join_hook.install(run_dir, rank)


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def apply_thread_count() -> None:
    """A rank forked after ``import torch`` keeps the parent's thread pool size; give it the
    OMP_NUM_THREADS its environment now says (a fresh interpreter reads it by itself)."""
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isascii() and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


#: ``python -m orchestrator.node.launcher PAYLOAD --parent-pipe=FD``: where the kernel cannot end a rank
#: with its parent (no prctl: macOS), the zygote hands the rank the read end of a pipe it alone
#: writes to (``watch_parent_pipe``).
PARENT_PIPE = "--parent-pipe="


def main(argv: list[str] | None = None) -> int:
    """A local rank: its environment is already in place (the supervisor built it)."""
    args = sys.argv[1:] if argv is None else argv
    pipes = [a for a in args if a.startswith(PARENT_PIPE)]
    args = [a for a in args if not a.startswith(PARENT_PIPE)]
    if len(args) != 1 or any(not p[len(PARENT_PIPE):].isdigit() for p in pipes):
        print("usage: python -m orchestrator.node.launcher PAYLOAD.json [--parent-pipe=FD] (a local rank; SLURM ranks "
              "run orchestrator.backends.slurm.node.slurm_rank)", file=sys.stderr)
        return 2
    for option in pipes:
        watch_parent_pipe(int(option[len(PARENT_PIPE):]))
    payload = Payload.load(args[0])
    rank = int(os.environ.get("RANK", "0"))
    apply_thread_count()
    malloc.apply()  # the job's heap settings: a forked rank did not start with them
    return exit_code_of(run_rank, payload, rank)


def watch_parent_pipe(fd: int) -> None:
    """End this rank, and its process group (its DataLoader workers, its children), once the
    zygote that started it is gone, however it went (SIGKILL, the OOM killer).

    Linux does this in the kernel (``prctl(PR_SET_PDEATHSIG)``); elsewhere the zygote keeps the
    only write end of a pipe whose read end is ``fd``, and never writes: a read returns only at
    end-of-file, when the zygote has exited. A daemon thread blocked in that read costs nothing
    until then, and needs no polling. The rank's own children inherit the read end, which keeps
    nothing open: only a write end would."""
    import signal
    import threading

    def wait_for_eof() -> None:
        try:
            while os.read(fd, 4096):
                pass
        except OSError:  # the entrypoint closed the descriptor: nothing left to watch
            return
        rank = os.environ.get("RANK", "?")
        try:
            os.write(2, f"[launcher] rank {rank}: the local launcher process is gone; ending this rank and "
                        f"its process group\n".encode())
        except OSError:
            pass
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=wait_for_eof, name="orchestrator-parent-watch", daemon=True).start()


def exit_code_of(run: Any, payload: Payload, rank: int) -> int:
    """The process's exit code for ``run(payload, rank)``: sys.exit's, 1 for anything raised
    (``run_rank`` printed and recorded it), 0 for a return."""
    try:
        run(payload, rank)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        return 1
    return 0


if __name__ == "__main__":  # a fresh local rank (forked ones call main from the zygote)
    from orchestrator.node.rank_exit import leave

    leave(main(), True, {})  # the exit work without torch's teardown (rank_exit)
