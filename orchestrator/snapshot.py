"""The code snapshot: what a job imports, frozen when it is run or submitted.

A queued job starts hours after ``submit``, and a requeued one starts again later still; ranks
that imported the live files would run whatever is on disk by then. So ``run`` and ``submit``
freeze the project: ``scan`` lists and hashes it (``plan`` shows the result; ``run``/``submit``
copy each new file into the store while hashing it, so what is frozen is exactly what was
hashed), ``store`` builds the tree the ranks import from (``code_redirect`` points their imports
there).

The *project*: the git work tree holding the entrypoint (a module entrypoint: holding the folder
the CLI runs in), else the entrypoint's folder. What is frozen of it (the rule the README states):

- in git, every tracked file, and untracked files git does not ignore *when they are code*;
- outside git, the files that are code;
- *code*: Python and C/CUDA sources (``SOURCE_SUFFIXES``), and configuration files
  (``CONFIG_SUFFIXES``) up to ``CONFIG_MAX_BYTES`` each (a larger one is data). Never frozen
  unless tracked: hidden folders, virtual environments, ``__pycache__``, the trackers' and
  frameworks' output folders (``OUTPUT_DIRS``), run folders; never at all: the runs folder, the
  store, ``ORCHESTRATOR_HOME``, what the ignore file or ``code.exclude`` lists.
  ``code.include`` patterns freeze files the rule leaves out.

A file that changes while it is read is read again (three tries), then left out with a warning
naming it; only the entrypoint itself is ever refused. Whatever is left out is still found at
the same place: every folder of the tree links the live files and folders it lacks, and the tree
mirrors the project's parent and grandparent folders the same way, so a script reading
``Path(__file__).parent / "data"`` or ``../../Datasets`` finds them.

The store, under ``<runs_dir>/.code`` (shared with the nodes wherever the runs are)::

    blobs/ab/<sha256>       each file's content, once, read-only (content-addressed)
    manifests/<id>.json     one snapshot: path -> [sha256, size, mode] (or a symlink's target)
    trees/<id>-<root hash>/<grandparent>/<parent>/<project>/
                            the snapshot as a folder of read-only *copies* of the blobs (a rank
                            writing there never reaches a blob), checked against the manifest each
                            time it is used and rebuilt when damaged; the ranks' import root
    index/<root hash>.json  (size, mtime, inode) -> sha256 of the last scan, so an unchanged file
                            is not read again

A blob is verified whenever it is copied: one that does not hash to its name is stored again from
the project when the project still holds that content, else the run is refused naming the file.
A snapshot's id is the hash of its manifest, so the same content is one blob set across runs.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Optional

from orchestrator.errors import OrchestratorError

STORE_NAME = ".code"
GIT_TIMEOUT_S = 30.0
_CHUNK = 1 << 20
#: Sources: always code, whatever their size.
SOURCE_SUFFIXES = frozenset({".py", ".pyi", ".pyx", ".pxd", ".pxi", ".c", ".cc", ".cpp", ".cxx", ".h", ".hpp",
                             ".cu", ".cuh"})
#: Configuration: code up to CONFIG_MAX_BYTES (a 50 MB ``.json`` is a dataset, not a setting).
CONFIG_SUFFIXES = frozenset({".yaml", ".yml", ".toml", ".cfg", ".ini", ".json", ".conf", ".sh", ".txt", ".jinja",
                             ".j2", ".env"})
CONFIG_MAX_BYTES = 1_000_000
#: Folders that hold what jobs and tools write, never frozen unless git tracks their files.
OUTPUT_DIRS = frozenset({"__pycache__", "node_modules", "lightning_logs", "wandb", "mlruns", "tb_logs",
                         "tensorboard", "outputs", "multirun", "checkpoints"})
#: How many folders above the project the tree mirrors with links (``../../Datasets``).
MIRRORED_LEVELS = 2
#: An ancestor folder with more entries than this is not mirrored (a login node's /home).
MIRROR_MAX_ENTRIES = 256
_READ_TRIES = 3
_TREE_STAMP = ".orchestrator-tree"

# Reasons a file is left out, as plan names them.
LEFT_IGNORED = "listed in the ignore file or code.exclude"
LEFT_NOT_CODE = "not code (neither a source nor a configuration file)"
LEFT_BIG_CONFIG = f"configuration over {CONFIG_MAX_BYTES // 1_000_000} MB (data)"
LEFT_OUTPUT = "an output, hidden or environment folder"
LEFT_CHANGING = "changed while it was read"
LEFT_RUN = "a run folder or the orchestrator's home"


class SnapshotError(OrchestratorError):
    """The project cannot be frozen as asked (too large, unreadable, the entrypoint ignored)."""

    exit_code = 2


@dataclass(frozen=True, slots=True)
class Entry:
    """One file of a snapshot: its content's hash, size and mode (0o644 or 0o755); a symlink
    has ``link`` (its target, kept as written) and no content."""

    sha: str
    size: int
    mode: int
    link: Optional[str] = None

    def to_json(self) -> list:
        return [self.sha, self.size, oct(self.mode), self.link] if self.link is not None else \
            [self.sha, self.size, oct(self.mode)]

    @classmethod
    def from_json(cls, item: list) -> Entry:
        return cls(sha=item[0], size=int(item[1]), mode=int(item[2], 8), link=item[3] if len(item) > 3 else None)


@dataclass(frozen=True)
class Snapshot:
    """A scanned project: what ``store`` will freeze, and what ``plan`` shows."""

    root: str  # the live project folder
    how: str  # "git" or "folder"
    entries: Mapping[str, Entry]  # posix path relative to root -> entry
    store_dir: str  # <runs_dir>/.code
    commit: Optional[str] = None
    diff: str = ""  # git diff HEAD: the uncommitted changes to tracked files
    missing: frozenset[str] = frozenset()  # blob hashes the store lacks
    ignore_file: str = ".orchignore"
    exclude: tuple[str, ...] = ()  # folders left out (the runs folder...)
    hashed: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)  # rel -> (size, mtime_ns, ino) as hashed
    left_out: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # reason -> paths (a folder ends in '/')
    staged: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)  # blobs this scan wrote: sha -> their stat
    include: tuple[str, ...] = ()  # code.include
    exclude_patterns: tuple[str, ...] = ()  # code.exclude

    @property
    def id(self) -> str:
        return snapshot_id(self.entries)

    @property
    def view(self) -> str:
        """The folder holding this project's tree and its mirrored parents (one per id and root:
        the live links differ between roots)."""
        key = hashlib.sha256(os.fsencode(self.root)).hexdigest()[:8]
        return str(Path(self.store_dir) / "trees" / f"{self.id}-{key}")

    @property
    def tree(self) -> str:
        return str(Path(self.view, *_mirror_names(self.root)))

    @property
    def manifest_path(self) -> str:
        return str(Path(self.store_dir) / "manifests" / f"{self.id}.json")

    @property
    def files(self) -> int:
        return len(self.entries)

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.entries.values())

    @property
    def new_bytes(self) -> int:
        seen: set[str] = set()
        total = 0
        for e in self.entries.values():
            if e.sha in self.missing and e.sha not in seen:
                seen.add(e.sha)
                total += e.size
        return total

    @property
    def diff_sha(self) -> Optional[str]:
        return hashlib.sha256(self.diff.encode()).hexdigest() if self.diff else None

    @property
    def warnings(self) -> list[str]:
        """One line per file that kept changing while it was read (left out, found live)."""
        return [f"{rel} changed while it was read and is not frozen: the ranks read it live"
                for rel in self.left_out.get(LEFT_CHANGING, ())]

    def in_tree(self, live_path: str) -> Optional[str]:
        """Where a live path inside the project lies in the snapshot's tree (None: outside it)."""
        rel = _relative(live_path, self.root)
        return None if rel is None else (self.tree if rel == "." else str(Path(self.tree) / rel))

    def pythonpath(self, value: str) -> str:
        """``PYTHONPATH`` as the ranks get it: each entry inside the project is preceded by its
        place in the tree (what the ranks' imports and their children then find first)."""
        out: list[str] = []
        folders = {"."} | {rel.rsplit("/", 1)[0] for rel in self.entries if "/" in rel}
        folders |= {f.rsplit("/", i)[0] for f in list(folders) for i in range(1, f.count("/") + 1)}
        for item in value.split(os.pathsep):
            rel = _relative(os.path.realpath(item), self.root) if item and os.path.isabs(item) else None
            moved = self.in_tree(os.path.realpath(item)) if rel in folders else None  # a folder the snapshot holds
            if moved is not None and moved not in out:
                out.append(moved)
            out.append(item)
        return os.pathsep.join(out)

    def summary(self) -> dict:
        """What the run records (``<run>/code.json``) and the plan carries."""
        return {"id": self.id, "root": self.root, "how": self.how, "tree": self.tree, "manifest": self.manifest_path,
                "commit": self.commit, "dirty": bool(self.diff), "diff": self.diff_sha, "files": self.files,
                "bytes": self.bytes, "new_files": len(self.missing), "new_bytes": self.new_bytes,
                "ignore_file": self.ignore_file, "exclude": list(self.exclude), "include": list(self.include),
                "exclude_patterns": list(self.exclude_patterns),
                "left_out": {why: {"count": len(paths), "examples": list(paths[:5])}
                             for why, paths in self.left_out.items() if paths}}


