"""What a run's script wrote inside its code snapshot's tree (``Path(__file__).parent / "ckpt.pt"``):
the entries of a tree that the snapshot did not put there, told from a listing of the tree and its
manifest, never by reading a file. Standard library only, so that both ``gc``
(``front.snapshot_prune``: a tree holding any is kept, and said) and the identity line of
``plan``/``run``/``submit`` (``spec.identity``: a run's previous tree holding some that this
attempt, from a new tree, will not see) read it.

What the snapshot puts in a view (``<store>/trees/<id>-<key>/``, laid out in
``orchestrator.code.snapshot``): the chain of mirrored folders down to the project's tree, the
manifest's files and the folders holding them, the tree's stamp beside it (``TREE_STAMP``), and
links to the live files the tree lacks. Anything else there was written by a run: a file, or a
folder that is not empty. A link never counts (a write through one reached the live folder, and
removing the link removes nothing it points to), nor Python's bytecode caches (``__pycache__``),
nor an NFS client's placeholder for a file still open (``.nfs*``).

The cost is bounded by the tree itself: one listing of each folder the snapshot made (never
through a link, never into a folder a run made: one look says whether it is empty), no file
opened, and the walk stops at the ``limit + 1``-th find. A tree of 100,000 files in 1,000 folders
takes about 0.5 s (its 10 MB manifest read, then the listings), a third of what removing it takes;
``gc`` looks only at the trees it would remove, the identity line only at a run's previous tree
when this attempt's differs (after an edit: scanning and storing the new snapshot costs more).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from orchestrator.core.safe_read import Damaged, Unreadable, parse_json, read_regular

#: The tree's stamp, beside the project's folder in the view (``code.snapshot_store`` writes it).
TREE_STAMP = ".orchestrator-tree"
#: What an interpreter or a file system makes beside the files on its own: no run's output.
NOT_WRITTEN = frozenset({"__pycache__"})
#: A manifest lists every file of a project: far larger than a run's record may be.
MANIFEST_MAX_BYTES = 1 << 30


@dataclass(frozen=True)
class Written:
    """What runs wrote in a tree: the first ``paths`` found (relative to the project's folder in
    the tree, ``../`` for a mirrored parent; a folder ends in ``/``), and whether there are more."""

    tree: str
    paths: tuple[str, ...] = ()
    more: bool = False

    def __bool__(self) -> bool:
        return bool(self.paths)

    def listing(self) -> str:
        """``ckpt.pt, logs/ and more``."""
        return ", ".join(self.paths) + (" and more" if self.more else "")


def manifest_files(path: str | os.PathLike) -> Optional[tuple[str, list[str]]]:
    """A snapshot's manifest (``<store>/manifests/<id>.json``): the project's live root and the
    paths the snapshot holds (relative, posix); None when it is not there. Raises ``Unreadable``
    when it is no manifest (a link, a FIFO, not JSON, no ``root`` or ``files``)."""
    data = read_regular(path, MANIFEST_MAX_BYTES)
    if data is None:
        return None
    value = parse_json(data, path)
    files = value.get("files") if isinstance(value, dict) else None
    root = value.get("root") if isinstance(value, dict) else None
    if not isinstance(files, dict) or not isinstance(root, str):
        raise Damaged(path, "it is no snapshot manifest (its root or files are missing)")
    return root, list(files)


def view_of(tree: str | os.PathLike, store: str | os.PathLike) -> Optional[Path]:
    """The view (``<store>/trees/<name>``) holding ``tree``; None when ``tree`` is not in the store."""
    trees = os.path.join(os.path.abspath(store), "trees")
    rel = os.path.relpath(os.path.abspath(tree), trees)
    if rel in (os.curdir, os.pardir) or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
        return None
    return Path(trees, rel.split(os.sep)[0])


def tree_writes(tree: str, manifest: str, limit: int = 5) -> Optional[Written]:
    """What runs wrote in the tree a run's ``code.json`` names (its ``tree`` and ``manifest``);
    None when that cannot be told (the manifest is gone or damaged, the tree is not in its store)."""
    view = view_of(tree, Path(manifest).parent.parent)
    try:
        found = manifest_files(manifest)
    except Unreadable:
        return None
    if view is None or found is None or not os.path.isdir(tree):
        return None
    return written(view, tree, found[1], limit)


def written(view: str | os.PathLike, tree: str | os.PathLike, files: Iterable[str], limit: int = 5) -> Written:
    """The first ``limit`` entries of ``view`` that the snapshot did not put there (see the
    module's doc); ``tree`` is the project's folder in it, ``files`` the manifest's paths."""
    view, tree = Path(view), Path(tree)
    chain = tree.relative_to(view).parts
    made, top = _made(chain, files), "/".join(chain)
    found: list[str] = []
    for folder in sorted(made, key=lambda f: (f != top and not f.startswith(top + "/"), f)):  # the project's first
        for name in _unmade(view / folder, made[folder]):
            rel = os.path.relpath(os.path.join(view, folder, name.rstrip("/")), tree).replace(os.sep, "/")
            found.append(rel + "/" if name.endswith("/") else rel)
            if len(found) > limit:
                return Written(str(tree), tuple(found[:limit]), more=True)
    return Written(str(tree), tuple(found))


def _made(chain: tuple[str, ...], files: Iterable[str]) -> dict[str, set[str]]:
    """Each folder the snapshot made (relative to the view, posix) -> the names it put there."""
    made: dict[str, set[str]] = {}
    for depth, name in enumerate(chain):
        made.setdefault("/".join(chain[:depth]), set()).add(name)
    made.setdefault("/".join(chain[:-1]), set()).add(chain[-1] + TREE_STAMP)
    top = "/".join(chain)
    made.setdefault(top, set())
    for rel in files:
        parts = rel.split("/")
        for depth in range(len(parts)):
            made.setdefault("/".join((top, *parts[:depth])), set()).add(parts[depth])
    return made


def _unmade(folder: Path, names: set[str]) -> Iterable[str]:
    """The names in ``folder`` that the snapshot did not put there and a run did (a folder listed
    with a trailing ``/``); none when ``folder`` is gone or is a link. One that cannot be listed is
    named itself: what it holds cannot be told."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return []
        listing = os.scandir(folder)
    except FileNotFoundError:
        return []
    except OSError:
        return ["/"]
    out = []
    with listing:
        for entry in listing:
            if entry.name in names or entry.name in NOT_WRITTEN or entry.name.startswith(".nfs") or entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                if not _empty(entry.path):
                    out.append(entry.name + "/")
            else:
                out.append(entry.name)
    return sorted(out)


def _empty(path: str) -> bool:
    """A folder holding nothing (one that cannot be listed is taken as holding something)."""
    try:
        with os.scandir(path) as listing:
            return next(listing, None) is None
    except OSError:
        return False
