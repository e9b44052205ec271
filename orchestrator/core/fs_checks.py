"""Paths the environment hands us, checked before they are used. Standard library only (ranks
import it).

``ORCHESTRATOR_HOME``, ``$HOME``, the registry and the files of a run folder can be anything:
a FIFO or a device where a file belongs (reading it would block forever, or never end), a file
where a folder belongs, a dangling symbolic link or a loop, something under /proc, a folder
that cannot be read or written. Each of these is one line naming the path and the fix (an
OrchestratorError), never a traceback and never a read that blocks: files are opened with
O_NONBLOCK and checked with fstat before a byte is read.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from orchestrator.core.errors import OrchestratorError, UsageError

#: Kernel filesystems: nothing of ours is kept there, and writing to them can change the system.
KERNEL_FS = ("/proc", "/sys")

_MAX_SHOWN = 300


def shown(path: str | bytes | os.PathLike | None) -> str:
    """A path for a one-line message: control characters and text that is not valid UTF-8
    escaped (a name may hold a newline, or bytes of another encoding), and very long ones cut."""
    if path is None:
        return "?"
    text = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path)
    if not text.isprintable():
        text = ascii(text)[1:-1]
    if len(text) > _MAX_SHOWN:
        text = text[:200] + "..." + text[-90:]
    return text


def errno_text(exc: OSError) -> str:
    """``No space left on device (ENOSPC)``."""
    name = errno.errorcode.get(exc.errno) if isinstance(exc.errno, int) else None
    text = exc.strerror or str(exc) or type(exc).__name__
    return f"{text} ({name})" if name else text


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISREG, "a regular file"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISLNK, "a symbolic link"))


def kind(mode: int) -> str:
    """What a stat mode is, for a message."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def cwd_gone() -> bool:
    """The current folder was deleted (or moved out of reach): os.getcwd() fails."""
    try:
        os.getcwd()
    except OSError:
        return True
    return False


def kernel_fs(path: str | os.PathLike) -> str | None:
    """/proc or /sys when ``path`` (its symbolic links followed) lies there."""
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return None
    return next((root for root in KERNEL_FS if real == root or real.startswith(root + "/")), None)


def _dangling(path: str) -> str | None:
    if not os.path.islink(path):
        return None
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return f"is a symbolic link to {shown(target)}, which does not exist"


def _ancestor_problem(path: str) -> str | None:
    """Why ``path``, which does not exist, could never be created: the nearest existing folder
    above it is not a folder. None when it could be."""
    child, parent = path, os.path.dirname(path)
    while parent and parent != child:
        try:
            st = os.stat(parent)
        except (FileNotFoundError, NotADirectoryError):
            dangling = _dangling(parent)
            if dangling:
                return f"cannot exist: {shown(parent)} {dangling}"
            child, parent = parent, os.path.dirname(parent)
            continue
        except OSError as exc:
            return f"cannot be reached: {shown(parent)}: {errno_text(exc)}"
        if not stat.S_ISDIR(st.st_mode):
            return f"cannot exist: {shown(parent)} is {kind(st.st_mode)}, not a folder"
        return None
    return None


def problem(path: str | os.PathLike, folder: bool) -> str | None:
    """Why ``path`` cannot be used as a folder (``folder``) or as a regular file; None when it
    can, or when it does not exist but could be created there. Never blocks (stat only)."""
    path = os.fspath(path)
    root = kernel_fs(path)
    if root:
        return f"is under {root}, a kernel filesystem where nothing can be kept"
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return _dangling(path) or _ancestor_problem(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "cannot be reached: a symbolic link on its path loops (ELOOP)"
        return f"cannot be looked at: {errno_text(exc)}"
    if not (stat.S_ISDIR if folder else stat.S_ISREG)(st.st_mode):
        return f"is {kind(st.st_mode)}, not {'a folder' if folder else 'a regular file'}"
    return None


def _fail(error: type[OrchestratorError], what: str, path: str | os.PathLike, why: str, fix: str) -> OrchestratorError:
    return error(f"{what} {shown(path)} {why}: {fix}")


# ---- permission errors: "no permission", never "damaged", never "remove it" ----------------------
class ElsewhereFix(str):
    """A fix that moves to another location ("set ORCHESTRATOR_HOME to ..."): it holds for a
    permission error too, and is offered after the permission's own fix. A plain ``str`` fix
    ("remove or rename it") is for a path that is in the way, and is never offered for a
    permission error: the file is fine, and may be a teammate's."""


def is_denied(exc: OSError) -> bool:
    """A permission error (EACCES, EPERM), not a damaged or missing path."""
    return isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.EPERM)


