"""Processes we started, and only those: identity-checked signals and leftover clean-up.

A PID alone does not name a process: once it exits, the system may give the number to anything
else. Every PID the orchestrator records is paired with the process's start time, and a signal
goes out only while that pair still matches. Where the start time comes from depends on the
platform (``platform_caps.process_table``): field 22 of ``/proc/PID/stat`` on Linux (clock ticks
since boot), psutil where there is no /proc (macOS: centiseconds since the epoch, from the
kernel's process table). Where neither can be read, no start time is known, no recorded PID is
ever confirmed, and nothing is signalled by PID: ``can_identify`` says so, for callers that must
tell the user. A start time is only compared on the host (and PID namespace) that recorded it,
which has the same table.

Standard library only, psutil excepted, and that only where there is no /proc (the zygote and
the ranks import this module).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Protocol

from orchestrator.core import platform_caps

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1

#: A process's state when it is known to have ended but not yet been reaped (/proc's letters).
_ENDED = ("Z", "X")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str  # /proc's letter: "Z" for a zombie, "R", "S", ... (psutil's status mapped to them)
    ppid: int
    pgid: int
    sid: int
    start: int


class ProcessTable(Protocol):
    """Reads other processes: one implementation per way the platform offers."""

    name: str

    def stat(self, pid: int) -> Optional[ProcStat]: ...

    def cmdline(self, pid: int) -> list[str]: ...

    def catches(self, pid: int, sig: int) -> Optional[bool]: ...

    def pids(self) -> list[int]: ...


class ProcFS:
    """Linux's /proc."""

    name = "proc"

    def stat(self, pid: int) -> Optional[ProcStat]:
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
            return None
        try:
            rest = text.rsplit(")", 1)[1].split()  # the command name may hold spaces and ')'
            return ProcStat(pid=pid, state=rest[0], ppid=int(rest[1]), pgid=int(rest[2]), sid=int(rest[3]),
                            start=int(rest[19]))
        except (IndexError, ValueError):
            return None

    def cmdline(self, pid: int) -> list[str]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                return [w.decode(errors="replace") for w in fh.read().split(b"\0")[:-1]]
        except OSError:
            return []

    def catches(self, pid: int, sig: int) -> Optional[bool]:
        """SigCgt in /proc/PID/status; False for a process that is gone."""
        try:
            with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if line.startswith("SigCgt:"):
                        return bool(int(line.split()[1], 16) >> (int(sig) - 1) & 1)
        except (OSError, ValueError, IndexError):
            pass
        return False

    def pids(self) -> list[int]:
        try:
            return [int(name) for name in os.listdir("/proc") if name.isdigit()]
        except OSError:
            return []


class PsutilTable:
    """psutil, where there is no /proc (macOS reads the kernel's process table through sysctl).
    Whether a process installed a signal handler is not something it can tell: None."""

    name = "psutil"

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil

    def stat(self, pid: int) -> Optional[ProcStat]:
        ps = self._psutil
        try:
            proc = ps.Process(pid)
            with proc.oneshot():
                status, ppid, created = proc.status(), proc.ppid(), proc.create_time()
        except (ps.Error, OSError, ValueError):
            return None
        return ProcStat(pid=pid, state="Z" if status == ps.STATUS_ZOMBIE else _STATES.get(status, "S"),
                        ppid=int(ppid), pgid=_or_unknown(os.getpgid, pid), sid=_or_unknown(os.getsid, pid),
                        start=round(created * 100))

    def cmdline(self, pid: int) -> list[str]:
        ps = self._psutil
        try:
            return [str(word) for word in ps.Process(pid).cmdline()]
        except (ps.Error, OSError):
            return []

    def catches(self, pid: int, sig: int) -> Optional[bool]:
        return None

    def pids(self) -> list[int]:
        try:
            return list(self._psutil.pids())
        except (self._psutil.Error, OSError):
            return []