def snapshot_id(entries: Mapping[str, Entry]) -> str:
    lines = "\n".join(f"{rel}\0{e.sha}\0{e.mode:o}\0{e.link or ''}" for rel, e in sorted(entries.items()))
    return hashlib.sha256(lines.encode("utf-8", "surrogateescape")).hexdigest()[:20]


def _mirror_names(root: str) -> list[str]:
    """The last folders of ``root``'s path: its mirrored ancestors and itself."""
    parts = [p for p in Path(root).parts[1:]] or ["_"]
    return parts[-(MIRRORED_LEVELS + 1):]


def is_code(rel: str, size: int) -> Optional[str]:
    """None when ``rel`` (a file of ``size`` bytes) is code by the rule, else why it is not."""
    suffix = os.path.splitext(rel)[1].lower()
    if suffix in SOURCE_SUFFIXES:
        return None
    if suffix in CONFIG_SUFFIXES:
        return None if size <= CONFIG_MAX_BYTES else LEFT_BIG_CONFIG
    return LEFT_NOT_CODE


def _output_part(rel: str) -> bool:
    """A path under a hidden, output or cache folder (its folders only, not its own name)."""
    return any(p.startswith(".") or p in OUTPUT_DIRS for p in rel.split("/")[:-1])


# ---- scanning (reads only, but for the blobs ``stage`` copies) --------------------------------
def project_root(entrypoint: str, cwd: str) -> tuple[Optional[str], str]:
    """The folder to freeze and how it was found ("git" | "folder"), or (None, why): a module
    entrypoint of an installed package has nothing of the user's to freeze.

    A script: the git work tree holding it, else its folder. A module (``pkg.mod:fn``): where its
    top-level package is (under the CLI's folder, which the ranks search first, else where this
    interpreter finds it, an editable install's project included), then the git work tree
    holding that, else that folder."""
    script = entrypoint.endswith(".py") or ":" not in entrypoint
    shipped = _shipped_root(os.path.dirname(os.path.abspath(os.path.join(cwd, entrypoint))) if script else cwd)
    if shipped is not None:  # a project that `--remote submit` shipped here: exactly the files it sent
        return shipped, "shipped"
    if script:
        path = os.path.abspath(os.path.join(cwd, entrypoint))
        start = os.path.dirname(path)
        top = _git_toplevel(start)
        return (top, "git") if top is not None and not _git_ignores(top, path) else (start, "folder")
    top_module = entrypoint.split(":")[0].split(".")[0]
    location = _module_folder(top_module, cwd)
    if location is None:
        return None, f"{top_module} is an installed package"
    top = _git_toplevel(location)
    return (top, "git") if top is not None and not _git_ignores(top, location) else (location, "folder")


