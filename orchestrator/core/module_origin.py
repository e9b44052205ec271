"""Where a module's file comes from: an installed package, the standard library, the orchestrator,
or the user's own code. One answer for every question that depends on it (what a rank's exit
finalizes, what the code snapshot freezes and says it could not freeze, which project a run's
identity names), whatever the layout: a virtual environment inside the project folder
(``python -m venv .venv``) holds installed packages, not the user's code, and a package linked
into site-packages from the project (``ln -s``) is the project's: the real path decides.

Standard library only: it runs on every rank.
"""

from __future__ import annotations

import os

_FOLDERS: tuple[tuple[str, ...], str] | None = None


def _folders() -> tuple[tuple[str, ...], str]:
    """(the standard library's and this interpreter's installed packages' folders, the
    orchestrator's package folder), read once."""
    global _FOLDERS
    if _FOLDERS is None:
        import sysconfig

        paths = sysconfig.get_paths()
        found = {os.path.realpath(p) for key in ("stdlib", "platstdlib", "purelib", "platlib") if (p := paths.get(key))}
        ours = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep  # the package
        _FOLDERS = (tuple(sorted(p.rstrip(os.sep) + os.sep for p in found)), ours)
    return _FOLDERS


def is_installed(path: str) -> bool:
    """An installed package's file or the standard library's (any interpreter's ``site-packages`` or
    ``dist-packages``, this one's library folders), or a frozen or built-in pseudo-file."""
    if path.startswith("<"):
        return True
    real = os.path.realpath(path)
    norm = real.replace("\\", "/")
    return "/site-packages/" in norm or "/dist-packages/" in norm or real.startswith(_folders()[0])


def is_users_own(path: str) -> bool:
    """The user's own module file: not installed, not the standard library's, not the orchestrator's."""
    return not is_installed(path) and not os.path.realpath(path).startswith(_folders()[1])


def module_folder(top: str, cwd: str) -> str | None:
    """The resolved folder holding top-level module ``top``: ``cwd`` when it is there (the ranks
    search it first), else where this interpreter finds it, an editable install's project
    included. None: not found, or an installed package (``is_installed``, on the real path)."""
    if os.path.isdir(os.path.join(cwd, top)) or os.path.isfile(os.path.join(cwd, top + ".py")):
        return os.path.realpath(cwd)
    import importlib.util

    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if found is None:
        return None
    where = found.origin if found.has_location and found.origin else next(iter(found.submodule_search_locations or []), None)
    if where is None or is_installed(where):
        return None
    real = os.path.realpath(where)
    folder = os.path.dirname(real)
    return os.path.dirname(folder) if os.path.basename(real) == "__init__.py" else folder
