"""Node-local files that are ours alone: one private folder a user on a node's own memory.

/dev/shm and /tmp are shared by every job and every user on a node. What we keep there (the rank
API's heartbeat staging folders, the health gate's decision copy for a node's other tasks) lives
in one folder of this user's, made here and checked with ``lstat`` before every use: a directory,
not a link, owned by this user, with no group or other bits. Inside it nobody else can create,
rename or link anything, so the names inside may stay predictable (a node's ranks find each other
by them without talking). A folder of that name that fails the check (another user made it first,
a link, a loose mode) is refused and never used: the next candidate is tried, and with none left
the caller goes without node-local files (the rank API then writes each rank's heartbeat to the
run folder, the gate's tasks read the shared decision), with one line on stderr naming the folder.

Candidates, in order: ``$SLURM_TMPDIR`` and ``$XDG_RUNTIME_DIR`` where the site sets them (a
folder of the job's or the user's own: ours are made inside it), ``/dev/shm/orch-u<uid>``, then
``<tempdir>/orch-u<uid>``. Every write inside goes through an exclusive temporary created with
``O_NOFOLLOW`` and a rename; every read refuses a link, a FIFO or a file another user owns.

Folders left behind by ranks that were killed (they never removed their own) are removed by the
next health gate on the node (``sweep_stale``): this user's folders there untouched for
``STALE_S``. Standard library only: every rank imports it.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
import time
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Mapping, Optional

#: A folder in the private root not touched for this long belongs to ranks that were killed (a
#: running job's staging folder is rewritten every few seconds; the decision copy lives seconds).
STALE_S = 6 * 3600.0
_WARNED: set[str] = set()
_MAX_READ = 1 << 20  # a heartbeat or a decision is a few hundred bytes


class NotOurs(PermissionError):
    """A node-local path we will not use: another user's, a link, or open to others."""


def candidates(environ: Optional[Mapping[str, str]] = None) -> list[Path]:
    """Where this user's private folder may be, best first (the module's docstring says why)."""
    env = os.environ if environ is None else environ
    sites = [value for value in (env.get("SLURM_TMPDIR", ""), env.get("XDG_RUNTIME_DIR", "")) if os.path.isabs(value)]
    return [Path(root) / f"orch-u{os.geteuid()}" for root in (*sites, "/dev/shm", tempfile.gettempdir())]


def check_private(path: Path) -> None:
    """Raise NotOurs unless ``path`` is a directory (not a link) this user owns, mode 0700 or tighter."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise NotOurs(f"{path} is not a directory of ours (a link or a file sits there)")
    if info.st_uid != os.geteuid():
        raise NotOurs(f"{path} belongs to another user (uid {info.st_uid})")
    if info.st_mode & 0o077:
        raise NotOurs(f"{path} is open to other users (mode {stat.S_IMODE(info.st_mode):o}, must be 700)")


def ensure_private(path: Path) -> Path:
    """``path`` made (mode 0700) if missing, then checked (``check_private``); returned."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    check_private(path)
    return path


def private_root(environ: Optional[Mapping[str, str]] = None) -> Path:
    """This user's private node-local folder, made and checked. Raises NotOurs (an OSError) when
    no candidate can be used, after one line on stderr a refused folder."""
    refused: list[str] = []
    for path in candidates(environ):
        if not path.parent.is_dir():
            continue
        try:
            return ensure_private(path)
        except NotOurs as exc:
            refused.append(str(exc))
            _warn_once(str(path), f"orchestrator: not using {exc}; remove it, or ask the node's administrator")
        except OSError as exc:
            refused.append(f"{path}: {exc.strerror or exc}")
    raise NotOurs("no node-local folder of this user's can be used: " + "; ".join(refused or ["none found"]))


def write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` atomically through an exclusive temporary that never follows a link."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def touch_private(path: Path) -> None:
    """Create ``path`` empty if missing, never through a link."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))


def open_private(path: Path, flags: int = os.O_RDWR | os.O_CREAT) -> int:
    """A descriptor on a regular file of ours at ``path`` (a lock file): no link, FIFO or stranger's."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    try:
        _check_regular_ours(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_private(path: Path, limit: int = _MAX_READ) -> bytes:
    """The bytes of a regular file this user owns (what we wrote): a link, a FIFO, a device or a
    file of another user's raises NotOurs (or the OSError of the open), never blocks."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _check_regular_ours(fd, path)
        return os.read(fd, limit)
    finally:
        os.close(fd)


def _check_regular_ours(fd: int, path: Path) -> None:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise NotOurs(f"{path} is not a regular file")
    if info.st_uid != os.geteuid():
        raise NotOurs(f"{path} belongs to another user (uid {info.st_uid})")


def sweep_stale(now: Optional[float] = None, stale_s: float = STALE_S) -> int:
    """Remove this user's folders in the private root untouched for ``stale_s`` (what killed ranks
    of any run left behind). Returns how many were removed; never raises."""
    import shutil

    now = time.time() if now is None else now
    try:
        root = private_root()
        entries = list(os.scandir(root))
    except OSError:
        return 0
    removed = 0
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or now - info.st_mtime < stale_s:
                continue
            shutil.rmtree(entry.path)
            removed += 1
        except OSError:
            continue
    return removed


def _warn_once(key: str, line: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        print(line, file=sys.stderr)
