"""The code snapshot: what a job imports, frozen when it is run or submitted.

A queued job starts hours after ``submit``, and a requeued one starts again later still; ranks
that imported the live files would run whatever is on disk by then. So ``run`` and ``submit``
freeze the project: ``scan`` lists and hashes it (reads only: ``plan`` shows the result),
``store`` writes what the store lacks and builds the tree the ranks import from
(``code_redirect`` points their imports there).

What is frozen, the *project*: the git work tree holding the entrypoint (a module entrypoint:
holding the folder the CLI runs in), its tracked files plus untracked files git does not ignore;
outside git, the entrypoint's folder (hidden folders, ``__pycache__`` and virtual environments
left out). The run folders, the store itself, and whatever the ignore file lists are never part
of it, and a project over ``code.max_mb`` is refused with its largest files named.

The store, under ``<runs_dir>/.code`` (shared with the nodes wherever the runs are)::

    blobs/ab/<sha256>       each file's content, once, read-only (content-addressed)
    manifests/<id>.json     one snapshot: path -> [sha256, size, mode] (or a symlink's target)
    trees/<id>/             the snapshot as a folder of hard links to the blobs: the ranks' import root
    index/<root hash>.json  (size, mtime, inode) -> sha256 of the last scan, so an unchanged tree
                            is not read again

A snapshot's id is the hash of its manifest, so the same content is one tree across runs.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Optional

from orchestrator.errors import OrchestratorError

STORE_NAME = ".code"
GIT_TIMEOUT_S = 30.0
_CHUNK = 1 << 20
#: Folders never walked outside git (besides hidden ones and virtual environments).
_SKIPPED_DIRS = frozenset({"__pycache__", "node_modules"})  # and any folder holding pyvenv.cfg


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

    @property
    def id(self) -> str:
        return snapshot_id(self.entries)

    @property
    def tree(self) -> str:
        return str(Path(self.store_dir) / "trees" / self.id)

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

    def in_tree(self, live_path: str) -> Optional[str]:
        """Where a live path inside the project lies in the snapshot's tree (None: outside it)."""
        rel = _relative(live_path, self.root)
        return None if rel is None else (self.tree if rel == "." else str(Path(self.tree) / rel))

    def summary(self) -> dict:
        """What the run records (``<run>/code.json``) and the plan carries."""
        return {"id": self.id, "root": self.root, "how": self.how, "tree": self.tree, "manifest": self.manifest_path,
                "commit": self.commit, "dirty": bool(self.diff), "diff": self.diff_sha, "files": self.files,
                "bytes": self.bytes, "new_files": len(self.missing), "new_bytes": self.new_bytes,
                "ignore_file": self.ignore_file, "exclude": list(self.exclude)}


def snapshot_id(entries: Mapping[str, Entry]) -> str:
    lines = "\n".join(f"{rel}\0{e.sha}\0{e.mode:o}\0{e.link or ''}" for rel, e in sorted(entries.items()))
    return hashlib.sha256(lines.encode("utf-8", "surrogateescape")).hexdigest()[:20]


# ---- scanning (reads only) -------------------------------------------------------------------
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
                 exclude: Iterable[str] = ()) -> Optional[Snapshot]:
    """The snapshot of the project holding ``entrypoint`` (None: a module of an installed package,
    nothing of the user's to freeze). The store lives in ``<runs_dir>/.code``; the runs folder and
    ``exclude`` are never frozen."""
    root, how = project_root(entrypoint, cwd)
    if root is None:
        return None
    runs = os.path.abspath(os.path.join(cwd, os.path.expanduser(runs_dir)))
    script = entrypoint.endswith(".py") or ":" not in entrypoint
    required = [os.path.abspath(os.path.join(cwd, entrypoint))] if script else []
    return scan(root, how, os.path.join(runs, STORE_NAME), ignore_file=ignore_file, max_mb=max_mb,
                exclude=[runs, *exclude], required=required)


