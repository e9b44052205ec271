"""The login node's checkout of a project shipped by ``--remote`` (``remote_receive`` serves the
submission): which checkout a submission uses (``checkout_name``: its client id's, or one an older
client named by the laptop's host name, adopted once), and making its files exactly the shipped
ones (``update_checkout``: hard links to the received blobs, stale files removed, the shipment
recorded in ``.orchestrator-shipped.json``).

In the checkout, every folder is opened one by one, relative to its parent, with ``O_NOFOLLOW``,
and every file is made beside its place and renamed onto it: nothing is ever written through a
link, whether shipped, left there by a job, or swapped in meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import stat
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from orchestrator.core.errors import UsageError
from orchestrator.remote.remote_protocol import (PROJECT, NO_PROJECT, Shipped, Submission, path_problem, shown_received,
                                          file_entries)
from orchestrator.code.snapshot_files import SHIPPED_NAME

#: Where the adoption of a host-named checkout is recorded (``checkout_name``): never a project's name.
ALIASES = ".aliases"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def checkout_name(projects: Path, submission: Submission) -> str:
    """The checkout this submission uses (only read here; ``adopt`` records a choice):

    - the one its project adopted earlier (``.aliases/<project>`` names it), while it exists;
    - else its project's own, when it exists;
    - else the checkout an older client made of this project under its host-name key
      (``legacy_project``), when that exists: runs under a relative runs_dir there resume;
    - else its own, made now.
    A submission that ships nothing uses the shared ``NO_PROJECT`` checkout."""
    if not submission.files or not submission.project:
        return NO_PROJECT
    project = submission.project
    adopted = _read_alias(projects, project)
    if adopted is not None and _is_folder(projects / adopted):
        return adopted
    if os.path.lexists(projects / project):
        return project
    legacy = submission.legacy_project
    if legacy is not None and _is_folder(projects / legacy):
        return legacy
    return project


def _is_folder(path: Path) -> bool:
    """A real folder (a link is never taken for a checkout: ``_open_checkout`` refuses it)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _read_alias(projects: Path, project: str) -> Optional[str]:
    """The checkout ``project`` adopted (None: none, or a record that names no plain checkout)."""
    data = _read_plain(projects / ALIASES / project, limit=256)
    name = "" if data is None else data.decode("ascii", "replace").strip()
    return name if PROJECT.fullmatch(name) and name != NO_PROJECT else None


def _read_plain(path: str | Path, dir_fd: Optional[int] = None, limit: int = -1) -> Optional[bytes]:
    """The content of a regular file (at most ``limit`` bytes), never through a link, never
    blocking on a FIFO; None when it is missing, not a plain file, or cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            return f.read(limit) if stat.S_ISREG(os.fstat(f.fileno()).st_mode) else None
    except OSError:
        return None


def adopt(projects: Path, project: str, checkout: str) -> None:
    """Record that ``project`` uses the older checkout ``checkout`` from now on (a file replaced
    whole, in a folder opened without following links), so a later submission finds it again
    even after the host name, and so the older name, changed."""
    if checkout == project or _read_alias(projects, project) == checkout:
        return
    parent = os.open(projects, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            folder = _open_child(parent, ALIASES, create=True)
        except _Blocked:
            raise UsageError(f"{projects / ALIASES} is not a folder: move it aside there, then submit again") from None
        assert folder is not None
        try:
            _write_whole(folder, project, (checkout + "\n").encode("ascii"), 0o644)
        finally:
            os.close(folder)
    finally:
        os.close(parent)
    print(f"[orchestrator] {project}: using the checkout {checkout} that an older version made of this project "
          "(named by your machine's host name then); later submissions keep using it", file=sys.stderr, flush=True)


def lock_file(path: Path) -> int:
    """An exclusive lock on ``path`` (made if missing, never through a link, never truncated)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def enter_checkout(checkout: Path, cwd: str) -> None:
    """Make ``cwd`` in the checkout (never through a link) and change into it."""
    root = _open_checkout(checkout)
    folders = _Folders(root)
    try:
        try:
            where = folders.at([] if cwd == "." else cwd.split("/"), create=True)
        except _Blocked as blocked:
            raise UsageError(f"refusing the folder you submitted from, {shown_received(cwd)}: "
                             f"{blocked.describe(checkout)}") from None
        assert where is not None
        os.fchdir(where)
    finally:
        folders.close()
        os.close(root)


