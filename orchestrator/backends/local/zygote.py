"""The parent of a local run's ranks: import torch once, then fork one child per rank.

N ranks that each import torch cost N imports, and importing torch is the launch's largest cost
(the "floor" of docs/PERFORMANCE.md). The zygote imports torch once, while the CLI is still
validating and planning, then forks the ranks, which share the imported modules copy-on-write.
Each child starts its own session (so the supervisor can signal its process group), redirects
its output to its log file, replaces its environment with the rank's, and runs the same
``orchestrator.node.launcher`` code as a spawned rank. Forking after ``import torch`` is what
PyTorch's own DataLoader workers do; CUDA is never initialised before the fork.

With ``--exec`` it imports nothing and every child execs a fresh interpreter
(``local.preload_torch: false``, exactly as on SLURM); the ranks are still its children.

The zygote is a child subreaper dedicated to one run: a rank's grandchild that left the rank's
session (setsid, daemonised) is re-parented to it, not to init. When every rank has ended, or
the zygote is told to stop (SIGTERM), it stops and reaps all its remaining descendants, so no
process a run started outlives it.

Where the kernel has no ``prctl`` (macOS; ``platform_caps.has_prctl``) there is no subreaper and
no parent-death signal, and the same guarantee rests on process groups and on watching parents:
each rank leads its own group, which the zygote signals whole (a rank that has ended keeps its
group watched while members live: no platform reuses a group id in use, ``procs.group_alive``);
the zygote polls its parent (the supervisor) and stops everything once it is gone; and each rank
holds the read end of a pipe only the zygote writes to, so it ends its group when the zygote is
gone (``launcher.watch_parent_pipe``). What a rank moves out of its process group (a setsid
daemon) escapes there. Where forking after ``import torch`` is not safe (macOS;
``platform_caps.fork_after_torch_safe``) the zygote imports nothing and execs every rank.

One zygote serves every attempt of a run, and every point of a sweep (issue 50): a recovery
forks the next attempt's ranks from the same warm process, so no attempt after the first imports
torch again (locally that import was most of a restart: 2.5 of a 4.8 s recovery). Between
attempts it holds nothing of theirs: it stopped what they left, and it never runs a rank's code.

Protocol, one JSON object per line. stdin, per set of ranks (an attempt): ``{"rank", "env",
"payload", "log", "fresh"}`` per rank (a SLURM job's standby sends ``"entry": "slurm"`` and the
rank's ``"args"``: ``ENTRIES``), then ``{"go": true}``; while the set runs, more rank messages (a
rank forked again beside the others, ``recovery.survivors: keep``) and ``{"signal": N}`` (to
every rank of the set); then
``{"end": true}`` once the supervisor has seen every rank end (another set may follow) or
``{"done": true}`` (the last; the end of input is the same). stdout: with ``--say-ready``,
``{"ready": seconds}`` once the imports are done (a standby's); then, per set: ``{"rank", "pid"}``
per fork, ``{"rank", "exit"}`` as each rank ends (a negative exit is the signal that killed it, as
in ``subprocess``), and after the set's end ``{"leftovers": [pid, ...]}``: the processes it had to
stop that the ranks left running. After ``end`` it waits for the next set; after ``done`` it exits.
"""

from __future__ import annotations

import collections
import gc
import importlib
import json
import os
import select
import signal
import sys
import time
from typing import Any, Iterable, NoReturn

from orchestrator.core import platform_caps, procs
from orchestrator.core.interpreter import module_argv
from orchestrator.node.rank_exit import leave


def emit(message: dict[str, Any]) -> None:
    """Report to the supervisor. If it is gone (a broken pipe), stop every rank and leave: ranks
    never run on without a supervisor."""
    try:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError):
        _stop_and_exit(signal.SIGPIPE, None)


