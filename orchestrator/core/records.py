"""The run's record and the registry of runs. Standard library only (ranks import it).

The record is ``<run>/record.json``; the rest of the run folder's layout is named in
``orchestrator.core.run_folder`` (``RunFolder``), and only there.

The registry is one JSON line per run in ``$ORCHESTRATOR_HOME/registry.jsonl`` (default
``~/.local/share/orchestrator``); it only maps run ids to run folders.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.core.atomic_files import write_json_atomic, write_text_atomic  # noqa: F401  (re-exported)
from orchestrator.core.errors import RunNotFoundError, UsageError
from orchestrator.core.fs_checks import REGISTRY_FIX, append, kind, owner_names, read_file, shown
from orchestrator.core.run_folder import RunFolder
from orchestrator.core.safe_read import Damaged, NoPermission, read_regular
from orchestrator.core.states import State


def _known_executors() -> tuple[str, ...]:
    """The backends a record may name (the registry's facts: ``backends.kinds.KINDS``)."""
    from orchestrator.backends.kinds import KINDS

    return tuple(KINDS)


#: The write errors that say the filesystem takes no more writes, whatever is written.
DISK_ERRNOS = {errno.ENOSPC: "full", errno.EDQUOT: "over its quota", errno.EROFS: "read-only"}
_DISK_FIX = {errno.ENOSPC: "free space there (df -h)", errno.EDQUOT: "free space within your quota there (quota -s)",
             errno.EROFS: "make it writable again (mounted read-only, or remounted so after an error: dmesg)"}
_FREE_FLOOR_BYTES = 64 * 1024  # below this a record (a new file, then a rename) no longer fits


def _mount_point(path: str | Path) -> str:
    p = os.path.realpath(path)
    while not os.path.ismount(p) and p != os.path.dirname(p):
        p = os.path.dirname(p)
    return p


def disk_trouble(exc: BaseException, run_dir: str | Path) -> str | None:
    """For an OSError that says the run folder's filesystem takes no more writes (full, over
    quota, read-only): one line naming the disk, the file when known, and the fix; else None."""
    if not isinstance(exc, OSError) or exc.errno not in DISK_ERRNOS:
        return None
    what = f" writing {exc.filename}" if exc.filename else ""
    return (f"the disk holding the run folder ({_mount_point(exc.filename or run_dir)}) is "
            f"{DISK_ERRNOS[exc.errno]}: {exc.strerror}{what}; {_DISK_FIX[exc.errno]}, then run it again to resume")


def disk_state(run_dir: str | Path) -> str | None:
    """What stops the run folder's filesystem from taking a record now: 'full' (or out of inodes),
    'read-only', or None (fine, or it cannot be told: a quota shows only as a failed write)."""
    try:
        st = os.statvfs(run_dir)
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return "read-only"
    if st.f_bavail * st.f_frsize < _FREE_FLOOR_BYTES or (st.f_files and st.f_favail == 0):
        return "full"
    return None


def disk_note(run_dir: str | Path) -> str | None:
    """``disk_state`` as a clause naming the disk: 'the disk holding the run folder (/mnt) is full'."""
    state = disk_state(run_dir)
    return f"the disk holding the run folder ({_mount_point(run_dir)}) is {state}" if state else None


@dataclass
class RunRecord:
    run_id: str
    run_dir: str
    executor: str
    state: State = State.PENDING
    created: float = field(default_factory=time.time)
    ended: float | None = None
    job_ids: list[str] = field(default_factory=list)
    supervisor_pid: int | None = None
    supervisor_start: int | None = None  # /proc start time: the PID is signalled only while it matches
    rank_pids: list[int] = field(default_factory=list)
    rank_starts: list[int] = field(default_factory=list)
    master_port: int | None = None
    failed_rank: int | None = None
    error: str | None = None
    world_size: int = 1
    attempts: int = 1
    sweep_size: int = 0
    point_states: dict[str, State] = field(default_factory=dict)
    #: Where each rank was when the run ended abnormally (its user-code line and the collective
    #: it waited in), from the stacks saved in <run>/stacks/; rank (as text) -> description.
    waits: dict[str, str] = field(default_factory=dict)
    #: Shown with any end state, COMPLETED included: e.g. ranks that all exited 0 without ever
    #: joining a process group.
    warning: str | None = None
    #: Where the PIDs above mean something (ownership.this_host()), and the inode of the folder
    #: the record was created in: no other host, and no copy of the folder, signals them.
    host: str | None = None
    folder_id: int | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        """``state`` and ``point_states`` are always States, however they are set (the fields, a
        plain string given to ``update`` or assigned): ValueError for a name that is no state."""
        if name == "state":
            value = State.parse(value)
        elif name == "point_states":
            value = {str(k): State.parse(v) for k, v in value.items()}
        object.__setattr__(self, name, value)

    @property
    def path(self) -> Path:
        return RunFolder.of(self.run_dir).record

    def save(self, last: bool = False) -> None:
        """Write the record atomically (a new file, then a rename). ``last``: the attempt's end,
        which a full disk (or a used-up quota) must not lose: when no new file can be made there,
        the end is written over the record in the room its file already has (``_rewrite_in_place``)."""
        try:
            write_json_atomic(self.path, asdict(self))
        except OSError as exc:
            if not (last and exc.errno in (errno.ENOSPC, errno.EDQUOT)):
                raise
            data = json.dumps(asdict(self), indent=2, default=str).encode("utf-8")
            if not _rewrite_in_place(self.path, data):
                raise

    @classmethod
    def load(cls, run_dir: str | Path) -> RunRecord:
        """Read a record; a damaged one raises RunNotFoundError naming the file and the way out."""
        path = RunFolder.of(run_dir).record
        try:  # a link (another run's record), a FIFO or a device is refused without blocking on it
            raw = read_regular(path, _MAX_RECORD_BYTES)
        except NoPermission:
            raise no_permission(path) from None
        except Damaged as exc:
            raise _damaged(path, exc.why) from None
        if raw is None:
            raise RunNotFoundError(f"{run_dir} has no record.json: it is not a run folder")
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise _damaged(path, f"unreadable ({type(exc).__name__})") from None
        problem = _record_problem(data)
        if problem:
            raise _damaged(path, problem)
        known = set(cls.__dataclass_fields__)
        fields = {k: v for k, v in data.items() if k in known}
        # The record lives where it was read from; the folder named inside it may be stale (a
        # moved run) or wrong, and every later write must go back to this folder.
        fields["run_dir"] = os.path.abspath(run_dir)
        return cls(**fields)

    def update(self, *, last: bool = False, **changes: Any) -> RunRecord:
        """Set ``changes`` and write the record (``last``: the attempt's end, see ``save``)."""
        for key, value in changes.items():
            setattr(self, key, value)
        self.save(last)
        return self

    def update_seen(self, **changes: Any) -> RunRecord:
        """``update`` for what a reader learned (a refresh from the scheduler): one who may read
        the run folder but not write it (a teammate's run) keeps what it learned in memory.
        Nothing new (a running job asked about again): nothing written, so ``status`` over a
        thousand open runs writes none of their records."""
        if any(getattr(self, key) != value for key, value in changes.items()):
            try:
                self.update(**changes)
            except PermissionError:
                pass  # kept in memory only
        return self


def _rewrite_in_place(path: Path, data: bytes) -> bool:
    """Write ``data`` over the regular file ``path`` within the blocks it already has, which a
    full disk still lets one overwrite. Not atomic, hence only for a record's end on a full disk:
    one write from the start, padded with spaces (JSON ignores them) to the old length so that
    no reader ever finds the old file's tail after the new end. False, with nothing written, when
    it needs more room than the file has (or the file is not a regular one of its own)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or len(data) > st.st_blocks * 512:
            return False
        data = data.ljust(st.st_size)
        if os.pwrite(fd, data, 0) != len(data):
            return False
        os.fsync(fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


_MAX_RECORD_BYTES = 16 * 1024 * 1024
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "run_id": (str,), "run_dir": (str,), "executor": (str,), "state": (str,), "created": (int, float),
    "ended": (int, float, type(None)), "job_ids": (list,), "supervisor_pid": (int, type(None)),
    "supervisor_start": (int, type(None)), "rank_pids": (list,), "rank_starts": (list,),
    "master_port": (int, type(None)), "failed_rank": (int, type(None)), "error": (str, type(None)),
    "world_size": (int,), "attempts": (int,), "sweep_size": (int,), "point_states": (dict,),
    "waits": (dict,), "warning": (str, type(None)), "host": (str, type(None)), "folder_id": (int, type(None)),
}


def _record_problem(data: Any) -> str | None:
    """Why a parsed record.json cannot be used, or None."""
    if not isinstance(data, dict):
        return f"holds {type(data).__name__}, not a record"
    for key in ("run_id", "run_dir", "executor"):
        if key not in data:
            return f"has no {key!r}"
    for key, types in _FIELD_TYPES.items():
        if key in data and (not isinstance(data[key], types) or isinstance(data[key], bool)):
            return f"has a {type(data[key]).__name__} for {key!r}"
    if data["executor"] not in _known_executors():
        return f"names an unknown executor {data['executor'][:40]!r} (known: {', '.join(_known_executors())})"
    try:
        State.parse(data.get("state", State.PENDING))
    except ValueError:
        return f"has an unknown state {str(data['state'])[:40]!r}"
    try:
        for value in data.get("point_states", {}).values():
            State.parse(value)
    except ValueError:
        return "has a malformed 'point_states'"
    for key in ("created", "ended"):
        if isinstance(data.get(key), float) and not math.isfinite(data[key]):
            return f"has {data[key]} for {key!r}, not a time"  # status and goodput would print "nan"
    waits = data.get("waits", {})
    if not all(isinstance(k, str) and k.isdecimal() and isinstance(v, str) for k, v in waits.items()):
        return "has a malformed 'waits' (rank -> where it waited)"
    for key, item_type in (("job_ids", str), ("rank_pids", int), ("rank_starts", int)):
        if any(not isinstance(x, item_type) or isinstance(x, bool) for x in data.get(key, [])):
            return f"has a malformed {key!r}"
    return None


def no_permission(path: str | Path, what: str = "the run's record") -> RunNotFoundError:
    """A run file this user may not read: never "damaged" (nothing is wrong with it), and the fix
    is its owner's, or the group's."""
    path = Path(path)
    try:
        st = os.stat(path)
        owner = f" (owned by {owner_names(st)[0]}, mode {stat.filemode(st.st_mode)})"
    except OSError:
        owner = ""  # the folder itself cannot be searched
    folder = shown(path.parent)
    return RunNotFoundError(
        f"no permission to read {what} {shown(path)}{owner}: ask its owner to let your group read the run "
        f"folder (chmod -R g+rX {folder}), or check that you are in the folder's group (id; ls -ld {folder})")


def _damaged(path: Path, why: str) -> RunNotFoundError:
    return RunNotFoundError(
        f"{path} is damaged ({why}); the run's other files are untouched: inspect them, then remove "
        f"or rename {path.parent} (a new 'orchestrator run' of the spec starts a fresh folder)"
    )


def point_dir(run_dir: str | Path, index: int) -> Path:
    """The folder of one sweep point: its logs, errors and result live there."""
    return RunFolder.of(run_dir).point(index).root


def home() -> Path:
    """The registry's folder: ``$ORCHESTRATOR_HOME``, else ``$HOME/.local/share/orchestrator``.
    It need not exist yet; one that can never be absolute raises UsageError naming the fix (what
    it is on disk is checked where it is used: registered_runs, register)."""
    env = os.environ.get("ORCHESTRATOR_HOME")
    if env:
        if not os.path.isabs(env):
            raise UsageError(f"ORCHESTRATOR_HOME={env!r} is not an absolute path (each folder would have its own "
                             "registry of runs): set ORCHESTRATOR_HOME to an absolute folder")
        return Path(env)
    user_home = os.environ.get("HOME")
    if user_home is not None and not os.path.isabs(user_home):
        raise UsageError(f"$HOME={user_home!r} is not an absolute path, and the registry of runs defaults to "
                         "$HOME/.local/share/orchestrator: set HOME, or set ORCHESTRATOR_HOME to an absolute folder")
    try:
        return Path.home() / ".local" / "share" / "orchestrator"
    except (RuntimeError, KeyError, OSError):
        raise UsageError("no home folder: $HOME is not set and this user has none in the password database; set "
                         "ORCHESTRATOR_HOME to a folder for the registry of runs") from None


def register(record: RunRecord) -> None:
    """Append the run to the registry. A registry or folder that cannot be written (read-only,
    full, a file or a FIFO in the way...) raises UsageError naming the path and the fix."""
    line = json.dumps({"run_id": record.run_id, "run_dir": record.run_dir,
                       "executor": record.executor, "created": record.created}) + "\n"
    append(home() / "registry.jsonl", line.encode("utf-8"), "the run registry", REGISTRY_FIX)


def registered_runs() -> list[dict[str, Any]]:
    """Latest entry per run folder, oldest first. No registry yet: none. A registry that is not
    a regular file (a FIFO, a device, a folder, under /proc), or that cannot be read, raises
    UsageError naming the path and the fix; it is never read blocking."""
    data = read_file(home() / "registry.jsonl", "the run registry", REGISTRY_FIX)
    if data is None:
        return []
    latest: dict[str, dict[str, Any]] = {}
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue  # a torn or foreign line: the registry only maps ids to folders
        if not (isinstance(entry, dict) and isinstance(entry.get("run_id"), str)
                and isinstance(entry.get("run_dir"), str) and entry["run_id"] and entry["run_dir"]):
            continue
        latest.pop(entry["run_dir"], None)
        latest[entry["run_dir"]] = entry
    return list(latest.values())


def resolve_run(ref: str) -> Path:
    """A run folder path, a run id, or a unique prefix of a run id."""
    if not ref.strip():
        raise RunNotFoundError("no run given: pass a run id from 'orchestrator list' or a run folder")
    if len(ref) > 4096 or "\0" in ref:
        raise RunNotFoundError("that is not a run id or a run folder")
    def usable(folder: Path) -> Path:
        """The folder, unless its record is a FIFO, a device or a socket: RunRecord.load says
        what else is wrong with a record; these it must never open."""
        try:
            mode = os.lstat(RunFolder(folder).record).st_mode
        except OSError:
            return folder
        if stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode):
            return folder
        raise RunNotFoundError(
            f"{shown(RunFolder(folder).record)} is damaged (it is {kind(mode)}, not a regular file); the run's other "
            f"files are untouched: inspect them, then remove or rename {shown(folder)}")

    p = Path(ref)
    try:
        if os.path.lexists(RunFolder(p).record):  # a run folder, even a damaged one: say what is wrong with it
            return usable(p.resolve())
        os.lstat(RunFolder(p).record)
    except PermissionError:  # a folder this user may not search: another user's run, not "no run"
        raise no_permission(RunFolder(p).record) from None
    except (OSError, RuntimeError):
        pass
    runs = registered_runs()
    exact = [r for r in runs if r["run_id"] == ref]
    matches = exact or [r for r in runs if r["run_id"].startswith(ref)]
    if not matches:
        raise RunNotFoundError(f"no run {ref!r}: give a run folder or an id from 'orchestrator list'")
    live = [r for r in matches if os.path.lexists(r["run_dir"])]  # a folder moved, removed, or a refused submission's
    if not live:
        raise RunNotFoundError(f"no run {ref!r} any more: its folder {shown(matches[-1]['run_dir'])} is gone (moved "
                               "or removed); give the folder where it is now, or an id from 'orchestrator list'")
    matches = live
    ids = {r["run_id"] for r in matches}
    if len(ids) > 1:
        raise RunNotFoundError(f"{ref!r} matches several runs ({', '.join(sorted(ids))}); give more of the id")
    return usable(Path(matches[-1]["run_dir"]))