def scan(root: str, how: str, store_dir: str, *, ignore_file: str = ".orchignore", max_mb: float = 200,
         exclude: Iterable[str] = (), required: Iterable[str] = ()) -> Snapshot:
    """List and hash the project (see the module's doc). ``exclude``: absolute folders never
    frozen (the runs folder); ``required``: absolute files that must be in it (the entrypoint).
    Files unchanged since the last ``store`` (same size, mtime and inode) are not read again."""
    root = os.path.realpath(root)
    forms = {f for x in [*exclude, store_dir] for f in (os.path.abspath(x), os.path.realpath(x))}
    excluded = [p for p in forms if _relative(p, root) is not None]  # a link named runs/ too, not only its target
    patterns = _ignore_patterns(Path(root) / ignore_file)
    shipped: dict = {}
    if how == "git":
        names = _git_files(root, [_relative(p, root) or "" for p in excluded])
    elif how == "shipped":
        shipped = _read_shipped(root)
        names = sorted(shipped["files"])
    else:
        names = _walk(root)
    cache = _read_index(store_dir, root)
    for rel, item in shipped.get("files", {}).items():  # hashed when received: trusted while the inode is the same
        if len(item) > 4 and rel not in cache:
            cache[rel] = [item[1], None, item[4], item[0]]
    entries: dict[str, Entry] = {}
    hashed: dict[str, tuple[int, int, int]] = {}
    files: list[tuple[str, os.stat_result]] = []
    for rel in names:  # first every file's size: a project over the limit is refused before it is read
        full = os.path.join(root, rel)
        if any(_relative(full, x) is not None for x in excluded) or _ignored(rel, patterns):
            continue
        try:
            st = os.lstat(full)
        except FileNotFoundError:  # tracked but deleted in the work tree
            continue
        except OSError as exc:
            raise SnapshotError(f"cannot read {full} for the code snapshot: {exc.strerror}; fix its permissions, "
                                f"list it in {os.path.join(root, ignore_file)}, or set code.snapshot: false") from None
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
                            f"{os.path.join(root, ignore_file)}, raise code.max_mb, or set code.snapshot: false")
    for rel, st in files:
        mode = 0o755 if st.st_mode & 0o111 else 0o644
        key = (st.st_size, st.st_mtime_ns, st.st_ino)
        known = cache.get(rel)
        fresh = known is not None and known[0] == key[0] and known[2] == key[2] and known[1] in (None, key[1])
        sha = known[3] if fresh else _hash_file(os.path.join(root, rel))
        entries[rel] = Entry(sha=sha, size=st.st_size, mode=mode)
        hashed[rel] = key
    for path in required:
        rel = _relative(os.path.realpath(path), root)
        if rel is not None and rel not in entries:
            raise SnapshotError(f"{path} is not in the code snapshot (git ignores it, or {ignore_file} lists it): "
                                f"the ranks could not run it; track it, or set code.snapshot: false")
    commit, diff = _git_state(root) if how == "git" else (shipped.get("commit"), shipped.get("diff") or "")
    blobs = Path(store_dir) / "blobs"
    missing = frozenset(e.sha for e in entries.values() if e.link is None and not (blobs / e.sha[:2] / e.sha).is_file())
    return Snapshot(root=root, how=how, entries=entries, store_dir=str(store_dir), commit=commit, diff=diff,
                    missing=missing, hashed=hashed, ignore_file=ignore_file, exclude=tuple(excluded))


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


def _git_files(root: str, excluded: Iterable[str] = ()) -> list[str]:
    """Tracked files and untracked ones git does not ignore, never listing inside ``excluded``
    (relative folders: the runs folder, which git may not ignore and which grows with every run);
    a git submodule's own files under its folder."""
    skip = [f":(exclude,literal){rel}" for rel in excluded if rel and rel != "."]
    out = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", ".", *skip)
    if out is None:
        raise SnapshotError(f"git could not list the files of {root}; check 'git -C {root} status', "
                            "or set code.snapshot: false")
    names = {name for name in out.decode("utf-8", "surrogateescape").split("\0") if name}
    for name in sorted(names):
        folder = os.path.join(root, name)
        if os.path.isdir(folder) and not os.path.islink(folder) and os.path.exists(os.path.join(folder, ".git")):
            names.discard(name)  # a submodule (a gitlink): its files, not the link
            names.update(f"{name}/{sub}" for sub in _git_files(folder))
    return sorted(names)


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


def _walk(root: str) -> list[str]:
    names = []
    for folder, dirs, files in os.walk(root):
        linked = [d for d in dirs if os.path.islink(os.path.join(folder, d))]  # kept as links, as git keeps them
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIPPED_DIRS and d not in linked
                         and not os.path.exists(os.path.join(folder, d, "pyvenv.cfg")))
        rel_folder = os.path.relpath(folder, root)
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
    any depth, a pattern with a '/' inside (or leading) is anchored at the root."""
    parts = rel.split("/")
    for pattern in patterns:
        folder = pattern.endswith("/")
        pat = pattern.rstrip("/")
        if "/" in pat:  # anchored
            pat = pat.lstrip("/")
            depth = pat.count("/") + 1
            candidates = ["/".join(parts[:depth])] if folder or len(parts) > depth else [rel]
            if folder and len(parts) <= depth:
                continue
            if any(_glob(pat).fullmatch(c) for c in candidates) or _glob(pat).fullmatch(rel):
                return True
        else:
            names = parts[:-1] if folder else parts
            if any(_glob(pat).fullmatch(name) for name in names):
                return True
    return False


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


def _hash_file(path: str) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    except OSError as exc:
        raise SnapshotError(f"cannot read {path} for the code snapshot: {exc.strerror}; fix its permissions, "
                            "list it in the ignore file, or set code.snapshot: false") from None
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
    return data if isinstance(data, dict) else {}


# ---- storing ---------------------------------------------------------------------------------
def write_index(snap: Snapshot) -> None:
    """Remember each file's hash by its (size, mtime, inode), so the next scan reads only what changed."""
    from orchestrator.records import write_json_atomic

    index = {rel: [*snap.hashed[rel], e.sha] for rel, e in snap.entries.items() if rel in snap.hashed}
    write_json_atomic(_index_path(snap.store_dir, snap.root), index)


