"""The store of code snapshots (``<runs_dir>/.code``, laid out in ``orchestrator.code.snapshot``):
blobs written once and verified whenever they are copied, a manifest per snapshot, and the tree
the ranks import from, built aside and renamed into place, checked against the manifest each
time it is used, with links to the live files it lacks."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path
from typing import Iterable, Mapping, Optional

from orchestrator.code.snapshot_model import (CHUNK, MIRROR_MAX_ENTRIES, STORE_NAME, Entry, Snapshot, SnapshotError,
                                         mirror_names)
from orchestrator.code.snapshot_scan import blob_stat, write_index
from orchestrator.core.snapshot_writes import TREE_STAMP


def store(snap: Snapshot) -> str:
    """Write the blobs the store lacks, the manifest and the tree; return the tree. A blob is
    copied from the project only when it still hashes to what was scanned; a tree already there
    is checked against the manifest and rebuilt when damaged. Safe to run twice at once (every
    write is a rename into place)."""
    from orchestrator.core.atomic_files import write_json_atomic

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
            put_blob(target, sha, iter(lambda: f.read(CHUNK), b""),
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
    return Path(str(tree) + TREE_STAMP)  # beside the project's folder in the view, not in it


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
        tree = tmp.joinpath(*mirror_names(snap.root))
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
            built = Path(view, *mirror_names(snap.root))
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
                remove_tree(leftover)


def remove_tree(path: Path) -> None:
    def writable(func, p, _exc):  # noqa: ANN001 - shutil's onerror signature
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o755)
            func(p)

    shutil.rmtree(path, onerror=writable)


def _copy_verified(snap: Snapshot, rel: str, entry: Entry, blobs: Path, dest: Path) -> None:
    """Copy blob ``entry.sha`` to ``dest`` (read-only), checking its hash on the way: a damaged
    blob is stored again from the project while the project still holds that content."""
    blob = blobs / entry.sha[:2] / entry.sha
    if entry.sha in snap.staged and blob_stat(blob) == snap.staged[entry.sha]:  # written by this scan, untouched since
        try:
            shutil.copyfile(blob, dest)
            os.chmod(dest, 0o555 if entry.mode & 0o111 else 0o444)
            return
        except FileNotFoundError:
            pass  # removed since: checked and stored again below
    for attempt in range(2):
        digest = hashlib.sha256()
        with contextlib.suppress(FileNotFoundError), open(blob, "rb") as src, open(dest, "wb") as out:
            while chunk := src.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
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
    names = mirror_names(snap.root)
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
        with contextlib.suppress(OSError):  # made by another start just now, or a read-only store
            os.symlink(target, os.path.join(folder, name))


def _hash_file(path: str | Path) -> Optional[str]:
    """The file's sha256, or None when it cannot be read."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()