class NoTable:
    """Neither /proc nor a working psutil: nothing about another process can be read, and no
    recorded PID is ever confirmed."""

    name = "none"

    def stat(self, pid: int) -> Optional[ProcStat]:
        return None

    def cmdline(self, pid: int) -> list[str]:
        return []

    def catches(self, pid: int, sig: int) -> Optional[bool]:
        return None

    def pids(self) -> list[int]:
        return []


#: psutil's status names as /proc's letters (only "Z" matters: a zombie has ended).
_STATES = {"running": "R", "sleeping": "S", "disk-sleep": "D", "stopped": "T", "tracing-stop": "t",
           "zombie": "Z", "dead": "X", "idle": "I", "waking": "W", "parked": "P", "locked": "L", "waiting": "W"}


def _or_unknown(ask: Callable[[int], int], pid: int) -> int:
    try:
        return int(ask(pid))
    except (OSError, AttributeError):
        return -1


@functools.cache
def table() -> ProcessTable:
    """This platform's way to read processes (``platform_caps.process_table``), chosen once."""
    kind = platform_caps.process_table()
    if kind == "proc":
        return ProcFS()
    if kind == "psutil":
        return PsutilTable()
    return NoTable()


def can_identify() -> bool:
    """True where a recorded PID can be confirmed to still name its process (a start time can be
    read); where it cannot, callers that would have signalled must say so, not stay silent."""
    return not isinstance(table(), NoTable)


def can_see_handlers() -> bool:
    """True where ``catches`` can tell whether a process installed a handler (Linux's /proc)."""
    return isinstance(table(), ProcFS)


def stat(pid: int) -> ProcStat | None:
    """What the process table says of PID, or None if there is no such process (or none can be read)."""
    return table().stat(pid)


def cmdline(pid: int) -> list[str]:
    """A process's argv ([] if it is gone or unreadable)."""
    return table().cmdline(pid)


def catches(pid: int, sig: int) -> bool | None:
    """True if the process has a handler installed for ``sig`` (SigCgt in /proc/PID/status), False
    if it has none or is gone, None where the platform cannot tell (macOS). A process that exec'd
    another program lost our handlers: a signal whose default action is to terminate must then
    not be sent to it."""
    return table().catches(pid, sig)


