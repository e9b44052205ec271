"""Processes we started, and only those: identity-checked signals and leftover clean-up.

A PID alone does not name a process: once it exits, Linux may give the number to anything
else. Every PID the orchestrator records is paired with the process's start time (field 22 of
``/proc/PID/stat``, in clock ticks since boot), and a signal goes out only while that pair
still matches. Standard library only (the zygote and the ranks import it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from typing import Iterator

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    ppid: int
    pgid: int
    sid: int
    start: int


def stat(pid: int) -> ProcStat | None:
    """The fields of /proc/PID/stat we use, or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    try:
        rest = text.rsplit(")", 1)[1].split()  # the command name may hold spaces and ')'
        return ProcStat(pid=pid, state=rest[0], ppid=int(rest[1]), pgid=int(rest[2]), sid=int(rest[3]),
                        start=int(rest[19]))
    except (IndexError, ValueError):
        return None


def cmdline(pid: int) -> list[str]:
    """A process's argv ([] if it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [w.decode(errors="replace") for w in fh.read().split(b"\0")[:-1]]
    except OSError:
        return []


def catches(pid: int, sig: int) -> bool:
    """True if the process has a handler installed for ``sig`` (SigCgt in /proc/PID/status).
    A process that exec'd another program lost our handlers: a signal whose default action is
    to terminate must then not be sent to it."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (int(sig) - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def set_parent_death_signal(sig: int) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent (the thread that forked
    it) ends, however it ends. Linux only; False elsewhere."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def signal_name(number: int) -> str:
    """SIGTERM, SIGRTMIN+4..., or the number itself for one Python has no name for."""
    try:
        return signal.Signals(number).name
    except ValueError:
        if signal.SIGRTMIN <= number <= signal.SIGRTMAX:
            return f"SIGRTMIN+{number - signal.SIGRTMIN}"
        return f"signal {number}"


def start_time(pid: int) -> int | None:
    st = stat(pid)
    return st.start if st else None


def alive(pid: int) -> bool:
    """True for a running process; a zombie (state Z) counts as dead."""
    st = stat(pid)
    return st is not None and st.state not in ("Z", "X")


def same_process(pid: int | None, start: int | None) -> bool:
    """True only while PID is still the live process that started at ``start``."""
    if not pid or start is None:
        return False
    st = stat(pid)
    return st is not None and st.start == start and st.state not in ("Z", "X")


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
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = stat(int(name))
            if st is not None:
                out.append(st)
    return out


def session_members(sid: int, leader_start: int) -> list[int]:
    """Live members of the session a recorded rank led (its DataLoader workers and whatever else
    it started there), or [] when that session is gone.

    Linux never hands out a number still used as a session id, so while any member lives the
    session id is ours. If the number now names a live process with another start time, the old
    session has ended and the number was reused: nothing of ours is left.
    """
    leader = stat(sid)
    if leader is not None and leader.start != leader_start:
        return []
    return [st.pid for st in all_stats() if st.sid == sid and st.state not in ("Z", "X")]


def signal_session(sid: int, leader_start: int, sig: int) -> int:
    """Signal every member of a session we created (see ``session_members``); returns how many."""
    sent = 0
    for pid in session_members(sid, leader_start):
        try:
            os.kill(pid, sig)
            sent += 1
        except ProcessLookupError:
            pass
    return sent


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first)."""
    children: dict[int, list[int]] = {}
    for st in all_stats():
        if st.state not in ("Z", "X"):
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
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


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


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
