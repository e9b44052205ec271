"""Who owns a run, and what another process may do to it. Standard library only.

A PID means something only on the machine, boot and PID namespace where it was taken, and a run
folder is often shared between machines (``$HOME`` and the runs folder live on NFS on most
clusters). So:

- **Host.** A record names the host of every process it lists (``this_host()``: hostname, boot
  id and PID namespace). A process on any other host never signals those PIDs.
- **Folder.** A record names the folder it was created in (its inode: a ``mv`` keeps it, a
  ``cp -r`` does not). A copy of a run folder, or a record reached through a symbolic link, is
  only read: operations never act on the original's processes from it.
- **Lock.** One live attempt per run folder: its supervisor holds an exclusive ``flock`` on
  ``<run>/lock`` from before anything is written until its end state is recorded. The kernel
  (or the NFS server) drops it when the holder dies, however it dies, so a free lock means no
  supervisor is alive, and a second start can take over safely.
- **Lease.** The lock holder renews ``<run>/lease.json`` every few seconds. Another host judges
  liveness by it (and by the lock), never by PIDs.
- **Requests.** Anyone may ask the supervisor to stop by writing ``<run>/requests/cancel``;
  the supervisor watches for it, so cancel needs no signal and works from any host.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.atomic_files import write_json_atomic
from orchestrator.core.errors import SubmissionError
from orchestrator.core.fs_checks import errno_text, is_denied, no_permission, shown
from orchestrator.core.run_folder import RunFolder
from orchestrator.core.shell_words import quoted_command

#: How often the lock holder renews its lease, and how old a lease may be before its holder
#: counts as gone (generous: NFS attribute caches and clock skew between hosts).
LEASE_RENEW_S = 5.0
LEASE_TTL_S = 30.0

def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError:
        return "?"


@functools.cache
def this_host() -> str:
    """Where this process's PIDs mean something: ``hostname|boot id|PID namespace``."""
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = "?"
    return f"{socket.gethostname()}|{_read('/proc/sys/kernel/random/boot_id')}|{pidns}"


def host_name(host: str | None) -> str:
    """The hostname part of a ``this_host()`` key, for messages."""
    return (host or "an unknown host").split("|")[0]


def folder_id(path: str | Path) -> int | None:
    """The run folder's identity: its inode (kept by ``mv`` on one filesystem and seen alike from
    every NFS client; a ``cp -r`` gets a new one)."""
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


# ---- the lock -----------------------------------------------------------------------------------
class RunLock:
    """The exclusive lock of one run folder, held by the attempt's supervisor.

    An ``flock`` belongs to the open file, so a supervisor started as a child keeps it when the
    starter hands over the descriptor (``pass_fds``) and closes its own copy (``handed_over``)."""

    def __init__(self, fd: int, run_dir: Path) -> None:
        self.fd, self.run_dir = fd, run_dir

    def renew(self, pid: int | None = None) -> None:
        """Write the lease: this host, the holder's pid, now. A failure is not fatal (a full disk
        must not stop training): the lock still holds, and only other hosts see a stale lease."""
        try:
            write_json_atomic(RunFolder.of(self.run_dir).lease, {"host": this_host(), "pid": pid or os.getpid(),
                                                        "time": time.time()})
        except OSError:
            pass

    def release(self) -> None:
        """Unlock and close (the end state is recorded by then)."""
        if self.fd >= 0:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                self.handed_over()

    def handed_over(self) -> None:
        """Close this copy only: the child that got the descriptor holds the lock on."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _open_lock(run_dir: Path) -> int:
    path = RunFolder.of(run_dir).lock
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if is_denied(exc):  # another user's run folder: theirs to open up, never to remove
            reason, fix = no_permission(path, "written" if os.path.lexists(path) else "created", exc)
            raise SubmissionError(f"the run's lock file {shown(path)} {reason}: {fix}") from None
        raise SubmissionError(f"cannot open the run's lock file {path} ({exc.strerror}); the run folder must be "
                              "a writable folder of its own: remove or rename whatever is there") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SubmissionError(f"{path} is not a regular file; remove it (it is the run's lock)")
    return fd


def take(run_dir: str | Path) -> RunLock:
    """The run folder's lock, or SubmissionError naming the live attempt that holds it."""
    run_dir = Path(run_dir)
    fd = _open_lock(run_dir)
    try:
        for _ in range(10):  # `status` elsewhere probes the lock for an instant: not a holder
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.05)
        else:
            raise BlockingIOError
    except BlockingIOError:
        os.close(fd)
        raise SubmissionError(f"{run_dir} has a live attempt already ({holder_text(run_dir)}); follow it with "
                              f"{quoted_command('orchestrator', 'status', run_dir)} or stop it with "
                              f"{quoted_command('orchestrator', 'cancel', run_dir)}") from None
    except OSError as exc:
        os.close(fd)
        raise SubmissionError(f"cannot lock {RunFolder(run_dir).lock} ({exc.strerror}): the filesystem must support "
                              "flock (on NFS: mount without 'nolock'); use another runs_dir") from None
    return RunLock(fd, run_dir)