def child(msg: dict[str, Any], fresh: bool, watch: Watch | None = None,
          mask: Iterable[int] = ()) -> NoReturn:
    """Runs in the forked rank; never returns. ``fresh``: exec a new interpreter (the zygote's
    mode, or the rank's own ``"fresh"``: its environment sets variables read only at start-up).
    ``watch``: the zygote's pipe, where the kernel cannot end the rank with it. ``mask``: the
    signal mask to restore once the rank leads its session with its own handlers (``_fork``
    blocks the stop signals across the fork)."""
    code = 1
    ran = False
    preloaded = {name: id(module) for name, module in sys.modules.items()}  # the zygote's: torch, ours, stdlib
    try:
        os.setsid()
        # The zygote never ends before its ranks unless it is killed (SIGKILL, the OOM killer):
        # then the ranks go too, at once, rather than train on with nothing watching them.
        procs.set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != msg["zygote"]:
            os._exit(1)  # it died before the line above took effect
        pipe_args: list[str] = []
        if watch is not None:  # no parent-death signal here: the rank reads the zygote's pipe instead
            os.close(watch.write_fd)
            os.set_inheritable(watch.read_fd, True)
            pipe_args = [f"{PARENT_PIPE}{watch.read_fd}"]
        for sig in RANK_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a stop sent meanwhile is delivered now
        log = os.open(msg["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        entry = ENTRIES[msg.get("entry", "local")]
        args = [msg["payload"], *pipe_args] if entry == ENTRIES["local"] else [str(a) for a in msg["args"]]
        if fresh:
            os.execve(sys.executable, module_argv(sys.executable, entry, *args), msg["env"])
        if entry == ENTRIES["local"]:  # a local rank's environment is the whole of the message's
            os.environ.clear()
        os.environ.update(msg["env"])  # a SLURM rank's is this node's step's, with the job's on top
        main = importlib.import_module(entry).main

        ran = True
        code = main(args)
    except BaseException:  # report anything, then leave without running the zygote's cleanup
        import traceback

        traceback.print_exc()
    finally:
        leave(code if isinstance(code, int) else 1, ran, preloaded)


class Watch:
    """The pipe a rank reads to learn that the zygote is gone, where the kernel cannot tell it
    (``launcher.watch_parent_pipe``): the zygote holds the only write end and never writes."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()  # both close-on-exec; a child makes the read end inheritable


#: The zygote's ranks still running (pid -> rank), and the process groups of ended ranks that still
#: had members: what it stops when told to, where no subreaper collects what the ranks left.
_RUNNING: dict[int, int] = {}
_GROUPS: list[int] = []


def _stop_and_exit(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stop_everything(_STOP_GRACE[0])
    os._exit(128 + signum)


#: How long the ranks have to end on SIGTERM when the zygote is told to stop, or its supervisor is
#: gone, before SIGKILL.
STOP_GRACE_S = 5.0
_STOP_GRACE = [STOP_GRACE_S]  # ``--stop-grace=S``: a SLURM standby's ranks get the job's stop_grace_s
POLL_S = 0.05  # without prctl: how often the zygote looks at its ranks and its parent
#: What DistributedDataParallel's constructor imports (``torch._dynamo.utils.get_optimize_ddp_mode``):
#: imported here once, before the first fork, when the supervisor's message says the ranks build DDP
#: (``forked.builds_ddp``), instead of once in every forked rank. A 2 x 2 demo run took 12.3 s and
#: 20.5 s of CPU without it, 9.4 s and 12.2 s with it (2026-11-28, 2 cores).
DDP_IMPORTS = ("torch._dynamo",)
#: What a forked rank runs (the message's ``entry``): a local rank's launcher, or a SLURM rank's
#: (a warm standby on a node of a SLURM job: ``orchestrator.backends.slurm.node.agent_standby``),
#: each a module whose ``main(args)`` returns the exit code. Named, never taken from the message.
ENTRIES = {"local": "orchestrator.node.launcher", "slurm": "orchestrator.backends.slurm.node.slurm_rank"}
#: The signals a rank takes with their default action (its launcher or script may set its own).
RANK_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)
PARENT_PIPE = "--parent-pipe="  # launcher.PARENT_PIPE, not imported: the zygote imports nothing it need not


def stop_everything(grace_s: float) -> list[int]:
    """Stop whatever the run started: every descendant, where the zygote is a subreaper (Linux);
    elsewhere the process groups of its ranks, running or ended. Returns the PIDs stopped, as far
    as they can be listed."""
    return _stop(grace_s)[0]


def _stop(grace_s: float) -> tuple[list[int], int]:
    """``stop_everything``, and how many ended ranks' process groups still had a member when they
    were signalled (none where the zygote is a subreaper: it stops descendants, not groups)."""
    if _KERNEL_GUARD:
        return procs.stop_descendants(grace_s=grace_s), 0
    return _stop_groups(grace_s)


def _stop_groups(grace_s: float) -> tuple[list[int], int]:
    """SIGTERM the process group of every rank (a running rank is the zygote's unreaped child, so
    its group id names nothing else; an ended rank's group is watched, ``_prune_groups``), reap,
    SIGKILL what is left after ``grace_s``. Returns the members seen, where they can be listed,
    and how many ended ranks' groups still had a member when signalled."""
    groups = list(dict.fromkeys([*_RUNNING, *_GROUPS]))
    ended = set(_GROUPS)
    seen = [pid for g in groups for pid in procs.group_members(g) if pid != os.getpid()]
    seen += [pid for pid in procs.descendants(os.getpid()) if pid not in seen]
    stopped = 0
    for g in groups:
        if procs.signal_group(g, signal.SIGTERM) and g in ended:
            stopped += 1
    deadline = time.monotonic() + grace_s
    while True:
        _reap()
        alive = [g for g in groups if procs.group_alive(g)]
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    for g in alive:
        procs.signal_group(g, signal.SIGKILL)
    for pid in procs.descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    time.sleep(POLL_S if alive else 0)
    _reap()
    _prune_groups()
    return seen, stopped


def _reap() -> list[tuple[int, int]]:
    """Collect every exited child: (pid, status) of each, without waiting. An ended rank leaves
    ``_RUNNING``; its process group is kept watched if anything still lives in it (the group id
    stays reserved while it has a member, so it cannot name another process's group)."""
    reaped: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        if _RUNNING.pop(pid, None) is not None and procs.group_alive(pid):
            _GROUPS.append(pid)
        reaped.append((pid, status))


def _prune_groups() -> None:
    """Forget the groups of ended ranks that have no member left (looked at every POLL_S, so a
    group id is never held on to after its group ended and the number could be handed out again)."""
    _GROUPS[:] = [g for g in _GROUPS if procs.group_alive(g)]


class Lines:
    """The supervisor's messages, one JSON object a line, read from stdin with ``os.read`` (a
    buffered ``readline`` would hide read-ahead lines from ``select``). The end of input reads as
    ``{"done": true}``."""

    def __init__(self, fd: int = 0) -> None:
        self.fd, self.buffer, self.ended = fd, b"", False
        self.queue: collections.deque[dict[str, Any]] = collections.deque()

    def _read(self) -> None:
        chunk = os.read(self.fd, 65536)
        self.ended = not chunk
        *lines, self.buffer = (self.buffer + chunk).split(b"\n")
        self.queue.extend(json.loads(line) for line in lines if line.strip())

    def ready(self, timeout_s: float) -> bool:
        """Whether ``take`` has something, waiting at most ``timeout_s``."""
        return bool(self.queue) or self.ended or bool(select.select([self.fd], [], [], timeout_s)[0])

    def take(self) -> list[dict[str, Any]]:
        """What has arrived (at most one read: call after ``ready``)."""
        if not self.queue and not self.ended:
            self._read()
        taken = [*self.queue, *([{"done": True}] if self.ended else [])]
        self.queue.clear()
        return taken

    def next(self) -> dict[str, Any]:
        """The next message, waiting for it."""
        while not self.queue and not self.ended:
            self._read()
        return self.queue.popleft() if self.queue else {"done": True}


def _wait_ranks(children: dict[int, int], lines: Lines, fresh: bool, watch: Watch | None) -> bool:
    """Run one set of ranks until every rank has ended and the supervisor ended the set (``end``;
    ``done`` or the end of input also end the run): report each rank's end as it comes, and fork a
    rank the supervisor adds meanwhile (a replacement beside the survivors). Only the supervisor
    ends a set, so a rank it adds can never arrive after the set is over. Polls every POLL_S;
    where the kernel does not guard the run, also watches the supervisor (``--parent``) and the
    ended ranks' groups. Returns whether the run ends with this set (``done``)."""
    ended_by, last = False, False
    while children or not ended_by:
        if not _KERNEL_GUARD:
            if _PARENT is not None and os.getppid() != _PARENT:  # the supervisor is gone
                _stop_and_exit(signal.SIGTERM, None)
            _prune_groups()
        reaped = _reap()
        for pid, status in reaped:
            rank = children.pop(pid, None)  # adopted orphans are reaped here too, and ignored
            if rank is not None:
                emit({"rank": rank, "exit": os.waitstatus_to_exitcode(status)})
        if reaped:
            continue
        if ended_by or lines.ended:  # nothing more can come: only the ranks' ends
            if lines.ended:
                ended_by = last = True
            time.sleep(POLL_S)
        elif lines.ready(POLL_S):
            for msg in lines.take():
                if msg.get("done") or msg.get("end"):
                    ended_by, last = True, last or bool(msg.get("done"))
                elif "signal" in msg:  # to every rank of the set (each leads its own group)
                    for pid in children:
                        procs.signal_group(pid, int(msg["signal"]))
                elif "rank" in msg:
                    children.update(_fork(msg, fresh, watch))
    return last


#: Whether the kernel guards this run (prctl: subreaper and parent-death signal), and the
#: supervisor's PID (``--parent``), which the zygote watches where it does not.
_KERNEL_GUARD = True
_PARENT: int | None = None


def _import_quietly(modules: list[str] | tuple[str, ...]) -> None:
    """Import what the ranks will import, before forking them (once imported, again is free)."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            pass  # the ranks will report it with a proper traceback


def main(argv: list[str]) -> int:
    global _KERNEL_GUARD, _PARENT
    fresh = "--exec" in argv or not platform_caps.fork_after_torch_safe()
    parent = _PARENT = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("--parent=")), None)
    _KERNEL_GUARD = platform_caps.has_prctl()
    for word in argv:
        if word.startswith("--stop-grace="):
            _STOP_GRACE[0] = float(word.split("=", 1)[1])
    procs.become_subreaper()
    signal.signal(signal.SIGTERM, _stop_and_exit)
    # The supervisor's death, however it dies (SIGKILL, the OOM killer, a closed terminal), reaches
    # the zygote as SIGTERM: it stops every rank and whatever they started, then leaves. Without
    # prctl the zygote sees it by polling its parent (_wait_ranks).
    procs.set_parent_death_signal(signal.SIGTERM)
    if parent is not None and os.getppid() != parent:
        return 1  # the supervisor was already gone: start nothing
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides; the ranks get signals directly
    began = time.monotonic()
    _import_quietly([] if fresh else [m for m in argv if not m.startswith("-")] or ["torch"])
    if "--say-ready" in argv:  # a standby (agent_standby): its agent says when a replacement would be warm
        emit({"ready": round(time.monotonic() - began, 2)})
    try:  # set up in the parent: a forked rank clears its environment, after which setproctitle cannot start
        import setproctitle

        with procs.kept_comm():
            setproctitle.getproctitle()
    except ImportError:
        pass
    watch = None if _KERNEL_GUARD else Watch()
    lines = Lines()
    last = False
    while not last:
        children: dict[int, int] = {}
        while True:
            msg = lines.next()  # the end of input is {"done": true}: the last set
            if msg.get("done") or msg.get("go"):
                last = bool(msg.get("done"))
                break
            if isinstance(msg.get("rank"), int):  # a signal meant for a set that has just ended reaches no one
                children.update(_fork(msg, fresh, watch))
        if not children and last:
            break
        last = _wait_ranks(children, lines, fresh, watch) or last
        if last:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _end_of_set()
    return 0


def _fork(msg: dict[str, Any], fresh: bool, watch: Watch | None) -> dict[int, int]:
    """Fork one rank (``child``); returns {pid: rank}."""
    sys.stdout.flush()
    sys.stderr.flush()
    msg["zygote"] = os.getpid()
    if not (fresh or msg.get("fresh")):
        if msg.get("ddp"):
            _import_quietly(DDP_IMPORTS)
        # What is loaded now is the ranks' shared, read-only base: out of the collector's
        # generations, a rank's collections never walk it (nor copy its pages by touching
        # their headers), as CPython's gc.freeze documents for a server that forks workers.
        gc.freeze()
    # A stop sent to the new rank before it leads its session with its own handlers is held, not
    # lost nor run by the zygote's handler in the rank: the supervisor signals a rank's pid when
    # its session does not exist yet (a Ctrl-C just after the ranks started).
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, RANK_SIGNALS)
    pid = os.fork()
    if pid == 0:
        child(msg, fresh or bool(msg.get("fresh")), watch, mask)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    _RUNNING[pid] = msg["rank"]
    emit({"rank": msg["rank"], "pid": pid})
    return {pid: msg["rank"]}


def _end_of_set() -> None:
    """Every rank of the set has ended: stop what they left running, and report it. Where no
    process can be listed, the report is a count of the groups that still had a member when
    signalled (not of those that emptied by themselves meanwhile: DataLoader workers ending)."""
    left, groups_stopped = _stop(2.0)
    if groups_stopped and platform_caps.process_table() is None:  # stopped, but unlisted: say so all the same
        print(f"[orchestrator] stopped what {groups_stopped} rank(s) left running in their process groups "
              "(this system cannot list those processes)", file=sys.stderr, flush=True)
    emit({"leftovers": left})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