def _looked_at(path: str) -> tuple[str, os.stat_result] | None:
    """What a permission error on ``path`` is about: the path itself when it can be looked at,
    else the nearest folder above it that can (one this user may not search, or the folder a new
    file would be created in). None if not even the root can be."""
    current = os.path.abspath(path)
    while True:
        try:
            return current, os.stat(current)
        except OSError:
            parent = os.path.dirname(current)
            if parent == current:
                return None
            current = parent


def owner_names(st: os.stat_result) -> tuple[str, str]:
    """(owner, group) of a stat result, as names where this machine knows them."""
    try:
        import grp
        import pwd
    except ImportError:  # not POSIX
        return f"uid {st.st_uid}", f"gid {st.st_gid}"
    try:
        user = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        user = f"uid {st.st_uid}"
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = f"gid {st.st_gid}"
    return user, group


def no_permission(path: str | os.PathLike, action: str, exc: OSError | None = None) -> tuple[str, str]:
    """(why, fix) for a permission error while ``path`` was being ``action`` ('read', 'written',
    'created', 'opened'): who owns what stands in the way, with which mode, and what its owner (or
    this user, for their own file) can change. Never "damaged" and never "remove it"."""
    path = os.fspath(path)
    name = errno.errorcode.get(exc.errno) if exc is not None and isinstance(exc.errno, int) else None
    code = f" ({name})" if name else ""
    found = _looked_at(path)
    if found is None:
        return f"cannot be {action}: no permission{code}", "check the permissions of the folders above it (ls -ld)"
    where, st = found
    folder = stat.S_ISDIR(st.st_mode)
    writing = action in ("written", "created")
    bits = ("w" if writing else "r") + ("x" if folder else "")
    verb = {(False, False): "read", (False, True): "open", (True, False): "write", (True, True): "write in"}[
        (writing, folder)]
    user, group = owner_names(st)
    mode = stat.filemode(st.st_mode)
    subject = "it is" if where == os.path.abspath(path) else f"its folder {shown(where)} is"
    why = f"cannot be {action}: no permission{code}; {subject} owned by {user} (group {group}, mode {mode})"
    need = sum({"r": 4, "w": 2, "x": 1}[b] for b in bits)
    allows = {who: (st.st_mode >> shift) & need == need for who, shift in (("owner", 6), ("group", 3))}
    refused_anyway = ("the mode allows it, so an ACL, a security module or the file server refuses it: ask its "
                      f"owner or your administrator (getfacl {shown(where)})")
    if st.st_uid == os.geteuid():
        return why, refused_anyway if allows["owner"] else f"it is yours: chmod u+{bits} {shown(where)}"
    in_group = st.st_gid == os.getegid() or st.st_gid in os.getgroups()
    if allows["group"]:
        if in_group:
            return why, refused_anyway
        return why, (f"you are not in its group {group} (id lists yours): ask your administrator to add you, or "
                     f"{user} to give it to a group of yours (chgrp)")
    return why, (f"ask {user}, its owner, to let group {group} {verb} it (chmod g+{bits} {shown(where)})"
                 + ("" if in_group else f", and check that you are in group {group} (id lists yours)"))


def _denied(error: type[OrchestratorError], what: str, path: str | os.PathLike, action: str, fix: str,
            exc: OSError | None = None) -> OrchestratorError:
    """The error for a permission problem: the permission's fix, then the caller's if it is an
    ``ElsewhereFix`` (another location still works; removing the path is no fix)."""
    why, own = no_permission(path, action, exc)
    return _fail(error, what, path, why, own + (f"; or {fix}" if isinstance(fix, ElsewhereFix) else ""))


def _stat_denied(path: str | os.PathLike) -> PermissionError | None:
    """The PermissionError of looking at ``path`` (a folder above it that this user may not
    search), or None."""
    try:
        os.stat(path)
    except PermissionError as exc:
        return exc
    except OSError:
        pass
    return None


