"""Where a module's file comes from: an installed package, the standard library, the orchestrator,
or the user's own code. One answer for every rank-side question that depends on it (what a rank's
exit finalizes, what the code snapshot says it could not freeze), whatever the layout: a virtual
environment inside the project folder (``python -m venv .venv``) holds installed packages, not
the user's code.

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