def set_parent_death_signal(sig: int) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent (the thread that forked
    it) ends, however it ends. Linux only (``platform_caps.has_prctl``); False elsewhere, where
    the caller must watch its parent itself (the zygote polls, a rank reads a pipe)."""
    return _prctl(_PR_SET_PDEATHSIG, int(sig))


def _prctl(option: int, value: int) -> bool:
    if not platform_caps.has_prctl():
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def signal_name(number: int) -> str:
    """SIGTERM, SIGRTMIN+4..., or the number itself for one Python has no name for."""
    try:
        return signal.Signals(number).name
    except ValueError:
        low, high = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
        if low is not None and high is not None and low <= number <= high:
            return f"SIGRTMIN+{number - low}"
        return f"signal {number}"


def start_time(pid: int) -> int | None:
    """PID's start time as this host's process table gives it; None if it is gone, or where no
    start time can be read (``can_identify``)."""
    st = stat(pid)
    return st.start if st else None


def alive(pid: int) -> bool:
    """True for a running process; a zombie (state Z) counts as dead. Where no process table can
    be read, only whether the PID exists (``kill(pid, 0)``): a zombie, or another process that
    reused the number, then counts as alive."""
    if not can_identify():
        return _exists(pid)
    st = stat(pid)
    return st is not None and st.state not in _ENDED


def _exists(pid: int, probe: Callable[[int, int], None] = os.kill) -> bool:
    """Whether ``probe(pid, 0)`` finds the process (or group): one we may not signal exists too."""
    if pid <= 0:
        return False
    try:
        probe(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def same_process(pid: int | None, start: int | None) -> bool:
    """True only while PID is still the live process that started at ``start`` (never where no
    start time can be read: see ``can_identify``)."""
    if not pid or start is None:
        return False
    st = stat(pid)
    return st is not None and st.start == start and st.state not in _ENDED


def signal_if_same(pid: int | None, start: int | None, sig: int) -> bool:
    """Send ``sig`` to PID only if it is still the process we recorded. True if sent."""
    if not same_process(pid, start):
        return False
    try:
        os.kill(pid, sig)  # type: ignore[arg-type]
    except ProcessLookupError:
        return False
    return True


def all_stats() -> list[ProcStat]:
    """Every process the table can read ([] where none can: ``can_identify``)."""
    return [st for st in map(stat, table().pids()) if st is not None]


def session_members(sid: int, leader_start: int) -> list[int]:
    """Live members of the session a recorded rank led (its DataLoader workers and whatever else
    it started there), or [] when that session is gone (or where processes cannot be listed).

    Neither Linux nor macOS hands out a number still used as a session id, so while any member
    lives the session id is ours. If the number now names a live process with another start
    time, the old session has ended and the number was reused: nothing of ours is left.
    """
    leader = stat(sid)
    if leader is not None and leader.start != leader_start:
        return []
    return [st.pid for st in all_stats() if st.sid == sid and st.state not in _ENDED]


def signal_session(sid: int, leader_start: int, sig: int) -> int:
    """Signal every member of a session we created (see ``session_members``); returns how many."""
    return sum(_kill(pid, sig) for pid in session_members(sid, leader_start))


def group_alive(pgid: int) -> bool:
    """True while the process group ``pgid`` has a member (an unreaped zombie counts). No
    platform hands out a number still used as a process group id, so a group the caller saw
    alive, and watched without a gap, is still the one it saw."""
    return _exists(pgid, os.killpg)


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to every member of the process group; True if it had any."""
    if pgid <= 0:
        return False
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def group_members(pgid: int) -> list[int]:
    """The live members of a process group, where processes can be listed ([] elsewhere)."""
    return [st.pid for st in all_stats() if st.pgid == pgid and st.state not in _ENDED]


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first); [] where processes cannot be listed."""
    children: dict[int, list[int]] = {}
    for st in all_stats():
        if st.state not in _ENDED:
            children.setdefault(st.ppid, []).append(st.pid)
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo += children.get(p, [])
    return out


@contextlib.contextmanager
def kept_comm() -> Iterator[None]:
    """Keep this process's kernel short name (comm, in /proc/PID/stat) across the block.

    setproctitle renames comm to the first 15 bytes of the new title, spaces included; tools
    that parse /proc/PID/stat by whitespace then lose the process -- SLURM's
    proctrack/linuxproc stops finding the rank to signal and kill, and drains the node with
    "Kill task failed". Titles belong in the command line only."""
    try:
        with open("/proc/self/comm", encoding="utf-8") as fh:
            comm = fh.read().strip()
    except OSError:
        comm = ""
    try:
        yield
    finally:
        if comm:
            try:
                with open("/proc/self/comm", "w", encoding="utf-8") as fh:
                    fh.write(comm)
            except OSError:
                pass


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process instead of init, so a grandchild that
    left its session (setsid) can still be found and stopped. Linux only; False elsewhere."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def reap_children() -> None:
    """Collect every exited child of this process (adopted orphans included)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop_descendants(grace_s: float = 2.0, poll_s: float = 0.05) -> list[int]:
    """SIGTERM every descendant of this process, SIGKILL what is left after ``grace_s``, and reap.

    Only for a process whose descendants are all ours by construction (the local zygote, which
    is a subreaper dedicated to one run). Returns the PIDs that had to be stopped.
    """
    me = os.getpid()
    found = descendants(me)
    for pid in found:
        _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and descendants(me):
        reap_children()
        time.sleep(poll_s)
    for _ in range(50):  # bounded: a process that forks as fast as we kill is still finite work
        left = descendants(me)
        if not left:
            break
        for pid in left:
            _kill(pid, signal.SIGKILL)
        time.sleep(poll_s)
        reap_children()
    reap_children()
    return found


def _kill(pid: int, sig: int) -> bool:
    """Send ``sig`` to PID; False when it is gone (or not ours to signal)."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True