def is_held(run_dir: str | Path) -> bool:
    """True while some process (on any host that shares the folder) holds the run's lock. A
    folder without a lock file has never had a live attempt of this version."""
    path = RunFolder.of(run_dir).lock
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


# ---- the lease ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Lease:
    host: str
    pid: int
    time: float

    def fresh(self, now: float | None = None) -> bool:
        return (now if now is not None else time.time()) - self.time < LEASE_TTL_S


def lease(run_dir: str | Path) -> Lease | None:
    try:
        data = json.loads(RunFolder.of(run_dir).lease.read_bytes()[:4096])
        return Lease(str(data["host"]), int(data["pid"]), float(data["time"]))
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


def holder_text(run_dir: str | Path) -> str:
    held = lease(run_dir)
    if held is None:
        return "its supervisor has not written its lease yet"
    where = "this host" if held.host == this_host() else f"host {host_name(held.host)}"
    return f"supervised by pid {held.pid} on {where}, lease renewed {max(0.0, time.time() - held.time):.0f}s ago"


# ---- what an operation may do -------------------------------------------------------------------
def copy_reason(created_in: int | None, run_dir: str | Path) -> str | None:
    """Why the record in ``run_dir`` is not the run's own (None: it is): the folder is a copy."""
    if created_in is not None and folder_id(run_dir) != created_in:
        return (f"{run_dir} is a copy of a run folder (not the folder its record was created in); "
                "operations act only on the original")
    return None


def foreign_reason(host: str | None, created_in: int | None, run_dir: str | Path) -> str | None:
    """Why this process must not signal the processes a record lists (None: it may): they live
    on another host, the record is not in the folder it was created in (a copy), or it names
    no host at all."""
    copy = copy_reason(created_in, run_dir)
    if copy:
        return copy
    if host is None:
        return "its record names no host (made by an older version): its processes are not signalled"
    if host != this_host():
        return f"it runs on host {host_name(host)}: run the command there"
    return None


# ---- requests to the supervisor -----------------------------------------------------------------
#: Errors of a path in the way of the request (a file where its folder goes, a loop, a folder
#: where the file goes): the run's own leftovers, safe to clear.
_IN_THE_WAY = frozenset({errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENOTEMPTY, errno.ELOOP})

def request_cancel(run_dir: str | Path, why: str) -> None:
    """Ask the run's supervisor (or SLURM agent) to stop: a request file in the run folder.

    A teammate who may not write the run folder gets "no permission" naming who owns what and
    what they can change (``fs_checks.no_permission``), never advice to remove anything: the
    folder is fine, and not theirs. Only a path in the way (a file where the requests folder
    goes) is to be cleared; any other error is the filesystem's, and says so."""
    path = RunFolder.of(run_dir).cancel_request
    try:
        write_json_atomic(path, {"host": this_host(), "pid": os.getpid(), "time": time.time(), "why": why})
    except OSError as exc:
        if is_denied(exc):
            reason, fix = no_permission(path, "written", exc)
            raise SubmissionError(f"the cancel request {shown(path)} {reason}: {fix}; or ask whoever started the "
                                  "run to cancel it") from None
        if exc.errno in _IN_THE_WAY:
            raise SubmissionError(f"cannot write the cancel request {shown(path)} ({errno_text(exc)}); remove "
                                  f"whatever is in the way at {shown(path.parent)} and try again") from None
        raise SubmissionError(f"cannot write the cancel request {shown(path)} ({errno_text(exc)}): the run "
                              f"folder's filesystem refuses it; cancel again once it takes writes (df -h "
                              f"{shown(path.parent.parent)})") from None


def cancel_requested(run_dir: str | Path) -> bool:
    """Anything at the request's path asks for a stop (whoever can write the run folder may)."""
    return os.path.lexists(RunFolder.of(run_dir).cancel_request)


def forget_requests(run_dir: str | Path) -> None:
    """Before an attempt starts: an earlier attempt's request is not for it. Whatever is in the
    way (a folder, a file where the requests folder goes) is removed, being the run's own."""
    import shutil

    target = RunFolder.of(run_dir).cancel_request
    requests = target.parent
    if os.path.isdir(requests) and not os.path.islink(requests):
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)
    elif os.path.lexists(requests):
        requests.unlink()
