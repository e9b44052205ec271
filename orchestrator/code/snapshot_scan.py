"""Scanning a project for its code snapshot: each file chosen (``snapshot_files``) is hashed
from one read during which it did not change (a file that keeps changing is left out, named),
the index remembers each hash by (size, mtime, inode) so an unchanged file is not read again,
and with ``stage`` each new file is copied into the store while it is hashed."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Iterable, Mapping, Optional

from orchestrator.core.errors import OrchestratorError
from orchestrator.core.payload import is_script
from orchestrator.code.snapshot_files import (git_files, git_state, ignore_patterns, is_ignored, enclosing_folder, kept_link,
                                         link_why, read_shipped, walk_files, project_root,
                                         stray_shipped_records)
from orchestrator.code.snapshot_model import (CHUNK, LEFT_CHANGING, LEFT_IGNORED, LEFT_OUTPUT, LEFT_RUN, STORE_NAME, Entry,
                                         Snapshot, SnapshotError, output_part, relative_inside, human_size, is_code)

_READ_TRIES = 3


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
    required = [os.path.abspath(os.path.join(cwd, entrypoint))] if is_script(entrypoint) else []
    problem = runs_dir_problem(runs_dir, runs, root, required)
    if problem is not None:
        raise SnapshotError(problem)
    snap = scan(root, how, os.path.join(runs, STORE_NAME), ignore_file=ignore_file, max_mb=max_mb,
                exclude=[runs, *exclude], required=required, include_patterns=include_patterns,
                exclude_patterns=exclude_patterns, stage=stage)
    notes = stray_notes(entrypoint, cwd)
    return dataclasses.replace(snap, notes=tuple(notes)) if notes else snap


def stray_notes(entrypoint: str, cwd: str) -> list[str]:
    """A warning for each record of a shipment above the entrypoint that does not count
    (``snapshot_files._find_shipped``): named, so it can be removed; never a refusal."""
    return [f"{path} is not the record of a checkout that --remote submit made (those lie in "
            f"$ORCHESTRATOR_HOME/remote/projects/<project>/), so it is ignored; remove it"
            for path in stray_shipped_records(entrypoint, cwd)]


def runs_dir_problem(runs_dir: str, runs: str, root: str, required: Iterable[str] = ()) -> Optional[str]:
    """Why ``runs_dir`` (resolved: ``runs``) leaves the project's code out of its own snapshot
    (None: it does not). The runs folder is never frozen (it grows with every run), so a runs_dir
    that *is* the project's root, or a folder of it holding the entrypoint, would freeze nothing
    the ranks run; said here, naming the field, before the scan refuses the entrypoint for a
    reason it cannot see ("git ignores it, or the ignore file lists it"). A runs folder above the
    project excludes nothing of it: fine."""
    runs_real = os.path.realpath(runs)
    shown = f"runs_dir: {runs_dir!r} (resolved to {runs})"
    fix = (f"give runs_dir a folder the code is not in: a subfolder of the project such as "
           f"runs_dir: {_runs_subfolder(runs_dir)!r} (left out of the snapshot by itself), or an absolute path "
           "outside the project; or set code.snapshot: false")
    if os.path.realpath(root) == runs_real:  # a runs folder *above* the project excludes nothing of it
        return (f"{shown} is the project's root ({root}); the runs folder is never frozen, so the code snapshot "
                f"would hold nothing of the project; {fix}")
    if relative_inside(runs_real, os.path.realpath(root)) is None:
        return None
    for path in required:
        if relative_inside(os.path.realpath(path), runs_real) is not None:
            return (f"{shown} holds the entrypoint {path}; the runs folder is never frozen, so the ranks could not "
                    f"run it from the code snapshot; {fix}")
    return None


def _runs_subfolder(runs_dir: str) -> str:
    """The runs_dir to suggest instead: a ``runs`` folder inside the one given."""
    base = runs_dir.rstrip("/")
    return "runs" if base in ("", ".") else f"{base}/runs"


def _home_dir() -> Optional[str]:
    try:
        from orchestrator.core.records import home

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
    excluded = sorted(p for p in forms if relative_inside(p, root) is not None)  # a link named runs/ too, not only its target
    exclude_patterns, include = tuple(exclude_patterns), tuple(include_patterns)
    ignore = [*ignore_patterns(Path(root) / ignore_file), *exclude_patterns]
    left: dict[str, list[str]] = {}
    shipped: dict = {}
    if how == "git":
        tracked, others = git_files(root, [relative_inside(p, root) or "" for p in excluded])
    elif how == "shipped":
        shipped = read_shipped(root)
        tracked, others = sorted(shipped["files"]), []
    else:
        tracked, others = [], walk_files(root, excluded, prune=not include, left=left)
    cache = _read_index(store_dir, root)
    for rel, item in shipped.get("files", {}).items():  # hashed when received: trusted while the inode is the same
        if len(item) > 4 and rel not in cache:
            cache[rel] = [item[1], None, item[4], item[0]]
    entries: dict[str, Entry] = {}
    files: list[tuple[str, os.stat_result]] = []
    required_rel = {relative_inside(os.path.realpath(path), root): path for path in required}
    # the entrypoint is what the ranks run: frozen whatever its name (a script with no .py suffix)
    chosen = [(rel, True) for rel in tracked] + [(rel, rel in required_rel) for rel in others]
    folders: dict[str, Optional[str]] = {}
    environments: set[str] = set()
    for rel, declared in sorted(chosen):  # first every file's size: a project over the limit is refused before it is read
        full = os.path.join(root, rel)
        if any(relative_inside(full, x) is not None for x in excluded):
            continue
        if is_ignored(rel, ignore):
            left.setdefault(LEFT_IGNORED, []).append(rel)
            continue
        try:
            st = os.lstat(full)
        except FileNotFoundError:  # tracked but deleted in the work tree, or gone since it was listed
            continue
        except OSError as exc:
            raise SnapshotError(f"cannot read {full} for the code snapshot: {exc.strerror}; fix its permissions, "
                                f"list it in {os.path.join(root, ignore_file)}, or set code.snapshot: false") from None
        never, folder = enclosing_folder(root, rel, folders) if not declared else (None, "")
        if never == LEFT_RUN:
            left.setdefault(never, []).append(rel)
        elif never is not None and folder not in environments:  # an environment: named once, not its files
            environments.add(folder)
            left.setdefault(never, []).append(folder + "/")
        if never is not None:
            continue
        if not declared and not is_ignored(rel, list(include)):
            why = LEFT_OUTPUT if output_part(rel) else \
                link_why(full, root, excluded) if stat.S_ISLNK(st.st_mode) else is_code(rel, st.st_size)
            if why is not None:
                left.setdefault(why, []).append(rel)
                continue
        if stat.S_ISLNK(st.st_mode):
            target = kept_link(os.readlink(full), rel, root)
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
    commit, diff = git_state(root) if how == "git" else (shipped.get("commit"), shipped.get("diff") or "")
    missing = frozenset(e.sha for e in entries.values()
                        if e.link is None and not os.path.isfile(os.path.join(blobs, e.sha[:2], e.sha)))
    return Snapshot(root=root, how=how, entries=entries, store_dir=str(store_dir), commit=commit, diff=diff,
                    missing=missing, hashed=hashed, ignore_file=ignore_file, exclude=tuple(excluded),
                    left_out={why: tuple(sorted(paths)) for why, paths in left.items()}, staged=staged,
                    include=include, exclude_patterns=exclude_patterns)


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
        if fresh and known is not None and (blobs is None or os.path.isfile(os.path.join(blobs, known[3][:2], known[3]))):
            sha = known[3]
        else:
            read = _read_stable(os.path.join(root, rel), blobs)
            if read is None:
                left.setdefault(LEFT_CHANGING, []).append(rel)
                continue
            sha, st = read
            key = (st.st_size, st.st_mtime_ns, st.st_ino)
            if blobs is not None:
                staged[sha] = blob_stat(blobs / sha[:2] / sha)
        entries[rel] = Entry(sha=sha, size=key[0], mode=0o755 if st.st_mode & 0o111 else 0o644)
        hashed[rel] = key
    return hashed, staged


def blob_stat(path: Path) -> tuple[int, int, int]:
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
        while chunk := f.read(CHUNK):
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


def write_index(snap: Snapshot) -> None:
    """Remember each file's hash by its (size, mtime, inode), so the next scan reads only what changed."""
    from orchestrator.core.atomic_files import write_json_atomic

    index = {rel: [*snap.hashed[rel], e.sha] for rel, e in snap.entries.items() if rel in snap.hashed}
    write_json_atomic(_index_path(snap.store_dir, snap.root), index)