class _Blocked(Exception):
    """A path's folder that cannot be entered: a link (never followed) or a file."""

    def __init__(self, where: str, kind: str) -> None:
        super().__init__(where)
        self.where, self.kind = where, kind

    def describe(self, checkout: Path) -> str:
        if self.kind == "link":
            return (f"{self.where} in the login node's checkout {checkout} is a link, and nothing is written through "
                    "one (a link leading out of the checkout would write outside it); remove that link there, or "
                    "stop shipping files beneath it")
        return (f"{self.where} is a file in the login node's checkout {checkout}, where a folder is needed; move it "
                "aside there, then submit again")


def _lstat_at(folder: int, name: str) -> Optional[os.stat_result]:
    try:
        return os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _open_child(folder: int, name: str, create: bool) -> Optional[int]:
    """The folder ``name`` in ``folder``, opened without following a link (made first when
    missing and ``create``; None when missing otherwise). Raises _Blocked on a link or a file."""
    for _ in range(3):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=folder)
        except FileNotFoundError:
            if not create:
                return None
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o777, dir_fd=folder)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            st = _lstat_at(folder, name)
            raise _Blocked(name, "link" if st is not None and stat.S_ISLNK(st.st_mode) else "file") from None
    raise FileNotFoundError(errno.ENOENT, "made and removed again meanwhile", name)


class _Folders:
    """The open folders along the path being written, from the checkout down: each one opened
    relative to the one above with O_NOFOLLOW, so a link there (however it got there) is
    refused, never followed. Only one path's folders are open at a time (sorted paths share them)."""

    def __init__(self, root: int) -> None:
        self.names: list[str] = []
        self.fds: list[int] = [root]

    def at(self, parts: list[str], create: bool) -> Optional[int]:
        """The folder ``parts`` below the checkout (None: missing, and not ``create``)."""
        common = 0
        while common < min(len(self.names), len(parts)) and self.names[common] == parts[common]:
            common += 1
        while len(self.names) > common:
            self.names.pop()
            os.close(self.fds.pop())
        for depth in range(common, len(parts)):
            try:
                fd = _open_child(self.fds[-1], parts[depth], create)
            except _Blocked as blocked:
                raise _Blocked("/".join(parts[:depth + 1]), blocked.kind) from None
            if fd is None:
                return None
            self.names.append(parts[depth])
            self.fds.append(fd)
        return self.fds[-1]

    def close(self) -> None:
        self.at([], create=False)  # every folder below the checkout closed


