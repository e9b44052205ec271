"""Removing the code snapshots no run needs any more from a runs folder's store (``<runs_dir>/.code``).

Every ``submit`` freezes the project into the store (``orchestrator.code.snapshot``): a tree per
snapshot, a full copy of the project that the ranks import from on every attempt, plus its
manifest and the blobs. Nothing else ever removes them, so a login node that receives ``--remote``
submissions (``remote_receive``) prunes the store after each one, and a user who submits every
hour from a laptop does not fill the cluster's quota with copies of their project.

The rule (``removable``, pure) keeps a snapshot's tree while:

- a run that may still start or run uses it: its record has not ended (asked of the scheduler
  first), or the scheduler still lists one of its jobs (a queued, running, requeued or suspended
  job imports from the tree on every attempt, and a requeue does not submit again);
- it is one of the ``keep`` most recently used (its newest run's start, or the tree's own time),
  so the last few finished runs keep theirs for ``orchestrator diff``, and a resubmission reuses it;
- it was made or used less than ``grace_s`` ago (a submission storing it right now has not
  written its run's record yet).

Nothing is removed when a run of the folder cannot be read (which snapshot it uses is unknown)
or the scheduler cannot be asked, nor from a store that is, or whose ``trees/``, ``blobs/`` or
``manifests/`` is, a symbolic link: removing through it would delete files outside the store (a
thesis in the folder it points to, or the tree of a run still running in another runs folder,
whose runs this folder's records do not name). Each level is looked at with lstat before anything
is removed, and again for every file removed (``linked``). What goes: the tree, the manifest when
no kept tree has its id, and the blobs that neither a kept manifest nor a kept run's diff names. A
submission through the login node's receiver holds the store's lock shared (``store_lock``) while
it stores its snapshot and records its run; pruning takes it exclusively, or skips this time.

A tree the rule lets go is still kept while it holds what a run's script wrote there (a checkpoint
saved beside its ``__file__``: ``core.snapshot_writes``, from a listing of the tree against its
manifest), or while its manifest cannot be read (what the snapshot put there is unknown); each is
said in one line naming the tree, the runs that used it, a few of the files and what to do.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Optional, Sequence

from orchestrator.code.snapshot_model import STORE_NAME, human_size, load_manifest, mirror_names
from orchestrator.code.snapshot_store import remove_tree
from orchestrator.core.fs_checks import kind, shown
from orchestrator.core.safe_read import Unreadable, read_json
from orchestrator.core.snapshot_writes import manifest_files, written

#: How many of the most recently used snapshots are kept, whatever their runs' states.
KEEP = 5
#: A snapshot made or used more recently than this is never removed (seconds).
GRACE_S = 3600.0
#: The lock a submission holds shared, and pruning exclusively, in the store.
LOCK_NAME = ".prune.lock"
#: The store's folders that pruning removes from: none of them may be a link (``linked``).
FOLDERS = ("trees", "blobs", "manifests")
#: A store is looked at most once in this long (seconds): deciding asks the scheduler about every
#: run of the folder, which a submission should not pay each time. The stamp's time says when.
EVERY_S = 3600.0
STAMP_NAME = ".pruned"


@dataclass(frozen=True)
class Use:
    """One run's use of a snapshot: the tree's folder in ``trees/``, when the run last started
    with it (its ``code.json``'s time), whether the run may still start or run, and the run's
    folder name (said when its tree is kept for what it wrote there)."""

    view: str
    used: float
    live: bool
    run: str = ""  # the run folder's name


@dataclass(frozen=True)
class Held:
    """A tree the rule lets go, kept because runs wrote there (``found``: a few of the files) or
    because its manifest cannot be read (``why``)."""

    tree: str  # the project's folder in the view, or the view when its manifest is unreadable
    runs: tuple[str, ...] = ()
    found: str = ""
    why: str = ""

    def line(self, dry_run: bool) -> str:
        kept = "would keep" if dry_run else "kept"
        used = f" (used by run {', '.join(self.runs)})" if self.runs else ""
        if self.why:
            return (f"  {kept} {self.tree}{used}: {self.why}, so what a run wrote there cannot be told from the "
                    "snapshot's files; move out what you need, then remove the folder")
        return (f"  {kept} {self.tree}{used}: it holds files the snapshot did not put there ({self.found}); "
                f"move them out of {self.tree} (they are your script's outputs), then run gc again")


@dataclass
class Pruned:
    """What ``prune`` removed and kept, for the lines the receiver and ``gc`` print."""

    store: Path
    removed: list[str] = field(default_factory=list)
    kept: int = 0
    live: int = 0
    freed_bytes: int = 0
    skipped: Optional[str] = None  # why nothing was removed this time
    dry_run: bool = False  # what would go, nothing removed
    held: list[Held] = field(default_factory=list)  # let go by the rule, kept for what runs wrote there

    def line(self) -> str:
        """One line, then one more (indented) per tree kept for what runs wrote there."""
        if self.skipped:
            return f"[orchestrator] old code snapshots in {self.store} left in place: {self.skipped}"
        did = "would remove" if self.dry_run else "removed"
        held = f", {len(self.held)} holding files runs wrote" if self.held else ""
        return "\n".join([f"[orchestrator] {did} {len(self.removed)} old code snapshot(s) from {self.store} "
                          f"({human_size(self.freed_bytes)}); kept {self.kept} ({self.live} used by runs that may "
                          f"still run{held})", *(h.line(self.dry_run) for h in self.held)])


class _Unreadable(Exception):
    """A run of the folder whose snapshot cannot be told: nothing is removed."""


def removable(views: Mapping[str, float], uses: Iterable[Use], now: float, keep: int = KEEP,
              grace_s: float = GRACE_S) -> list[str]:
    """The trees to remove (see the module's doc): ``views`` maps each tree's folder name to its
    own time (made or last rebuilt), ``uses`` are the runs that use them. Sorted by name."""
    last: dict[str, float] = dict(views)
    live: set[str] = set()
    for use in uses:
        if use.view not in last:
            continue  # a run of another store, or one whose tree is already gone
        last[use.view] = max(last[use.view], use.used)
        if use.live:
            live.add(use.view)
    recent = set(sorted(last, key=lambda name: (last[name], name), reverse=True)[:max(keep, 0)])
    return sorted(name for name, when in last.items()
                  if name not in live and name not in recent and now - when >= grace_s)


@contextlib.contextmanager
def store_lock(store: Path, exclusive: bool) -> Iterator[bool]:
    """The store's lock: shared for a submission (it blocks only while a prune runs), exclusive
    and without waiting for a prune (yields False when a submission holds it: prune another time).
    The lock file is made when missing, never through a link."""
    store.mkdir(parents=True, exist_ok=True)
    fd = os.open(store / LOCK_NAME, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB if exclusive else fcntl.LOCK_SH)
            held = True
        except BlockingIOError:
            held = False
        yield held
    finally:
        os.close(fd)


def stores(runs_dirs: Sequence[str | Path] = ()) -> list[Path]:
    """The snapshot stores of these runs folders; none named: those of every registered run's
    runs folder (``orchestrator gc`` with no argument), each once."""
    from orchestrator.core.records import registered_runs

    folders = [Path(d) for d in runs_dirs] or [Path(e["run_dir"]).parent for e in registered_runs() if e.get("run_dir")]
    seen: dict[str, Path] = {}
    for folder in folders:
        store = folder / STORE_NAME
        if os.path.islink(store):  # listed under its own name, so that ``prune`` refuses it by name
            seen.setdefault(os.path.abspath(store), store)
        elif store.is_dir():
            seen.setdefault(os.path.realpath(store), store)
    return list(seen.values())


def linked(store: Path) -> Optional[str]:
    """Why nothing may be removed from ``store``: it, or one of its ``FOLDERS``, is a symbolic link
    (or not a folder), so that removing there would remove files outside the store; None when each
    level is a folder of its own (lstat: a link is never followed)."""
    for path in (store, *(store / name for name in FOLDERS)):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue  # a store without blobs yet, or without manifests: nothing to remove there
        except OSError as exc:
            return f"{shown(path)} cannot be looked at ({exc.strerror or exc}); nothing was removed"
        if stat.S_ISLNK(st.st_mode):
            try:
                target = f" to {shown(os.readlink(path))}"
            except OSError:
                target = ""
            return (f"{shown(path)} is a symbolic link{target}, and gc never removes anything through a link "
                    "(nothing was removed): replace the link with a folder of its own, or run gc on the runs "
                    "folder whose store it points to")
        if not stat.S_ISDIR(st.st_mode):
            return f"{shown(path)} is {kind(st.st_mode)}, not a folder; nothing was removed: move it out of the store"
    return None


def prune(store: Path, *, keep: int = KEEP, grace_s: float = GRACE_S, every_s: float = EVERY_S,
          now: Optional[float] = None, refresh: Optional[Callable[[list], list]] = None,
          queued: Optional[Callable[[Sequence[str]], set[str]]] = None, dry_run: bool = False) -> Optional[Pruned]:
    """Remove what ``removable`` allows from ``store`` (``<runs_dir>/.code``); None when there is
    nothing to decide: the store holds no more than ``keep`` trees, or was looked at less than
    ``every_s`` ago (both cost one listing or one stat). ``refresh`` (records -> records from the
    scheduler; default ``api.refresh``) and ``queued`` (job ids -> those the scheduler still
    lists; default squeue) are the scheduler's answers. ``dry_run``: what would be removed, and
    its size, with nothing removed (``orchestrator gc --dry-run``)."""
    now = time.time() if now is None else now
    refused = linked(store)  # before anything is listed through a link, or the lock made beyond one
    if refused:
        return Pruned(store=store, dry_run=dry_run, skipped=refused)
    views = _views(store)
    if len(views) <= keep or now - _stamped(store) < every_s:
        return None
    report = Pruned(store=store, dry_run=dry_run)
    with store_lock(store, exclusive=True) as held:
        # linked again, now that no submission changes it
        report.skipped = linked(store) if held else "a submission is storing its snapshot there now"
        if report.skipped:
            return report
        if not dry_run:
            _stamp(store)
        try:
            uses = _uses(store, refresh or _refresh, queued or _queued)
        except _Unreadable as why:
            report.skipped = str(why)
            return report
        doomed: list[str] = []
        for name in removable(views, uses, now, keep, grace_s):
            keeps = _held(store, name, uses)  # what runs wrote there is never removed
            if keeps is None:
                doomed.append(name)
            else:
                report.held.append(keeps)
        kept = set(views) - set(doomed)
        report.kept, report.live = len(kept), len({u.view for u in uses if u.live and u.view in kept})
        for name in doomed:
            report.freed_bytes += _size(store / "trees" / name) if dry_run else _remove_view(store, name)
            report.removed.append(name)
        if doomed:
            report.freed_bytes += _remove_unreferenced(store, kept, now, grace_s, dry_run)
    return report


def _stamped(store: Path) -> float:
    """When the store was last looked at (0: never)."""
    try:
        return os.lstat(store / STAMP_NAME).st_mtime
    except OSError:
        return 0.0


def _stamp(store: Path) -> None:
    """Mark the store looked at now (a file made when missing, never through a link)."""
    with contextlib.suppress(OSError):
        os.close(os.open(store / STAMP_NAME, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666))
        os.utime(store / STAMP_NAME, follow_symlinks=False)


# ---- reading the store and its runs ------------------------------------------------------------
def _views(store: Path) -> dict[str, float]:
    """Each tree's folder in ``trees/`` (``<snapshot id>-<root hash>``) and its time; the
    temporary folders of a build in progress are not trees yet."""
    out: dict[str, float] = {}
    for entry in _listing(store / "trees"):
        if entry.is_dir(follow_symlinks=False):
            with contextlib.suppress(OSError):
                out[entry.name] = entry.stat(follow_symlinks=False).st_mtime
    return out


def _listing(folder: Path) -> list[os.DirEntry[str]]:
    """``folder``'s entries but the hidden ones (a tree being built, the lock); none when it cannot be listed."""
    try:
        return [entry for entry in os.scandir(folder) if not entry.name.startswith(".")]
    except OSError:
        return []


def _run_folders(runs: Path) -> Iterator[Path]:
    """The run folders of the runs folder that hold a code record (moved-aside ones included)."""
    try:
        entries = sorted(os.scandir(runs), key=lambda e: e.name)
    except OSError as exc:
        raise _Unreadable(f"its runs folder {runs} cannot be listed ({exc.strerror})") from None
    for entry in entries:
        if entry.name == STORE_NAME or not entry.is_dir(follow_symlinks=False):
            continue
        folder = Path(entry.path)
        if os.path.lexists(folder / "code.json"):
            yield folder


def _uses(store: Path, refresh: Callable[[list], list], queued: Callable[[Sequence[str]], set[str]]) -> list[Use]:
    """Every run of the store's runs folder with the tree it imports from, and whether it may
    still start or run (its record, refreshed from the scheduler; then the scheduler's queue)."""
    from orchestrator.core.errors import OrchestratorError
    from orchestrator.core.records import RunRecord

    trees = os.path.join(os.path.realpath(store), "trees")
    found: list[tuple[str, float, Optional[RunRecord], str]] = []
    for folder in _run_folders(store.parent):
        code = _code_record(folder)
        try:
            used = os.lstat(folder / "code.json").st_mtime
        except OSError as exc:
            raise _Unreadable(f"the run {folder.name}'s code record cannot be looked at ({exc.strerror}), so which "
                              "snapshot it uses is unknown") from None
        tree = os.path.realpath(code.get("tree") or "")
        if not tree.startswith(trees + os.sep):
            continue  # another store's snapshot (the run was submitted with another runs_dir)
        view = os.path.relpath(tree, trees).split(os.sep)[0]
        try:
            record: Optional[RunRecord] = RunRecord.load(folder)
        except (OrchestratorError, OSError):
            record = None  # unreadable: taken as live below, its tree kept
        found.append((view, used, record, folder.name))
    records = [r for _, _, r, _ in found if r is not None]
    try:
        fresh = {r.run_dir: r for r in refresh([r for r in records if not r.state.terminal])}
        ended = [fresh.get(r.run_dir, r) for r in records]
        from orchestrator.backends import backend

        listed = queued(sorted({job.split("_")[0] for r in ended if r.state.terminal and backend(r.executor).scheduled
                                for job in r.job_ids}))
    except (OrchestratorError, OSError) as exc:
        raise _Unreadable(f"the scheduler could not be asked which runs are still queued or running ({exc})") from None
    out = []
    for view, used, record, run in found:
        rec = fresh.get(record.run_dir, record) if record is not None else None
        live = rec is None or not rec.state.terminal or any(job.split("_")[0] in listed for job in rec.job_ids)
        out.append(Use(view=view, used=used, live=live, run=run))
    return out


def _code_record(folder: Path) -> dict:
    """A run's ``code.json``, read as hostile input (never a FIFO, a link or a huge file:
    ``safe_read``); _Unreadable, so that nothing is removed, when it is not a code record."""
    path = folder / "code.json"
    try:
        code = read_json(path)
    except Unreadable as exc:
        raise _Unreadable(exc.line(f"the run {folder.name}'s code record {shown(path)}") + ", so which snapshot "
                          "it uses is unknown") from None
    if not isinstance(code, dict) or not all(isinstance(code.get(k), str) for k in ("id", "root", "manifest")):
        raise _Unreadable(f"the run {folder.name}'s code record {shown(path)} is damaged (its id, root or manifest is "
                          "missing), so which snapshot it uses is unknown")
    return code


def _refresh(records: list) -> list:
    if not records:
        return []
    from orchestrator.api import refresh_records

    return refresh_records(records)


def _queued(jobs: Sequence[str]) -> set[str]:
    """The jobs (array ids without the task) a scheduler (each scheduled backend's) still lists as
    pending, running, suspended or completing."""
    if not jobs:
        return set()
    from orchestrator.backends import BACKENDS
    from orchestrator.backends.factory import scheduler

    return {job for name, b in BACKENDS.items() if b.scheduled for job in scheduler(name).queued(jobs)}


# ---- removing ---------------------------------------------------------------------------------
def _held(store: Path, name: str, uses: Sequence[Use]) -> Optional[Held]:
    """Why the tree ``trees/<name>`` stays although the rule lets it go: files runs wrote there
    (``snapshot_writes.written``: a listing, no file read), or a manifest that cannot be read;
    None when it may go."""
    view = store / "trees" / name
    runs = tuple(sorted({use.run for use in uses if use.view == name and use.run}))
    manifest = store / "manifests" / f"{name.split('-')[0]}.json"
    try:
        found = manifest_files(manifest)
    except Unreadable as exc:
        return Held(tree=str(view), runs=runs, why=exc.line(f"its manifest {shown(manifest)}"))
    if found is None:
        return Held(tree=str(view), runs=runs, why=f"its manifest {shown(manifest)} is gone")
    tree = view.joinpath(*mirror_names(found[0]))
    writes = written(view, tree, found[1])
    return Held(tree=str(tree), runs=runs, found=writes.listing()) if writes else None


def _size(path: Path) -> int:
    total = 0
    for folder, dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def _own_folders(store: Path, path: Path) -> bool:
    """Every folder from the store down to ``path``'s own is a folder of its own (lstat each
    level), so removing ``path`` removes a file of the store and nothing outside it."""
    parts = path.parent.relative_to(store).parts
    levels = [store.joinpath(*parts[:depth]) for depth in range(len(parts) + 1)]
    try:
        return all(stat.S_ISDIR(os.lstat(level).st_mode) for level in levels)
    except OSError:
        return False


def _remove_view(store: Path, name: str) -> int:
    """Set the tree aside at once (a rename: no rank can find half of it), then remove it; its size.
    Never through a link: the tree, and each folder above it up to the store, is looked at first."""
    view = store / "trees" / name
    trash = view.with_name(f".trash-{view.name}-{os.getpid()}")
    try:
        if not _own_folders(store, view) or not stat.S_ISDIR(os.lstat(view).st_mode):
            return 0
        os.rename(view, trash)
    except OSError:
        return 0
    size = _size(trash)
    remove_tree(trash)
    return size


def _remove_unreferenced(store: Path, kept: set[str], now: float, grace_s: float, dry_run: bool) -> int:
    """The manifests no kept tree is built from, and the blobs no kept manifest (nor a kept run's
    diff) names, older than the grace; their size (``dry_run``: only their size)."""
    from orchestrator.core.errors import OrchestratorError

    ids = {name.split("-")[0] for name in kept}
    freed = sum(_unlink_old(store, path, now, grace_s, dry_run) for path in _files(store / "manifests")
                if path.name.endswith(".json") and path.name.removesuffix(".json") not in ids)
    wanted: set[str] = set()
    try:
        for snapshot in ids:
            manifest = store / "manifests" / f"{snapshot}.json"
            if not os.path.lexists(manifest):
                continue  # a tree whose manifest is gone needs no blob to stay as it is
            if not stat.S_ISREG(os.lstat(manifest).st_mode):  # a FIFO would block the read for ever
                return freed
            wanted |= {e.sha for e in load_manifest(manifest).values()}
        for folder in _run_folders(store.parent):
            code = _code_record(folder)
            if isinstance(code.get("diff"), str):
                wanted.add(code["diff"])
    except (OrchestratorError, _Unreadable, OSError):
        return freed  # which blobs a kept snapshot needs is unknown: none is removed
    return freed + sum(_unlink_old(store, path, now, grace_s, dry_run) for path in _files(store / "blobs", depth=2)
                       if path.name not in wanted)


def _files(folder: Path, depth: int = 1) -> Iterator[Path]:
    """The plain files ``depth`` folders down (blobs/ab/<sha>: 2), never through a link."""
    for entry in _listing(folder):
        if depth > 1 and entry.is_dir(follow_symlinks=False):
            yield from _files(Path(entry.path), depth - 1)
        elif depth == 1 and entry.is_file(follow_symlinks=False):
            yield Path(entry.path)


def _unlink_old(store: Path, path: Path, now: float, grace_s: float, dry_run: bool) -> int:
    """Remove ``path``, a file of the store older than the grace (never through a link); its size."""
    try:
        st = os.lstat(path)
        if now - st.st_mtime < grace_s or not _own_folders(store, path):
            return 0
        if not dry_run:
            path.unlink()
        return st.st_size
    except OSError:
        return 0
