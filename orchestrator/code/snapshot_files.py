"""Which files a code snapshot holds (``orchestrator.code.snapshot`` states the rule): the project's
root (a git work tree, a folder, or a checkout ``--remote submit`` shipped), git's lists of
tracked and untracked files, a walk of a folder outside git, and the ignore file's patterns.
Reads only; hashing is ``snapshot_scan``'s."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import stat
import subprocess
from pathlib import Path
from typing import Iterable, Optional

from orchestrator.core.module_origin import module_folder
from orchestrator.core.payload import is_script
from orchestrator.core.run_folder import RunFolder
from orchestrator.code.snapshot_model import LEFT_NOT_CODE, LEFT_OUTPUT, LEFT_RUN, OUTPUT_DIRS, SnapshotError, relative_inside

GIT_TIMEOUT_S = 30.0


def project_root(entrypoint: str, cwd: str) -> tuple[Optional[str], str]:
    """The folder to freeze and how it was found ("git" | "folder"), or (None, why): a module
    entrypoint of an installed package has nothing of the user's to freeze.

    A script: the git work tree holding it, else its folder. A module (``pkg.mod:fn``): where its
    top-level package is (under the CLI's folder, which the ranks search first, else where this
    interpreter finds it, an editable install's project included), then the git work tree
    holding that, else that folder."""
    shipped = _find_shipped(_shipped_start(entrypoint, cwd))[0]
    if shipped is not None:  # a project that `--remote submit` shipped here: exactly the files it sent
        return shipped, "shipped"
    if is_script(entrypoint):
        path = os.path.abspath(os.path.join(cwd, entrypoint))
        location = os.path.dirname(path)
    else:
        top_module = entrypoint.split(":")[0].split(".")[0]
        found = module_folder(top_module, cwd)
        if found is None:
            return None, f"{top_module} is an installed package"
        location = path = found
    top = _git_toplevel(location)
    return (top, "git") if top is not None and not _git_ignores(top, path) else (location, "folder")


def _git(root: str, *args: str) -> Optional[bytes]:
    try:
        out = subprocess.run(["git", "-C", root, *args], capture_output=True, timeout=GIT_TIMEOUT_S,
                             env={**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"})
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


SHIPPED_NAME = ".orchestrator-shipped.json"
#: Where ``remote_receive`` makes its checkouts, below ``$ORCHESTRATOR_HOME`` (``remote_home()/projects``):
#: the only folders whose SHIPPED_NAME counts.
CHECKOUTS = ("remote", "projects")


def _shipped_start(entrypoint: str, cwd: str) -> str:
    """The folder the search for a shipped checkout starts from: the script's, or the CLI's."""
    return os.path.dirname(os.path.abspath(os.path.join(cwd, entrypoint))) if is_script(entrypoint) else cwd


def stray_shipped_records(entrypoint: str, cwd: str) -> list[str]:
    """The SHIPPED_NAME files in the folders above the entrypoint that do not count (see
    ``_find_shipped``): each is worth a warning, never a refusal."""
    return _find_shipped(_shipped_start(entrypoint, cwd))[1]


def _find_shipped(start: str) -> tuple[Optional[str], list[str]]:
    """(the checkout holding ``start`` that ``remote_receive`` made, or None; the SHIPPED_NAME
    files met below it, or all the way up, that do not count).

    A SHIPPED_NAME file counts only where the tool writes it: at the root of a checkout, a folder
    of ``$ORCHESTRATOR_HOME/remote/projects``, a plain file of this user's (``_written_here``).
    One anywhere else (a copy in a parent folder, a file a job wrote, one another user left) is
    not a checkout's record: honouring it would make every project below it "exactly the shipped
    files" (those it lists), and so refuse every run there."""
    projects = _checkouts_folder()
    folder = os.path.realpath(start)
    strays: list[str] = []
    while True:
        marker = os.path.join(folder, SHIPPED_NAME)
        if os.path.lexists(marker):
            if _written_here(folder, projects):
                return folder, strays
            strays.append(marker)
        parent = os.path.dirname(folder)
        if parent == folder:
            return None, strays
        folder = parent


def _checkouts_folder() -> Optional[str]:
    """``$ORCHESTRATOR_HOME/remote/projects``, resolved (None: no home can be named here)."""
    from orchestrator.core.errors import OrchestratorError
    from orchestrator.core.records import home

    try:
        return os.path.realpath(os.path.join(home(), *CHECKOUTS))
    except OrchestratorError:
        return None


def _written_here(folder: str, projects: Optional[str]) -> bool:
    """``folder`` (resolved) is a checkout ``remote_receive`` made and its record is as the tool
    writes it: a plain file (never a link), owned by this user. Its content is checked when read
    (``read_shipped`` refuses a damaged record of a real checkout: submit again)."""
    if projects is None or os.path.dirname(folder) != projects:
        return False
    try:
        st = os.lstat(os.path.join(folder, SHIPPED_NAME))
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def read_shipped(root: str) -> dict:
    try:
        data = json.loads((Path(root) / SHIPPED_NAME).read_text(encoding="utf-8"))
        assert isinstance(data.get("files"), dict)
        return data
    except (OSError, ValueError, AssertionError) as exc:
        raise SnapshotError(f"cannot read {Path(root) / SHIPPED_NAME} (what a remote submission shipped): {exc}; "
                            "submit again from your machine") from None


def _git_toplevel(folder: str) -> Optional[str]:
    if not os.path.isdir(folder):
        return None
    out = _git(folder, "rev-parse", "--show-toplevel")
    return os.path.realpath(out.decode().strip()) if out else None


def _git_ignores(root: str, path: str) -> bool:
    """Git ignores ``path`` (a script in an ignored scratch folder of a larger repository: the
    project is then the script's own folder, not the repository that ignores it)."""
    return _git(root, "check-ignore", "-q", "--", path) is not None


def git_files(root: str, excluded: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """(tracked files, untracked files git does not ignore), never listing inside ``excluded``
    (relative folders: the runs folder, which git may not ignore and which grows with every run);
    a git submodule's own files under its folder."""
    skip = [f":(exclude,literal){rel}" for rel in excluded if rel and rel != "."]
    tracked_out = _git(root, "ls-files", "-z", "--cached", "--", ".", *skip)
    others_out = _git(root, "ls-files", "-z", "--others", "--exclude-standard", "--", ".", *skip)
    if tracked_out is None or others_out is None:
        raise SnapshotError(f"git could not list the files of {root}; check 'git -C {root} status', "
                            "or set code.snapshot: false")
    tracked, others = ({n for n in out.decode("utf-8", "surrogateescape").split("\0") if n} for out in (tracked_out, others_out))
    for name in sorted(tracked):
        folder = os.path.join(root, name)
        if os.path.isdir(folder) and not os.path.islink(folder) and os.path.exists(os.path.join(folder, ".git")):
            tracked.discard(name)  # a submodule (a gitlink): its files, not the link
            sub_tracked, sub_others = git_files(folder)
            tracked.update(f"{name}/{sub}" for sub in sub_tracked)
            others.update(f"{name}/{sub}" for sub in sub_others)
    return sorted(tracked), sorted(others - tracked)


def kept_link(target: str, rel: str, root: str) -> str:
    """A symlink's target as the tree keeps it: a relative one that leads out of the project is
    made absolute (in the tree it would lead somewhere else)."""
    if os.path.isabs(target):
        return target
    resolved = os.path.normpath(os.path.join(root, os.path.dirname(rel), target))
    return target if relative_inside(resolved, root) is not None else resolved


def git_state(root: str) -> tuple[Optional[str], str]:
    head = _git(root, "rev-parse", "--verify", "-q", "HEAD")
    if not head:
        return None, ""
    diff = _git(root, "diff", "HEAD", "--no-color", "--no-ext-diff")  # binary files: named, not inlined
    return head.decode().strip(), (diff or b"").decode("utf-8", "replace")


def _is_run_folder(folder: str) -> bool:
    run = RunFolder.of(folder)  # os.path.isfile, not Path.is_file: a folder closed to us is no run, not an error
    return os.path.isfile(run.record) and os.path.isfile(run.payload)


def link_why(full: str, root: str, excluded: list[str]) -> Optional[str]:
    """A symlink leading to a file or folder of the project is kept as a link (``lib -> realpkg``:
    ``import lib`` in the tree then finds the frozen package, not the live one); one leading out
    of it, or into the runs folder, is left out (the tree's live link finds the same target)."""
    target = os.path.realpath(full)
    inside = relative_inside(target, root) is not None and not any(relative_inside(target, x) is not None for x in excluded)
    return None if inside else LEFT_NOT_CODE


def is_environment(folder: str) -> bool:
    """A Python environment: a virtual environment (``pyvenv.cfg``) or a conda one (``conda-meta/``),
    whatever its name: installed packages, never the user's code."""
    return os.path.isfile(os.path.join(folder, "pyvenv.cfg")) or os.path.isdir(os.path.join(folder, "conda-meta"))


def enclosing_folder(root: str, rel: str, memo: dict[str, Optional[str]]) -> tuple[Optional[str], str]:
    """(why ``rel`` is never frozen, the folder that says so): it lies in a run folder (one of its
    folders holds record.json and payload.json) or in a Python environment (``is_environment``:
    a ``venv/`` that git does not ignore); (None, "") when neither. ``memo``: folder -> its answer."""
    parts = rel.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        folder = "/".join(parts[:i])
        if folder not in memo:
            full = os.path.join(root, folder)
            memo[folder] = LEFT_RUN if _is_run_folder(full) else LEFT_OUTPUT if is_environment(full) else None
        if memo[folder] is not None:
            return memo[folder], folder
    return None, ""


def walk_files(root: str, excluded: Iterable[str] = (), *, prune: bool = True,
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
            if full in skip or is_environment(full):
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


def ignore_patterns(path: Path) -> list[str]:
    """The ignore file's patterns, one a line: blank lines and ``#`` comments dropped, and each
    line's trailing blanks, as git drops them (``\\ `` keeps an escaped one). Leading blanks are
    dropped too: an indented line means what it would unindented (git would read them as part of
    the name, which no project means)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"cannot read the ignore file {path}: {exc}") from None
    out = []
    for line in lines:
        body = line.strip()
        if body.endswith("\\") and line.rstrip("\r\n").endswith(" ") and not body.endswith("\\\\"):
            body += " "  # 'name\\ ': the escaped blank is part of the name
        if body and not body.startswith("#"):
            out.append(body)
    return out


@dataclasses.dataclass(frozen=True)
class _Rule:
    """One gitignore line, parsed: whether it takes a path back (``!``), whether it names folders
    only (a trailing '/'), whether it is matched against the whole path (a '/' before its end)
    rather than against the last name, and its glob as a regular expression."""

    negated: bool
    folders_only: bool
    anchored: bool
    regex: re.Pattern[str]


def is_ignored(rel: str, patterns: list[str]) -> bool:
    """Whether ``rel`` (a file's posix path under the root) is ignored by ``patterns``, read as git
    reads a .gitignore at the root: for the file and for each folder above it, the *last* pattern
    that matches decides (``!pattern`` takes a path back in); and a file under an ignored folder is
    ignored whatever a later ``!`` says (git never looks inside an ignored folder, so it cannot take
    back a file there: ``build/`` then ``!build/keep.py`` leaves keep.py out, as ``build/*`` then
    ``!build/keep.py`` would not). The same reading as git's, so a line means what it means in
    .gitignore (tests/unit/test_ignore_rules.py compares with ``git check-ignore``)."""
    rules = [rule for rule in map(_rule, patterns) if rule is not None]
    if not rules:
        return False
    parts = rel.split("/")
    for depth in range(1, len(parts)):  # each folder above the file, from the root down
        if _last_verdict("/".join(parts[:depth]), parts[depth - 1], True, rules):
            return True
    return _last_verdict(rel, parts[-1], False, rules)


def _last_verdict(path: str, name: str, folder: bool, rules: list[_Rule]) -> bool:
    """The verdict of the last rule matching ``path`` itself (a folder when ``folder``): ignored
    unless that rule is a ``!``; not ignored when none matches."""
    for rule in reversed(rules):
        if rule.folders_only and not folder:
            continue
        if rule.regex.fullmatch(path if rule.anchored else name):
            return not rule.negated
    return False


@functools.lru_cache(maxsize=1024)
def _rule(pattern: str) -> Optional[_Rule]:
    """Parse one gitignore pattern (None: it matches nothing, e.g. '!' or '/' alone)."""
    negated = pattern.startswith("!")
    body = pattern[1:] if negated else pattern
    folders_only = body.endswith("/")
    body = body.rstrip("/")
    if not body:
        return None
    anchored = "/" in body  # a '/' at the start or in the middle: the whole path, from the root
    if not anchored:
        return _Rule(negated, folders_only, False, _glob(body))
    body = body[1:] if body.startswith("/") else body
    # git compares an anchored pattern's literal start first and globs the rest on its own, so a
    # '**' right after that start counts as the glob's beginning ('a**/b' matches 'a/x/b')
    literal = next((i for i, c in enumerate(body) if c in "*?[\\"), len(body))
    return _Rule(negated, folders_only, True, _glob(body, literal))


#: A regular expression that matches nothing: what git's wildmatch makes of a malformed glob
#: (an unclosed '[', a trailing '\\').
_NOTHING = re.compile(r"(?!)")


@functools.lru_cache(maxsize=1024)
def _glob(pattern: str, begins: int = 0) -> re.Pattern[str]:
    """A gitignore glob as git's wildmatch reads it (with paths): ``*`` and ``?`` never cross a
    '/'; ``**`` between slashes (or at an end) crosses folders (``**/x`` and ``a/**/x`` also match
    ``x`` and ``a/x``; ``a/**`` everything inside ``a``), anywhere else it is a ``*``; ``[...]`` a
    character class (``!`` or ``^`` negates it, never a '/'; POSIX names such as ``[:digit:]`` are
    not read); ``\\c`` the character c. ``begins``: where the glob begins for ``**`` (``_rule``)."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**", i):
            j = i
            while j < n and pattern[j] == "*":
                j += 1
            at_start, at_end = i in (0, begins) or pattern[i - 1] == "/", j == n or pattern[j] == "/"
            if at_start and at_end:
                if j < n:  # '**/': zero or more folders
                    out.append("(?:.*/)?")
                    j += 1
                else:
                    out.append(".*")
            else:
                out.append("[^/]*")
            i = j
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            parsed = _char_class(pattern, i)
            if parsed is None:
                return _NOTHING
            regex, i = parsed
            out.append(regex)
        elif c == "\\":
            if i + 1 == n:
                return _NOTHING
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out), re.S)


def _char_class(pattern: str, start: int) -> Optional[tuple[str, int]]:
    """The class opening at ``pattern[start]`` ('['), as a regular expression that never matches
    '/', and the index after its ']'; None when it is never closed (git then matches nothing)."""
    i, n = start + 1, len(pattern)
    negate = i < n and pattern[i] in "!^"
    i += 1 if negate else 0
    items: list[str] = []
    first = True
    while i < n and (pattern[i] != "]" or first):
        first = False
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            c = pattern[i + 1]
            i += 1
        if i + 2 < n and pattern[i + 1] == "-" and pattern[i + 2] != "]":
            high = pattern[i + 2]
            if high == "\\" and i + 3 < n:
                high = pattern[i + 3]
                i += 1
            # git tries a range's first character alone first: a reversed range matches that one
            items.append(f"{re.escape(c)}-{re.escape(high)}" if c <= high else re.escape(c))
            i += 3
        else:
            items.append(re.escape(c))
            i += 1
    if i >= n:
        return None
    body = "".join(items)
    if negate:
        return f"[^/{body}]", i + 1
    return (f"(?!/)[{body}]" if body else "(?!)"), i + 1