def _module_folder(name: str, cwd: str) -> Optional[str]:
    """The folder holding top-level module ``name`` (None: not found, or an installed package)."""
    if os.path.isdir(os.path.join(cwd, name)) or os.path.isfile(os.path.join(cwd, name + ".py")):
        return cwd
    import importlib.util

    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if found is None:
        return None
    where = found.origin if found.has_location and found.origin else next(iter(found.submodule_search_locations or []), None)
    if where is None:
        return None
    parts = Path(where).parts
    if "site-packages" in parts or "dist-packages" in parts or _installed(where):
        return None
    folder = os.path.dirname(where)
    return os.path.dirname(folder) if os.path.basename(where) == "__init__.py" else folder


def scan_project(entrypoint: str, cwd: str, runs_dir: str, *, ignore_file: str = ".orchignore", max_mb: float = 200,
                 exclude: Iterable[str] = (), include_patterns: Iterable[str] = (),
                 exclude_patterns: Iterable[str] = (), stage: bool = False) -> Optional[Snapshot]:
    """The snapshot of the project holding ``entrypoint`` (None: a module of an installed package,
    nothing of the user's to freeze). The store lives in ``<runs_dir>/.code``; the runs folder and
    ``exclude`` are never frozen. ``stage``: copy new files into the store while hashing them."""
    root, how = project_root(entrypoint, cwd)
    if root is None:
        return None
    runs = os.path.abspath(os.path.join(cwd, os.path.expanduser(runs_dir)))
    script = entrypoint.endswith(".py") or ":" not in entrypoint
    required = [os.path.abspath(os.path.join(cwd, entrypoint))] if script else []
    return scan(root, how, os.path.join(runs, STORE_NAME), ignore_file=ignore_file, max_mb=max_mb,
                exclude=[runs, *exclude], required=required, include_patterns=include_patterns,
                exclude_patterns=exclude_patterns, stage=stage)


def _home_dir() -> Optional[str]:
    try:
        from orchestrator.records import home

        return str(home())
    except OrchestratorError:
        return None


def scan(root: str, how: str, store_dir: str, *, ignore_file: str = ".orchignore", max_mb: float = 200,
         exclude: Iterable[str] = (), required: Iterable[str] = (), include_patterns: Iterable[str] = (),
         exclude_patterns: Iterable[str] = (), stage: bool = False) -> Snapshot:
    """List and hash the project (see the module's doc). ``exclude``: absolute folders never
    frozen (the runs folder); ``required``: absolute files that must be in it (the entrypoint);
    ``include_patterns``/``exclude_patterns``: ``code.include``/``code.exclude``. Files unchanged
    since the last ``store`` (same size, mtime and inode) are not read again; ``stage`` copies
    each file the store lacks into it while hashing it."""
    root = os.path.realpath(root)
    home = _home_dir()
    forms = {f for x in [*exclude, store_dir, *([home] if home else [])] for f in (os.path.abspath(x), os.path.realpath(x))}
    excluded = sorted(p for p in forms if _relative(p, root) is not None)  # a link named runs/ too, not only its target
    exclude_patterns, include = tuple(exclude_patterns), tuple(include_patterns)
    ignore = [*_ignore_patterns(Path(root) / ignore_file), *exclude_patterns]
    left: dict[str, list[str]] = {}
    shipped: dict = {}
    if how == "git":
        tracked, others = _git_files(root, [_relative(p, root) or "" for p in excluded])
    elif how == "shipped":
        shipped = _read_shipped(root)
        tracked, others = sorted(shipped["files"]), []
    else:
        tracked, others = [], _walk(root, excluded, prune=not include, left=left)
    cache = _read_index(store_dir, root)
    for rel, item in shipped.get("files", {}).items():  # hashed when received: trusted while the inode is the same
        if len(item) > 4 and rel not in cache:
            cache[rel] = [item[1], None, item[4], item[0]]
    entries: dict[str, Entry] = {}
    files: list[tuple[str, os.stat_result]] = []
    required_rel = {_relative(os.path.realpath(path), root): path for path in required}
    # the entrypoint is what the ranks run: frozen whatever its name (a script with no .py suffix)
    chosen = [(rel, True) for rel in tracked] + [(rel, rel in required_rel) for rel in others]
    run_folders: dict[str, bool] = {}
    for rel, declared in sorted(chosen):  # first every file's size: a project over the limit is refused before it is read
        full = os.path.join(root, rel)
        if any(_relative(full, x) is not None for x in excluded):
            continue
        if _ignored(rel, ignore):
            left.setdefault(LEFT_IGNORED, []).append(rel)
            continue
        try:
            st = os.lstat(full)
        except FileNotFoundError:  # tracked but deleted in the work tree, or gone since it was listed
            continue
        except OSError as exc:
            raise SnapshotError(f"cannot read {full} for the code snapshot: {exc.strerror}; fix its permissions, "
                                f"list it in {os.path.join(root, ignore_file)}, or set code.snapshot: false") from None
        if not declared and _in_run_folder(root, rel, run_folders):
            left.setdefault(LEFT_RUN, []).append(rel)
            continue
        if not declared and not _ignored(rel, list(include)):
            why = LEFT_OUTPUT if _output_part(rel) else \
                _link_why(full, root, excluded) if stat.S_ISLNK(st.st_mode) else is_code(rel, st.st_size)
            if why is not None:
                left.setdefault(why, []).append(rel)
                continue
        if stat.S_ISLNK(st.st_mode):
            target = _kept_link(os.readlink(full), rel, root)
            entries[rel] = Entry(sha=hashlib.sha256(os.fsencode(target)).hexdigest(), size=0, mode=0o777, link=target)
        elif stat.S_ISREG(st.st_mode):  # not a socket, a fifo or a folder
            files.append((rel, st))
    total = sum(st.st_size for _, st in files)
    if total > max_mb * 1e6:
        biggest = sorted(files, key=lambda f: -f[1].st_size)[:5]
        listed = ", ".join(f"{rel} ({human_size(st.st_size)})" for rel, st in biggest)
        raise SnapshotError(f"the code snapshot of {root} would be {human_size(total)} ({len(files)} files), over "
                            f"code.max_mb={max_mb:g}; the largest: {listed}. List data, weights and outputs in "
                            f"{os.path.join(root, ignore_file)} or code.exclude, raise code.max_mb, or set "
                            "code.snapshot: false")
    blobs = Path(store_dir) / "blobs"
    hashed, staged = _hash_files(root, files, cache, blobs if stage else None, entries, left)
    for rel, path in required_rel.items():
        if rel is not None and rel not in entries:
            if rel in left.get(LEFT_CHANGING, ()):
                raise SnapshotError(f"{path} kept changing while it was read: save it, then run or submit again")
            raise SnapshotError(f"{path} is not in the code snapshot (git ignores it, or {ignore_file} or "
                                "code.exclude lists it): the ranks could not run it; track it, or set "
                                "code.snapshot: false")
    commit, diff = _git_state(root) if how == "git" else (shipped.get("commit"), shipped.get("diff") or "")
    missing = frozenset(e.sha for e in entries.values()
                        if e.link is None and not os.path.isfile(os.path.join(blobs, e.sha[:2], e.sha)))
    return Snapshot(root=root, how=how, entries=entries, store_dir=str(store_dir), commit=commit, diff=diff,
                    missing=missing, hashed=hashed, ignore_file=ignore_file, exclude=tuple(excluded),
                    left_out={why: tuple(sorted(paths)) for why, paths in left.items()}, staged=staged,
                    include=tuple(include),
                    exclude_patterns=tuple(exclude_patterns))


