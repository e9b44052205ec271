"""Which files a code snapshot holds (``orchestrator.code.snapshot`` states the rule): the project's
root (a git work tree, a folder, or a checkout ``--remote submit`` shipped), git's lists of
tracked and untracked files, a walk of a folder outside git, and the ignore file's patterns.
Reads only; hashing is ``snapshot_scan``'s."""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Iterable, Optional

from orchestrator.code.snapshot_model import LEFT_NOT_CODE, LEFT_OUTPUT, LEFT_RUN, OUTPUT_DIRS, SnapshotError, _relative

GIT_TIMEOUT_S = 30.0


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