def _open_checkout(checkout: Path) -> int:
    """The checkout folder itself, made when missing, never a link."""
    checkout.parent.mkdir(parents=True, exist_ok=True)
    parent = os.open(checkout.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = _open_child(parent, checkout.name, create=True)
    except _Blocked as blocked:
        raise UsageError(f"the login node's checkout {checkout} is a {blocked.kind}, not a folder, and nothing is "
                         "written through one: move it aside there, then submit again") from None
    finally:
        os.close(parent)
    assert fd is not None
    return fd


def update_checkout(checkout: Path, files: Mapping[str, Any], blobs: Path, commit: Any, diff: str) -> None:
    """Make the checkout's files exactly the shipped ones (see the module's doc). ``files``: the
    header's entries (checked again here: this is the function that writes), or checked ones."""
    entries = files if all(isinstance(e, Shipped) for e in files.values()) else file_entries(dict(files))
    root = _open_checkout(checkout)
    folders = _Folders(root)
    try:
        before = _previously_shipped(root)
        recorded: dict[str, list] = {}
        for rel, entry in sorted(entries.items()):
            *parents, name = rel.split("/")
            try:
                folder = folders.at(parents, create=True)
            except _Blocked as blocked:
                raise UsageError(f"refusing to write {rel}: {blocked.describe(checkout)}") from None
            assert folder is not None
            inode = _place(folder, name, entry, blobs, checkout / rel)
            recorded[rel] = [entry.sha, entry.size, entry.mode, entry.link, inode]
        for rel in sorted(before - set(entries)):  # what the last shipment had and this one lacks (never a folder)
            _remove_stale(folders, rel)
        record = {"files": recorded, "commit": commit, "diff": diff}  # the checkout's record of this shipment
        _write_whole(root, SHIPPED_NAME, json.dumps(record, indent=2, default=str).encode("utf-8"), 0o600)
    finally:
        folders.close()
        os.close(root)


def _previously_shipped(root: int) -> set[str]:
    """The paths the last shipment recorded (its record lies in a folder jobs write to: only
    paths that could have been shipped count)."""
    data = _read_plain(SHIPPED_NAME, dir_fd=root)
    try:
        files = json.loads(data).get("files") if data is not None else None
    except (ValueError, AttributeError, RecursionError):
        return set()
    return {rel for rel in files if path_problem(rel) is None} if isinstance(files, dict) else set()


def _place(folder: int, name: str, entry: Shipped, blobs: Path, shown: Path) -> int:
    """Put one shipped file or link at ``name`` in ``folder`` unless it is there already; its inode."""
    st = _lstat_at(folder, name)
    if st is not None and stat.S_ISDIR(st.st_mode):  # it holds what jobs wrote (or a run folder): never removed
        raise UsageError(f"{shown} is a folder in the login node's checkout, and a file or link in what you "
                         "shipped; move that folder aside there (it may hold runs or outputs), then submit again")
    if entry.link is not None:
        link = entry.link
        if not (st is not None and stat.S_ISLNK(st.st_mode) and os.readlink(name, dir_fd=folder) == link):
            _replace_at(folder, name, lambda tmp: os.symlink(link, tmp, dir_fd=folder))
    else:
        blob = blobs / entry.sha[:2] / entry.sha
        executable = entry.mode == "0o755"
        if st is None or st.st_ino != os.stat(blob).st_ino or executable:
            _replace_at(folder, name, lambda tmp: _link_or_copy(blob, folder, tmp, executable))
    return os.stat(name, dir_fd=folder, follow_symlinks=False).st_ino


def _replace_at(folder: int, name: str, make: Callable[[str], None]) -> None:
    """Make a new file or link beside ``name`` (``make(temporary name)``) and rename it onto
    ``name``: a file or link there is replaced whole, and nothing is written through it."""
    for _ in range(16):
        tmp = f".orch-tmp-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            make(tmp)
            break
        except FileExistsError:
            continue
        except BaseException:
            _unlink_quietly(folder, tmp)
            raise
    else:
        raise FileExistsError(errno.EEXIST, "no free temporary name beside it", name)
    try:
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        _unlink_quietly(folder, tmp)
        raise


def _unlink_quietly(folder: int, name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=folder)


def _link_or_copy(blob: Path, folder: int, tmp: str, executable: bool) -> None:
    """A hard link to the blob, or (another filesystem, an executable's own mode) a read-only copy."""
    if not executable:
        try:
            os.link(blob, tmp, dst_dir_fd=folder)
            return
        except FileExistsError:
            raise
        except OSError:
            pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
    with os.fdopen(fd, "wb") as out, open(blob, "rb") as source:
        shutil.copyfileobj(source, out, 1 << 20)
        os.fchmod(out.fileno(), 0o555 if executable else 0o444)


def _remove_stale(folders: _Folders, rel: str) -> None:
    """Remove a file or link the last shipment made and this one lacks; a folder, a missing one,
    or one beneath a link or a file is left alone."""
    *parents, name = rel.split("/")
    try:
        folder = folders.at(parents, create=False)
    except _Blocked:
        return
    if folder is None:
        return
    st = _lstat_at(folder, name)
    if st is not None and (stat.S_ISLNK(st.st_mode) or stat.S_ISREG(st.st_mode)):
        _unlink_quietly(folder, name)


def _write_whole(folder: int, name: str, data: bytes, mode: int) -> None:
    """``name`` in ``folder`` replaced whole by a new file holding ``data`` (written to disk first)."""
    def make(tmp: str) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=folder)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())

    _replace_at(folder, name, make)