def _hash_files(root: str, files: list[tuple[str, os.stat_result]], cache: Mapping[str, list],
                blobs: Optional[Path], entries: dict[str, Entry],
                left: dict[str, list[str]]) -> tuple[dict, dict[str, tuple[int, int, int]]]:
    """Hash each file (the index's hash when its size, mtime and inode are the same), add it to
    ``entries`` and return what each was hashed as; a file that never reads the same twice goes
    to ``left``. ``blobs``: copy each file the store lacks there while hashing it (the hashes so
    written come back too: those blobs need no second check when the tree is built)."""
    hashed: dict[str, tuple[int, int, int]] = {}
    staged: dict[str, tuple[int, int, int]] = {}
    for rel, st in files:
        key = (st.st_size, st.st_mtime_ns, st.st_ino)
        known = cache.get(rel)
        fresh = known is not None and known[0] == key[0] and known[2] == key[2] and known[1] in (None, key[1])
        if fresh and (blobs is None or os.path.isfile(os.path.join(blobs, known[3][:2], known[3]))):
            sha = known[3]
        else:
            read = _read_stable(os.path.join(root, rel), blobs)
            if read is None:
                left.setdefault(LEFT_CHANGING, []).append(rel)
                continue
            sha, st = read
            key = (st.st_size, st.st_mtime_ns, st.st_ino)
            if blobs is not None:
                staged[sha] = _blob_stat(blobs / sha[:2] / sha)
        entries[rel] = Entry(sha=sha, size=key[0], mode=0o755 if st.st_mode & 0o111 else 0o644)
        hashed[rel] = key
    return hashed, staged