def store(snap: Snapshot) -> str:
    """Write the blobs the store lacks, the manifest and the tree; return the tree. Each blob is
    hashed again while it is copied: a file edited since the scan is refused, never frozen under
    another file's hash. Safe to run twice at once (every write is a rename into place)."""
    from orchestrator.records import write_json_atomic

    store_dir = Path(snap.store_dir)
    blobs = store_dir / "blobs"
    for rel, entry in sorted(snap.entries.items()):
        if entry.link is None and entry.sha in snap.missing:
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
    if not tree.is_dir():
        _build_tree(snap.entries, blobs, tree)
    write_index(snap)
    return str(tree)


def _store_blob(source: Path, sha: str, target: Path) -> None:
    if target.is_file():
        return
    with open(source, "rb") as f:
        put_blob(target, sha, iter(lambda: f.read(_CHUNK), b""),
                 SnapshotError(f"{source} changed while it was being frozen; run or submit again once it is saved"))


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


def _build_tree(entries: Mapping[str, Entry], blobs: Path, tree: Path) -> None:
    """The snapshot as a folder: hard links to the read-only blobs (a copy where a link cannot be
    made: another filesystem, the link limit, an executable file's own mode), built aside and
    renamed into place, so a rank never sees half a tree."""
    tree.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=tree.parent, prefix=f".tmp-{tree.name}-"))
    try:
        for rel, entry in sorted(entries.items()):
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if entry.link is not None:
                os.symlink(entry.link, dest)
                continue
            blob = blobs / entry.sha[:2] / entry.sha
            if entry.mode & 0o111:
                shutil.copyfile(blob, dest)
                os.chmod(dest, 0o555)
                continue
            try:
                os.link(blob, dest)
            except OSError:
                shutil.copyfile(blob, dest)
                os.chmod(dest, 0o444)
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, tree)
        except OSError:
            if not tree.is_dir():  # not another start that built the same tree first
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ---- reading a stored snapshot ---------------------------------------------------------------
def load_manifest(path: str | Path) -> dict[str, Entry]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return {rel: Entry.from_json(item) for rel, item in data["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise SnapshotError(f"cannot read the snapshot's manifest {path}: {exc}") from None


def blob_path(store_dir: str | Path, sha: str) -> Path:
    return Path(store_dir) / "blobs" / sha[:2] / sha


# ---- what changed on disk since ----------------------------------------------------------------
def changes_since(code: Mapping) -> tuple[list[tuple[str, str]], Snapshot, dict[str, Entry]]:
    """Compare a run's snapshot (its ``code.json``) with its project on disk now:
    [(status, path)] with status added / deleted / modified, the live scan and the frozen entries."""
    frozen = load_manifest(code["manifest"])
    root = code["root"]
    if not os.path.isdir(root):
        raise SnapshotError(f"the project {root} is no longer there; the snapshot itself is in {code['tree']}")
    store_dir = str(Path(code["manifest"]).parent.parent)
    live = scan(root, code.get("how", "folder"), store_dir, ignore_file=code.get("ignore_file", ".orchignore"),
                max_mb=float("inf"), exclude=[*code.get("exclude", []), str(Path(store_dir).parent)])
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
    """One file's change as ``diff -u`` shows it (the snapshot on the left, the disk on the right)."""
    import difflib

    def lines(data: Optional[bytes]) -> Optional[list[str]]:
        if data is None:
            return []
        try:
            return data.decode("utf-8").splitlines(keepends=True)
        except UnicodeDecodeError:
            return None

    old = None if status == "added" or frozen is None or frozen.link is not None else \
        blob_path(store_dir, frozen.sha).read_bytes()
    new_path = Path(root) / rel
    new = None if status == "deleted" or new_path.is_symlink() else new_path.read_bytes()
    a, b = lines(old), lines(new)
    if a is None or b is None:
        return f"Binary file {rel} {status}\n"
    text = "".join(difflib.unified_diff(a, b, f"snapshot/{rel}", f"disk/{rel}"))
    return text if text.endswith("\n") or not text else text + "\n\\ No newline at end of file\n"
