"""On every rank: imports of the user's project come from the job's code snapshot, not the live files.

The entrypoint already runs from the snapshot (the payload names the file in its tree, and the
script's folder or the CLI's folder in the tree is first on ``sys.path``). What could still reach
the live project: the rank's working directory (``workdir`` stays where the user wants it, and is
on ``sys.path`` for a module entrypoint), a ``.pth`` line or an editable install (``pip install
-e .``, whose finder maps the package to the live folder). One finder, first on ``sys.meta_path``,
asks the others where a top-level module is and, when the answer lies inside the live project and
the snapshot has that file, loads the snapshot's file instead. Submodules follow their package's
``__path__`` (the tree's folder, then the live one), so a package taken from the snapshot is
from the snapshot; a package imported before (the orchestrator itself) is left alone. A file the
snapshot lacks (a build product git ignores, a compiled extension) is imported live: a top-level
one is said once on stderr. The tree's folder also goes first on ``sys.path`` and ``PYTHONPATH``
for the rank's children, which start without the finder.

Standard library only: it runs before the user's code and torch.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
from types import ModuleType
from typing import Optional, Sequence

from orchestrator.core.module_origin import is_installed


class SnapshotFinder(importlib.abc.MetaPathFinder):
    def __init__(self, live_root: str, tree: str) -> None:
        self.live_root = os.path.realpath(live_root)
        self.tree = tree
        self._tree_real = os.path.realpath(tree)
        self._busy = threading.local()
        self.live_imports: list[str] = []

    def _in_tree(self, path: str) -> Optional[str]:
        real = os.path.realpath(path)
        if not _inside(real, self.live_root) or _inside(real, self._tree_real):
            return None
        moved = os.path.join(self.tree, os.path.relpath(real, self.live_root))
        # Frozen: really in the tree. The tree also links, live, what the snapshot left out (a
        # virtual environment, data): a module reached through such a link is not frozen.
        return moved if os.path.exists(moved) and _inside(os.path.realpath(moved), self._tree_real) else None

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None):
        if path is not None or getattr(self._busy, "on", False):
            return None  # a submodule: its package's __path__ already decides
        self._busy.on = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, None, target)
                if spec is not None:
                    break
        finally:
            self._busy.on = False
        return None if spec is None else self._moved(fullname, spec)

    def _moved(self, name: str, spec: importlib.machinery.ModuleSpec):
        locations = list(spec.submodule_search_locations or [])
        if spec.origin and spec.has_location:
            if _inside(os.path.realpath(spec.origin), self._tree_real):
                return None  # found in the snapshot already (the entrypoint's folder)
            moved = self._in_tree(spec.origin)
            if moved is None:
                self._say_live(name, spec.origin)
                return None
            # A package searches the tree first, then its live folder: a submodule the snapshot lacks
            # (a generated _version.py, an extension built in place) is still found, live.
            new_locations = [*(m for m in (self._in_tree(loc) for loc in locations) if m), *locations] \
                if locations else None
            self._share(os.path.dirname(os.path.dirname(moved)) if locations else os.path.dirname(moved))
            return importlib.util.spec_from_file_location(name, moved, submodule_search_locations=new_locations)
        if locations:  # a namespace package: its portions inside the project move
            moved_locs = [self._in_tree(loc) or loc for loc in locations]
            if moved_locs != locations:
                new = importlib.machinery.ModuleSpec(name, None, is_package=True)
                new.submodule_search_locations = moved_locs
                return new
        return None

    def _share(self, folder: str) -> None:
        """The tree folder a module moved to goes first on ``sys.path`` and on ``PYTHONPATH``: the
        rank's own children (spawned DataLoader workers, ``mp.spawn``, a subprocess) have no finder,
        and find it there before the live project (an editable install's finder comes after)."""
        if folder not in sys.path:
            sys.path.insert(0, folder)
        paths = os.environ.get("PYTHONPATH", "")
        if folder not in paths.split(os.pathsep):
            os.environ["PYTHONPATH"] = folder + (os.pathsep + paths if paths else "")

    def _say_live(self, name: str, origin: str) -> None:
        """Say once that a module of the project is imported live. Not an installed package that
        lives inside the project folder (a ``.venv`` there): that is never the project's code."""
        real = os.path.realpath(origin)
        if real.startswith(self.live_root + os.sep) and name not in self.live_imports and not is_installed(real):
            self.live_imports.append(name)
            print(f"[orchestrator] {name} is imported from the live project ({origin}): the code snapshot does not "
                  "hold it (git ignores it, or the ignore file lists it)", file=sys.stderr, flush=True)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def install(live_root: str, tree: str) -> SnapshotFinder:
    """Put the finder first on ``sys.meta_path`` (once) and return it."""
    for finder in sys.meta_path:
        if isinstance(finder, SnapshotFinder) and finder.live_root == os.path.realpath(live_root) \
                and finder.tree == tree:
            return finder
    finder = SnapshotFinder(live_root, tree)
    sys.meta_path.insert(0, finder)
    importlib.invalidate_caches()
    return finder


def uninstall(finder: SnapshotFinder) -> None:
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)