def _blob_stat(path: Path) -> tuple[int, int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (-1, -1, -1)
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def _read_stable(path: str, blobs: Optional[Path]) -> Optional[tuple[str, os.stat_result]]:
    """The file's hash and its stat, from a read during which it did not change (its size, mtime
    and inode the same before and after, and as many bytes read as it holds); with ``blobs``,
    the bytes read are stored as that blob. None: it changed during every try, or vanished."""
    for _ in range(_READ_TRIES):
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SnapshotError(f"cannot read {path} for the code snapshot: {exc.strerror}; fix its permissions, "
                                "list it in the ignore file or code.exclude, or set code.snapshot: false") from None
        with os.fdopen(fd, "rb") as f:
            before = os.fstat(f.fileno())
            digest, size, tmp = _copy_hashing(f, blobs, path)
            after = os.fstat(f.fileno())
        stable = (before.st_size, before.st_mtime_ns, before.st_ino) == (after.st_size, after.st_mtime_ns, after.st_ino) \
            and size == after.st_size
        sha = digest.hexdigest()
        if tmp is not None:
            _settle_blob(tmp, blobs / sha[:2] / sha if stable and blobs is not None else None)
        if stable:
            return sha, after
    return None


def _copy_hashing(f, blobs: Optional[Path], path: str):
    """Read ``f`` to its end, hashing it (and writing it to a temporary blob when ``blobs``)."""
    digest, size, tmp = hashlib.sha256(), 0, None
    out = None
    try:
        if blobs is not None:
            blobs.mkdir(parents=True, exist_ok=True)
            handle, tmp = tempfile.mkstemp(dir=blobs, prefix=".tmp-")
            out = os.fdopen(handle, "wb")
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
            if out is not None:
                out.write(chunk)
        if out is not None:
            out.close()
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        where = f"the code store {blobs}" if blobs is not None else path
        raise SnapshotError(f"cannot copy {path} into {where}: {exc.strerror}; set runs_dir to a folder you can "
                            "write, or code.snapshot: false") from None
    return digest, size, tmp


def _settle_blob(tmp: str, target: Optional[Path]) -> None:
    """Rename a temporary blob into place, read-only (a verified copy replaces whatever is
    there), or drop it (``target`` None: its read was torn)."""
    if target is None:
        Path(tmp).unlink(missing_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(tmp, 0o444)
    os.replace(tmp, target)


def _git(root: str, *args: str) -> Optional[bytes]:
    try:
        out = subprocess.run(["git", "-C", root, *args], capture_output=True, timeout=GIT_TIMEOUT_S,
                             env={**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"})
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


SHIPPED_NAME = ".orchestrator-shipped.json"


def _shipped_root(start: str) -> Optional[str]:
    """The checkout a remote submission made (``remote_receive``) holding ``start``, if any."""
    folder = os.path.realpath(start)
    while True:
        if os.path.isfile(os.path.join(folder, SHIPPED_NAME)):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def _read_shipped(root: str) -> dict:
    try:
        data = json.loads((Path(root) / SHIPPED_NAME).read_text(encoding="utf-8"))
        assert isinstance(data.get("files"), dict)
        return data
    except (OSError, ValueError, AssertionError) as exc:
        raise SnapshotError(f"cannot read {Path(root) / SHIPPED_NAME} (what a remote submission shipped): {exc}; "
                            "submit again from your machine") from None


def _installed(path: str) -> bool:
    """Inside this interpreter's own library folders (the standard library, site-packages)."""
    import sysconfig

    real = os.path.realpath(path)
    folders = {os.path.realpath(p) for key, p in sysconfig.get_paths().items() if key in ("stdlib", "platstdlib", "purelib", "platlib")}
    return any(_relative(real, folder) is not None for folder in folders)


def _git_toplevel(folder: str) -> Optional[str]:
    if not os.path.isdir(folder):
        return None
    out = _git(folder, "rev-parse", "--show-toplevel")
    return os.path.realpath(out.decode().strip()) if out else None


def _git_ignores(root: str, path: str) -> bool:
    """Git ignores ``path`` (a script in an ignored scratch folder of a larger repository: the
    project is then the script's own folder, not the repository that ignores it)."""
    try:
        out = subprocess.run(["git", "-C", root, "check-ignore", "-q", "--", path], capture_output=True,
                             timeout=GIT_TIMEOUT_S, env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0


def _git_files(root: str, excluded: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """(tracked files, untracked files git does not ignore), never listing inside ``excluded``
    (relative folders: the runs folder, which git may not ignore and which grows with every run);
    a git submodule's own files under its folder."""
    skip = [f":(exclude,literal){rel}" for rel in excluded if rel and rel != "."]
    lists = [_git(root, "ls-files", "-z", "--cached", "--", ".", *skip),
             _git(root, "ls-files", "-z", "--others", "--exclude-standard", "--", ".", *skip)]
    if lists[0] is None or lists[1] is None:
        raise SnapshotError(f"git could not list the files of {root}; check 'git -C {root} status', "
                            "or set code.snapshot: false")
    tracked, others = ({n for n in out.decode("utf-8", "surrogateescape").split("\0") if n} for out in lists)
    for name in sorted(tracked):
        folder = os.path.join(root, name)
        if os.path.isdir(folder) and not os.path.islink(folder) and os.path.exists(os.path.join(folder, ".git")):
            tracked.discard(name)  # a submodule (a gitlink): its files, not the link
            sub_tracked, sub_others = _git_files(folder)
            tracked.update(f"{name}/{sub}" for sub in sub_tracked)
            others.update(f"{name}/{sub}" for sub in sub_others)
    return sorted(tracked), sorted(others - tracked)


def _kept_link(target: str, rel: str, root: str) -> str:
    """A symlink's target as the tree keeps it: a relative one that leads out of the project is
    made absolute (in the tree it would lead somewhere else)."""
    if os.path.isabs(target):
        return target
    resolved = os.path.normpath(os.path.join(root, os.path.dirname(rel), target))
    return target if _relative(resolved, root) is not None else resolved


def _git_state(root: str) -> tuple[Optional[str], str]:
    head = _git(root, "rev-parse", "--verify", "-q", "HEAD")
    if not head:
        return None, ""
    diff = _git(root, "diff", "HEAD", "--no-color", "--no-ext-diff")  # binary files: named, not inlined
    return head.decode().strip(), (diff or b"").decode("utf-8", "replace")


def _is_run_folder(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "record.json")) and os.path.isfile(os.path.join(folder, "payload.json"))


def _link_why(full: str, root: str, excluded: list[str]) -> Optional[str]:
    """A symlink leading to a file or folder of the project is kept as a link (``lib -> realpkg``:
    ``import lib`` in the tree then finds the frozen package, not the live one); one leading out
    of it, or into the runs folder, is left out (the tree's live link finds the same target)."""
    target = os.path.realpath(full)
    inside = _relative(target, root) is not None and not any(_relative(target, x) is not None for x in excluded)
    return None if inside else LEFT_NOT_CODE


def _in_run_folder(root: str, rel: str, memo: dict[str, bool]) -> bool:
    """``rel`` lies in a run folder of the project (one of its folders holds record.json and payload.json)."""
    parts = rel.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        folder = "/".join(parts[:i])
        if folder not in memo:
            memo[folder] = _is_run_folder(os.path.join(root, folder))
        if memo[folder]:
            return True
    return False


def _walk(root: str, excluded: Iterable[str] = (), *, prune: bool = True,
          left: Optional[dict[str, list[str]]] = None) -> list[str]:
    """Every file under ``root`` but inside ``excluded`` and virtual environments, and (``prune``)
    hidden, output and run folders, which go to ``left``; symlinked folders are kept as links."""
    skip = {os.path.realpath(x) for x in excluded} | {os.path.abspath(x) for x in excluded}
    names = []
    for folder, dirs, files in os.walk(root):
        rel_folder = os.path.relpath(folder, root)
        linked = [d for d in dirs if os.path.islink(os.path.join(folder, d))]  # kept as links, as git keeps them
        kept = []
        for d in sorted(set(dirs) - set(linked)):
            full = os.path.join(folder, d)
            rel = d if rel_folder == "." else f"{rel_folder}/{d}".replace(os.sep, "/")
            if full in skip or os.path.exists(os.path.join(full, "pyvenv.cfg")):
                continue
            if _is_run_folder(full):  # never frozen, whatever code.include says
                if left is not None:
                    left.setdefault(LEFT_RUN, []).append(rel + "/")
                continue
            if prune and (d.startswith(".") or d in OUTPUT_DIRS):
                if left is not None:
                    left.setdefault(LEFT_OUTPUT, []).append(rel + "/")
                continue
            kept.append(d)
        dirs[:] = kept
        for name in [*files, *linked]:
            if not name.endswith((".pyc", ".pyo")):
                names.append(name if rel_folder == "." else f"{rel_folder}/{name}".replace(os.sep, "/"))
    return sorted(names)


def _ignore_patterns(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"cannot read the ignore file {path}: {exc}") from None
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def _ignored(rel: str, patterns: list[str]) -> bool:
    """gitignore's common forms: ``name`` or ``*.ext`` matches at any depth, ``dir/`` a folder at
    any depth, a pattern with a '/' inside (or leading) is anchored at the root, ``!pattern``
    takes a path back in; the last pattern that matches decides."""
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        if (negated if ignored else not negated) and _matches(rel, pattern[1:] if negated else pattern):
            ignored = not negated
    return ignored


def _matches(rel: str, pattern: str) -> bool:
    parts = rel.split("/")
    folder = pattern.endswith("/")
    pat = pattern.rstrip("/")
    if not pat:
        return False
    if "/" in pat:  # anchored
        pat = pat.lstrip("/")
        depth = pat.count("/") + 1
        if folder and len(parts) <= depth:
            return False
        candidates = ["/".join(parts[:depth])] if folder or len(parts) > depth else [rel]
        return any(_glob(pat).fullmatch(c) for c in candidates) or bool(_glob(pat).fullmatch(rel))
    names = parts[:-1] if folder else parts
    return any(_glob(pat).fullmatch(name) for name in names)


@functools.lru_cache(maxsize=256)
def _glob(pattern: str) -> re.Pattern[str]:
    """A gitignore glob: ``*`` and ``?`` never cross a '/', ``**`` does, ``[...]`` as in fnmatch."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                out.append(re.escape("["))
                i += 1
            else:
                out.append(fnmatch.translate(pattern[i:end + 1])[4:-3])
                i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out), re.S)


def _hash_file(path: str | Path) -> Optional[str]:
    """The file's sha256, or None when it cannot be read."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def _relative(path: str, root: str) -> Optional[str]:
    """``path`` relative to ``root`` in posix form, or None when it is not inside."""
    try:
        rel = os.path.relpath(path, root)
    except ValueError:
        return None
    if rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
        return None
    return rel.replace(os.sep, "/")


def human_size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _index_path(store_dir: str, root: str) -> Path:
    return Path(store_dir) / "index" / f"{hashlib.sha256(os.fsencode(root)).hexdigest()[:16]}.json"


def _read_index(store_dir: str, root: str) -> dict[str, list]:
    try:
        data = json.loads(_index_path(store_dir, root).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {rel: item for rel, item in data.items() if isinstance(item, list) and len(item) == 4
            and isinstance(item[3], str) and re.fullmatch(r"[0-9a-f]{64}", item[3])}


# ---- storing ---------------------------------------------------------------------------------
def write_index(snap: Snapshot) -> None:
    """Remember each file's hash by its (size, mtime, inode), so the next scan reads only what changed."""
    from orchestrator.records import write_json_atomic

    index = {rel: [*snap.hashed[rel], e.sha] for rel, e in snap.entries.items() if rel in snap.hashed}
    write_json_atomic(_index_path(snap.store_dir, snap.root), index)


def store(snap: Snapshot) -> str:
    """Write the blobs the store lacks, the manifest and the tree; return the tree. A blob is
    copied from the project only when it still hashes to what was scanned; a tree already there
    is checked against the manifest and rebuilt when damaged. Safe to run twice at once (every
    write is a rename into place)."""
    from orchestrator.records import write_json_atomic

    store_dir = Path(snap.store_dir)
    blobs = store_dir / "blobs"
    for rel, entry in sorted(snap.entries.items()):
        if entry.link is None and not (blobs / entry.sha[:2] / entry.sha).is_file():
            _store_blob(Path(snap.root) / rel, entry.sha, blobs / entry.sha[:2] / entry.sha)
    if snap.diff:
        digest = snap.diff_sha or ""
        target = blobs / digest[:2] / digest
        if not target.is_file():
            put_blob(target, digest, [snap.diff.encode()], SnapshotError("the diff changed while it was stored"))
    manifest = Path(snap.manifest_path)
    if not manifest.is_file():
        write_json_atomic(manifest, {"id": snap.id, "root": snap.root,
                                     "files": {rel: e.to_json() for rel, e in sorted(snap.entries.items())}})
    tree = Path(snap.tree)
    if not tree.is_dir() or _damaged(snap.entries, tree):
        _build_view(snap, blobs)
    _link_live(snap)
    write_index(snap)
    return str(tree)


def _store_blob(source: Path, sha: str, target: Path) -> None:
    try:
        with open(source, "rb") as f:
            put_blob(target, sha, iter(lambda: f.read(_CHUNK), b""),
                     SnapshotError(f"{source} changed while it was being frozen; run or submit again"))
    except FileNotFoundError:
        raise SnapshotError(f"{source} was removed while it was being frozen; run or submit again") from None


def put_blob(target: Path, sha: str, chunks: Iterable[bytes], mismatch: Exception) -> None:
    """Write ``chunks`` as the read-only blob ``target``, hashing them on the way: content that
    does not hash to ``sha`` raises ``mismatch`` and leaves nothing behind; a complete blob
    appears at once (renamed into place), so two writers of one blob never clash."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != sha:
            raise mismatch
        os.chmod(tmp, 0o444)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _damaged(entries: Mapping[str, Entry], tree: Path) -> bool:
    """A tree file that no longer matches the manifest (a rank wrote into it), or is gone. A file
    whose size, mtime and inode are still those the tree was built with (its stamp) is taken as
    built; any other is hashed."""
    stamp = _read_stamp(tree)
    for rel, entry in entries.items():
        path = os.path.join(tree, rel)
        if entry.link is not None:
            try:
                if os.readlink(path) != entry.link:
                    return True
            except OSError:
                return True
            continue
        try:
            st = os.lstat(path)
        except OSError:
            return True
        if stat.S_ISLNK(st.st_mode):
            return True
        if stamp.get(rel) == [st.st_size, st.st_mtime_ns, st.st_ino] and st.st_size == entry.size:
            continue
        if _hash_file(path) != entry.sha:
            return True
    return False


def _stamp_path(tree: Path) -> Path:
    return Path(str(tree) + _TREE_STAMP)  # beside the project's folder in the view, not in it


def _read_stamp(tree: Path) -> dict[str, list]:
    try:
        data = json.loads(_stamp_path(tree).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_stamp(tree: Path, entries: Mapping[str, Entry]) -> None:
    """Each built file's (size, mtime, inode): what ``_damaged`` compares before hashing."""
    stamp = {}
    for rel, entry in entries.items():
        if entry.link is None:
            st = os.lstat(tree / rel)
            stamp[rel] = [st.st_size, st.st_mtime_ns, st.st_ino]
    _stamp_path(tree).write_text(json.dumps(stamp), encoding="utf-8")


def _build_view(snap: Snapshot, blobs: Path) -> None:
    """The snapshot as a folder of read-only copies of its verified blobs, built aside and
    renamed into place (replacing a damaged one), so a rank never sees half a tree."""
    view = Path(snap.view)
    view.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=view.parent, prefix=f".tmp-{view.name}-"))
    trash: Optional[Path] = None
    try:
        tree = tmp.joinpath(*_mirror_names(snap.root))
        tree.mkdir(parents=True)
        for rel, entry in sorted(snap.entries.items()):
            dest = tree / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if entry.link is not None:
                os.symlink(entry.link, dest)
            else:
                _copy_verified(snap, rel, entry, blobs, dest)
        _write_stamp(tree, snap.entries)
        for folder in [tmp, *(p for p in tmp.rglob("*") if p.is_dir() and not p.is_symlink())]:
            os.chmod(folder, 0o755)
        if view.is_dir():
            built = Path(view, *_mirror_names(snap.root))
            if built.is_dir() and not _damaged(snap.entries, built):
                return  # another start built it meanwhile, and ranks may be in it: keep it (ours is removed)
            # damaged: set aside, replaced at once
            trash = view.with_name(f".trash-{view.name}-{os.getpid()}-{threading.get_ident()}")
            os.rename(view, trash)
        try:
            os.rename(tmp, view)
        except OSError:
            if not view.is_dir():  # not another start that built the same tree first
                raise
    finally:
        for leftover in (tmp, trash):
            if leftover is not None and leftover.exists():
                _remove_tree(leftover)


def _remove_tree(path: Path) -> None:
    def writable(func, p, _exc):  # noqa: ANN001 - shutil's onerror signature
        try:
            os.chmod(os.path.dirname(p), 0o755)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=writable)


def _copy_verified(snap: Snapshot, rel: str, entry: Entry, blobs: Path, dest: Path) -> None:
    """Copy blob ``entry.sha`` to ``dest`` (read-only), checking its hash on the way: a damaged
    blob is stored again from the project while the project still holds that content."""
    blob = blobs / entry.sha[:2] / entry.sha
    if entry.sha in snap.staged and _blob_stat(blob) == snap.staged[entry.sha]:  # written by this scan, untouched since
        try:
            shutil.copyfile(blob, dest)
            os.chmod(dest, 0o555 if entry.mode & 0o111 else 0o444)
            return
        except FileNotFoundError:
            pass  # removed since: checked and stored again below
    for attempt in range(2):
        digest = hashlib.sha256()
        try:
            with open(blob, "rb") as src, open(dest, "wb") as out:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
        except FileNotFoundError:
            pass
        if digest.hexdigest() == entry.sha and blob.is_file():
            os.chmod(dest, 0o555 if entry.mode & 0o111 else 0o444)
            return
        if attempt == 0:
            blob.unlink(missing_ok=True)
            try:
                _store_blob(Path(snap.root) / rel, entry.sha, blob)
            except SnapshotError:
                break
    raise SnapshotError(f"the stored copy of {rel} ({blob}) is damaged and {Path(snap.root) / rel} no longer "
                        "holds that content: run or submit again to freeze the project as it is now")


def _link_live(snap: Snapshot) -> None:
    """In every folder of the tree, and in the mirrored parents of the project, a link to each
    live file or folder the tree lacks (left out of the snapshot, or made since): a script finds
    its data beside ``__file__`` or above it as it would in the project. The runs folder and the
    store are never linked."""
    tree = Path(snap.tree)
    skip = {os.path.realpath(x) for x in snap.exclude} | {os.path.realpath(snap.store_dir)}
    if Path(snap.store_dir).name == STORE_NAME:  # the runs folder, wherever it is (beside the project too)
        skip.add(os.path.realpath(Path(snap.store_dir).parent))
    folders = {""}
    for rel in snap.entries:
        parts = rel.split("/")[:-1]
        folders.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    for rel in sorted(folders):
        _link_missing(tree / rel if rel else tree, Path(snap.root) / rel if rel else Path(snap.root), skip, None)
    names = _mirror_names(snap.root)
    live, mirrored = Path(snap.root), tree
    for _ in names[:-1]:
        live, mirrored, keep = live.parent, mirrored.parent, live.name
        _link_missing(mirrored, live, skip, MIRROR_MAX_ENTRIES, keep)


def _link_missing(folder: Path, live: Path, skip: set[str], limit: Optional[int], keep: Optional[str] = None) -> None:
    try:
        names = os.listdir(live)
        present = set(os.listdir(folder))
    except OSError:
        return
    if limit is not None and len(names) > limit:
        return
    for name in names:
        if name == keep or name in present:
            continue
        target = os.path.join(live, name)
        if os.path.realpath(target) in skip:
            continue
        try:
            os.symlink(target, os.path.join(folder, name))
        except OSError:  # made by another start just now, or a read-only store
            pass


# ---- reading a stored snapshot ---------------------------------------------------------------
def load_manifest(path: str | Path) -> dict[str, Entry]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        entries = {rel: Entry.from_json(item) for rel, item in data["files"].items()}
        if not all(isinstance(rel, str) and isinstance(e.sha, str) and re.fullmatch(r"[0-9a-f]{64}", e.sha)
                   and (e.link is None or isinstance(e.link, str)) for rel, e in entries.items()):
            raise ValueError("an entry is not [sha256, size, mode(, link)]")
        return entries
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise SnapshotError(f"cannot read the snapshot's manifest {path}: {exc}") from None


def read_code_record(path: str | Path) -> dict:
    """A run's ``code.json`` (``Snapshot.summary()``), checked: a damaged one is one line."""
    try:
        code = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(code, dict) or not all(isinstance(code.get(k), str) for k in ("id", "root", "manifest")):
            raise ValueError("id, root or manifest is missing")
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"the run's code record {path} is damaged ({exc}); the run itself is unaffected, "
                            "but its snapshot cannot be compared") from None
    return code


def blob_path(store_dir: str | Path, sha: str) -> Path:
    return Path(store_dir) / "blobs" / sha[:2] / sha


# ---- what changed on disk since ----------------------------------------------------------------
def changes_since(code: Mapping) -> tuple[list[tuple[str, str]], Snapshot, dict[str, Entry]]:
    """Compare a run's snapshot (its ``code.json``) with its project on disk now:
    [(status, path)] with status added / deleted / modified, the live scan and the frozen entries."""
    try:
        manifest, root = str(code["manifest"]), str(code["root"])
        how, ignore_file = str(code.get("how") or "folder"), str(code.get("ignore_file") or ".orchignore")
        exclude, include, patterns = ([str(x) for x in code.get(key) or []]
                                      for key in ("exclude", "include", "exclude_patterns"))
    except (KeyError, TypeError, AttributeError):
        raise SnapshotError("the run's code.json is damaged (no manifest or root, or a field of the wrong "
                            "kind): the snapshot cannot be compared") from None
    frozen = load_manifest(manifest)
    if not os.path.isdir(root):
        raise SnapshotError(f"the project {root} is no longer there; the snapshot itself is in {code.get('tree')}")
    store_dir = str(Path(manifest).parent.parent)
    live = scan(root, how, store_dir, ignore_file=ignore_file, max_mb=float("inf"),
                exclude=[*exclude, str(Path(store_dir).parent)], include_patterns=include,
                exclude_patterns=patterns)
    out: list[tuple[str, str]] = []
    for rel in sorted(set(frozen) | set(live.entries)):
        before, after = frozen.get(rel), live.entries.get(rel)
        if before is None:
            out.append(("added", rel))
        elif after is None:
            out.append(("deleted", rel))
        elif (before.sha, before.mode, before.link) != (after.sha, after.mode, after.link):
            out.append(("modified", rel))
    return out, live, frozen


def unified_diff(store_dir: str, root: str, status: str, rel: str, frozen: Optional[Entry]) -> str:
    """One file's change as ``diff -u`` shows it (the snapshot on the left, the disk on the right);
    a stored copy that is gone or damaged, or a file that cannot be read, is said in one line."""
    import difflib

    def lines(data: Optional[bytes]) -> Optional[list[str]]:
        if data is None:
            return []
        try:
            return data.decode("utf-8").splitlines(keepends=True)
        except UnicodeDecodeError:
            return None

    old: Optional[bytes] = None
    if status != "added" and frozen is not None and frozen.link is None:
        try:
            old = blob_path(store_dir, frozen.sha).read_bytes()
        except OSError as exc:
            return f"{rel}: the snapshot's copy cannot be read ({exc.strerror}): {status}\n"
        if hashlib.sha256(old).hexdigest() != frozen.sha:
            return f"{rel}: the snapshot's copy is damaged (it no longer matches its hash): {status}\n"
    new_path = Path(root) / rel
    try:
        new = None if status == "deleted" or new_path.is_symlink() else new_path.read_bytes()
    except OSError as exc:
        return f"{rel}: cannot be read on disk ({exc.strerror}): {status}\n"
    a, b = lines(old), lines(new)
    if a is None or b is None:
        return f"Binary file {rel} {status}\n"
    text = "".join(difflib.unified_diff(a, b, f"snapshot/{rel}", f"disk/{rel}"))
    return text if text.endswith("\n") or not text else text + "\n\\ No newline at end of file\n"