def checked_dir(path: str | os.PathLike, what: str, fix: str, error: type[OrchestratorError] = UsageError,
                create: bool = False) -> Path:
    """``path`` as a folder we can use: it is one, or (``create``) it is made. Anything else
    raises ``error`` naming ``what``, the path, why, and ``fix`` (for a permission error, what
    its owner can change: ``no_permission``)."""
    denied = _stat_denied(path)
    if denied is not None:
        raise _denied(error, what, path, "opened", fix, denied)
    why = problem(path, folder=True)
    if why:
        raise _fail(error, what, path, why, fix)
    if create:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            if is_denied(exc):
                raise _denied(error, what, path, "created", fix, exc) from None
            raise _fail(error, what, path, f"cannot be created ({errno_text(exc)})", fix) from None
    return Path(path)


def _open_regular(path: str | os.PathLike, flags: int, what: str, fix: str,
                  error: type[OrchestratorError]) -> int | None:
    """An fd on ``path`` once fstat says it is a regular file; None if it does not exist.
    O_NONBLOCK: opening a FIFO never waits for a writer (or a reader). A permission error says
    so (``no_permission``), whatever ``fix`` says about a path in the way."""
    action = "read" if flags & (os.O_WRONLY | os.O_RDWR) == 0 else "written"
    denied = _stat_denied(path)
    if denied is not None:
        raise _denied(error, what, path, action, fix, denied)
    why = problem(path, folder=False)
    if why:
        raise _fail(error, what, path, why, fix)
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o666)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # O_WRONLY|O_NONBLOCK on a FIFO that no one reads
            raise _fail(error, what, path, "is a FIFO (named pipe), not a regular file", fix) from None
        if is_denied(exc):
            created = flags & os.O_CREAT and not os.path.lexists(path)
            raise _denied(error, what, path, "created" if created else action, fix, exc) from None
        raise _fail(error, what, path, f"cannot be opened ({errno_text(exc)})", fix) from None
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        os.close(fd)
        raise _fail(error, what, path, f"cannot be looked at ({errno_text(exc)})", fix) from None
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _fail(error, what, path, f"is {kind(mode)}, not a regular file", fix)
    return fd


def read_file(path: str | os.PathLike, what: str, fix: str, error: type[OrchestratorError] = UsageError,
              offset: int = 0) -> bytes | None:
    """The bytes of a regular file from ``offset`` on, or None when it does not exist (and
    could). A FIFO, a device, a folder, a loop, or an error while reading raises ``error``."""
    fd = _open_regular(path, os.O_RDONLY, what, fix, error)
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb") as fh:
            if offset:
                fh.seek(offset)
            return fh.read()
    except OSError as exc:
        if is_denied(exc):  # a file server that checks on read, not on open
            raise _denied(error, what, path, "read", fix, exc) from None
        raise _fail(error, what, path, f"cannot be read ({errno_text(exc)})", fix) from None


def append(path: str | os.PathLike, data: bytes, what: str, fix: str,
           error: type[OrchestratorError] = UsageError) -> None:
    """Append ``data`` to a regular file (created, with its folder, if missing) in one write
    (O_APPEND: lines from several processes do not interleave)."""
    path = os.fspath(path)
    checked_dir(os.path.dirname(path) or ".", what, fix, error, create=True)
    if os.path.islink(path) and not os.path.exists(path):  # O_CREAT would create its target
        raise _fail(error, what, path, _dangling(path) or "is a dangling symbolic link", fix)
    fd = _open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, what, fix, error)
    if fd is None:  # removed between the check and the open: the folder itself went away
        raise _fail(error, what, path, "cannot be created (its folder disappeared)", fix)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        if is_denied(exc):
            raise _denied(error, what, path, "written", fix, exc) from None
        raise _fail(error, what, path, f"cannot be written ({errno_text(exc)})", fix) from None
    finally:
        os.close(fd)


#: What to do when the registry of runs cannot be used (the message names its path).
REGISTRY_FIX = ElsewhereFix("set ORCHESTRATOR_HOME to a folder you can read and write (the registry of runs lives "
                            "there; default $HOME/.local/share/orchestrator)")
