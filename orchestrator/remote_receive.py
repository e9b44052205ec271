"""The login node's side of ``orchestrator --remote HOST submit`` (``orchestrator remote-receive``).

One SSH session, on its stdin and stdout (the human-readable output goes to stderr):

    client -> {"protocol", "version", "spec", "project", "legacy_project", "cwd", "files": {path: entry},
               "commit", "diff", "allow_runs_in_home", "plan"}\\n
    server -> {"missing": [sha256...]}\\n          the blobs this node has never received
    client -> "<sha256> <size>\\n" <bytes>  ...  "END\\n"
    server -> {"submitted": {"run", "jobs", "run_dir"}}\\n   or {"error": "..."}\\n
              (with "plan": {"planned": {"text", "warnings"}}\\n: plan's output here; nothing submitted)

Received files are kept once, by hash, in ``$ORCHESTRATOR_HOME/remote/blobs``. The project is a
checkout in ``remote/projects/<name>-<hash of the client id and path>/``: each submission makes its
files exactly the shipped ones (hard links to the blobs; files the previous shipment had and this
one lacks are removed, files the jobs wrote are left), records the manifest in
``.orchestrator-shipped.json`` (which ``snapshot`` then freezes as is, without hashing again),
and submits from the folder the user was in, so relative paths in the spec mean what they meant
on the laptop, and a relative ``runs_dir`` stays the same between submissions (runs resume).
The client id is kept in the laptop's config (``remote.client_id``); versions before it named the
checkout by the laptop's host name (``legacy_project``): a project with no checkout of its new
name adopts that one, once, recorded in ``remote/projects/.aliases/<project>`` (``checkout_name``).

The spec's paths are the cluster's: '~' in its path fields arrives as written and is expanded
here, for this node's user, when the spec is validated. A relative ``runs_dir`` (the default
``runs``) or ``checkpoint.dir`` would put runs and checkpoints in the checkout, and so under this
user's home when the orchestrator's home is there: refused unless ``allow_runs_in_home`` (the
laptop's ``remote.allow_runs_in_home``), naming ``$SCRATCH`` / ``$WORK`` where this node sets
them (``runs_in_home_problem``). After a submission the runs folder's store of code snapshots
is pruned (``snapshot_prune``): the trees of runs that may still run and of the last few stay.

Everything received is hostile input until checked: a damaged or older client, a tampered
stream or another program speaking the protocol must never make this node write outside its
checkout and blob store, nor run anything on it (a login node is shared). So the whole header is
checked before the first answer, and refused with one line (``{"error": ...}``, exit non-zero):

- the header: one JSON line of at most ``MAX_HEADER_BYTES``, only the fields above;
  ``files``: at most ``MAX_FILES`` entries, each ``[sha256, size, mode]`` (a file: mode ``0o644``
  or ``0o755``, ``0 <= size <= MAX_FILE_BYTES``, all of them together at most
  ``MAX_TOTAL_BYTES``) or ``[sha256 of the target, 0, "0o777", target]`` (a link);
- paths: relative, ``/``-separated, no empty, ``.`` or ``..`` part, no NUL, at most
  ``MAX_NAME_BYTES`` a part and ``MAX_PATH_BYTES`` in all; nothing beneath a shipped file or
  link; no file named as the checkout's own record (``.orchestrator-shipped.json``);
- links: a relative target that, followed through the shipped links as the kernel would, stays
  inside the project (an absolute target, or one that climbs out, would point elsewhere from
  the checkout than from the laptop's project);
- ``cwd``: ``.`` or a path inside the project through no shipped file or link;
- ``project`` (and ``legacy_project``, the same name but for its hash): letters, digits,
  ``_ . -``, not starting with ``.`` or ``-``, up to 120;
- ``allow_runs_in_home``: true or false; ``plan``: ``{"json": bool, "node": int | null,
  "rank": int | null}`` (one of node and rank, each from 0 to the largest world);
- the spec: ``executor: slurm`` only (this node queues jobs; it never runs them);
- the blob stream: ``<sha256> <size>\\n`` for a blob asked for, with the size the header gave,
  then exactly that many bytes; then ``END\\n``. ``snapshot.put_blob`` hashes each while writing
  it aside and renames it into place, so a refused or cut stream leaves no partial blob.

In the checkout, every folder is opened one by one, relative to its parent, with ``O_NOFOLLOW``,
and every file is made beside its place and renamed onto it: nothing is ever written through a
link, whether shipped, left there by a job, or swapped in meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import stat
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Mapping, Optional

from orchestrator.errors import OrchestratorError, UsageError
from orchestrator.snapshot import SHIPPED_NAME, put_blob

#: The header line's limit (a manifest of a million files fits).
MAX_HEADER_BYTES = 256 << 20
#: How many entries one submission may ship.
MAX_FILES = 1_000_000
#: One file's size, and all the shipped files' sizes together: code.max_mb's own upper bound
#: (100,000 MB, spec.py), the largest snapshot the client ever sends.
MAX_FILE_BYTES = 100_000 * 10**6
MAX_TOTAL_BYTES = MAX_FILE_BYTES
#: Linux's limits on a name and on a path.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4095
#: Links followed in a row before a target counts as a loop (the kernel's own limit).
MAX_LINK_HOPS = 40
#: Steps spent following all the shipped links (a tangle of links must not hold the node).
_LINK_WORK = 10_000_000
FILE_MODES = ("0o644", "0o755")
LINK_MODE = "0o777"
#: The checkout of a submission that ships nothing (an installed package's module).
NO_PROJECT = "_no-project"
_HEADER_KEYS = frozenset({"protocol", "version", "spec", "project", "legacy_project", "cwd", "files", "commit",
                          "diff", "allow_runs_in_home", "plan"})
_PLAN_KEYS = frozenset({"json", "node", "rank"})
#: Where the adoption of a host-named checkout is recorded (``checkout_name``): never a project's name.
ALIASES = ".aliases"
#: The site's variables naming large per-user storage, as a refused runs_dir suggests them.
SITE_STORAGE = ("SCRATCH", "WORK")
_SHA = re.compile(r"[0-9a-f]{64}")
_PROJECT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,119}")
_COMMIT = re.compile(r"[0-9a-f]{7,64}")
_BLOB_LINE = re.compile(rb"([0-9a-f]{64}) (-?[0-9]{1,20})\n")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: The start of the one line a bug (not the input) ends in; the tests look for it.
INTERNAL_ERROR = "the login node failed on this submission"


@dataclass(frozen=True)
class Shipped:
    """One checked entry of the manifest: a file's content hash, size and mode, or a link."""

    sha: str
    size: int
    mode: str
    link: Optional[str] = None


@dataclass(frozen=True)
class PlanRequest:
    """``plan --remote``: what ``orchestrator plan`` shows (the human view, one node or rank of
    it, or every rank as JSON)."""

    as_json: bool = False
    node: Optional[int] = None
    rank: Optional[int] = None


@dataclass(frozen=True)
class Submission:
    """The header, checked whole (see the module's doc)."""

    spec: dict
    files: dict[str, Shipped]
    project: Optional[str]
    cwd: str
    commit: Optional[str]
    diff: str
    legacy_project: Optional[str] = None
    allow_runs_in_home: bool = False
    plan: Optional[PlanRequest] = None

    def blob_sizes(self) -> dict[str, int]:
        """The content every shipped file needs, by hash, with its size."""
        return {e.sha: e.size for e in self.files.values() if e.link is None}


def remote_home() -> Path:
    from orchestrator.records import home

    return home() / "remote"


def serve(stdin: IO[bytes], stdout: IO[bytes]) -> int:
    """One submission, from its header to its answer (see the module's doc). Whatever goes
    wrong ends as one ``{"error": ...}`` line and a non-zero exit: the client prints it, and a
    traceback on the user's screen would tell them nothing they can act on."""
    def say(message: dict) -> None:
        stdout.write(json.dumps(message).encode() + b"\n")
        stdout.flush()

    def refuse(text: str) -> None:  # the client may be gone already: nothing more to tell it then
        with contextlib.suppress(OSError, ValueError):
            say({"error": text})

    try:
        submission = _header(stdin.readline(MAX_HEADER_BYTES + 1))
        base = remote_home()
        blobs = base / "blobs"
        checkout = base / "projects" / checkout_name(base / "projects", submission)
        home_problem = None if submission.allow_runs_in_home else runs_in_home_problem(
            submission.spec, checkout.joinpath(*submission.cwd.split("/")), _login_home(), os.environ)
        if home_problem is not None and submission.plan is None:  # before a byte is received or written
            raise UsageError(home_problem)
        missing = {sha: size for sha, size in sorted(submission.blob_sizes().items())
                   if not (blobs / sha[:2] / sha).is_file()}
        say({"missing": list(missing)})
        _receive_blobs(stdin, blobs, missing)
        with contextlib.redirect_stdout(sys.stderr):  # the CLI's own lines are for the user, not the protocol
            if submission.plan is not None:
                planned = _plan(submission, checkout, blobs, submission.plan)  # plan's own output captured
            else:
                run = _submit(submission, checkout, blobs)
        if submission.plan is not None:
            say({"planned": {"text": planned, "warnings": [home_problem] if home_problem else []}})
        else:
            say({"submitted": run})
        return 0
    except OrchestratorError as exc:
        refuse(str(exc))
        return exc.exit_code
    except OSError as exc:
        refuse(f"on the login node: {exc}")
        return 1
    except Exception as exc:  # a bug, not the input: still one line for the client, never a traceback
        refuse(f"{INTERNAL_ERROR} ({type(exc).__name__}: {_shown(str(exc))}); please report this line")
        return 1


# ---- the header ----------------------------------------------------------------------------------
def _header(line: bytes) -> Submission:
    """The submission's first line, checked whole before anything is written or answered."""
    from orchestrator.remote import PROTOCOL

    if len(line) > MAX_HEADER_BYTES:
        raise UsageError(f"the submission's header is over {MAX_HEADER_BYTES >> 20} MiB: ship fewer files (list data "
                         "and outputs in the ignore file or code.exclude)")
    header = _json(line)
    protocol = header.get("protocol") if isinstance(header, dict) else None
    if not isinstance(header, dict) or isinstance(protocol, bool) or protocol != PROTOCOL:
        raise UsageError(f"this login node speaks protocol {PROTOCOL}; install the same orchestrator version on both")
    unknown = sorted(set(header) - _HEADER_KEYS)
    if unknown:
        raise UsageError(f"the submission's header has unknown field(s) {_shown(', '.join(unknown))}: install the "
                         "same orchestrator version on both")
    files = file_entries(header.get("files"))
    _check_links(files)
    project = _checked_project(header.get("project"), files)
    return Submission(spec=_checked_spec(header.get("spec")), files=files, project=project,
                      cwd=_checked_cwd(header.get("cwd", "."), files),
                      commit=_checked_commit(header.get("commit")), diff=_checked_text(header.get("diff"), "diff"),
                      legacy_project=_checked_legacy(header.get("legacy_project"), project),
                      allow_runs_in_home=_checked_flag(header.get("allow_runs_in_home", False), "allow_runs_in_home"),
                      plan=_checked_plan(header.get("plan")))


def _json(line: bytes) -> Any:
    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON value")

    try:
        return json.loads(line, parse_constant=no_constant)
    except (ValueError, RecursionError):  # RecursionError: arrays nested beyond the parser's depth
        raise UsageError("the submission's header is not JSON: update the orchestrator on your machine") from None


def _shown(value: Any, limit: int = 120) -> str:
    """A received value as the error line shows it: quoted, escaped, cut short (it may hold anything)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def file_entries(files: Any) -> dict[str, Shipped]:
    """The manifest's entries, each checked (``_path_problem``, ``_entry``), and checked together:
    one size per content, a bounded total, nothing beneath a shipped file or link."""
    if not isinstance(files, dict):
        raise UsageError("the submission's header lacks its files: update the orchestrator on your machine")
    if len(files) > MAX_FILES:
        raise UsageError(f"the submission ships {len(files)} files, over the limit of {MAX_FILES}: list data and "
                         "outputs in the ignore file or code.exclude")
    entries: dict[str, Shipped] = {}
    sizes: dict[str, int] = {}
    for rel, item in files.items():
        problem = _path_problem(rel)
        if problem is not None:
            raise UsageError(f"refusing the shipped path {_shown(rel)}: {problem}; paths must be relative and stay "
                             "inside the project")
        entry = _entry(rel, item)
        if entry.link is None and sizes.setdefault(entry.sha, entry.size) != entry.size:
            raise UsageError(f"the shipped entry for {_shown(rel)} is malformed: its content has another size in "
                             "another entry; submit again")
        entries[rel] = entry
    if sum(sizes.values()) > MAX_TOTAL_BYTES:
        raise UsageError(f"the submission ships over {MAX_TOTAL_BYTES} bytes: list data and outputs in the ignore "
                         "file or code.exclude")
    _check_tree(entries)
    return entries


def _path_problem(rel: Any) -> Optional[str]:
    """Why ``rel`` cannot name a place inside the checkout (None: it can)."""
    if not isinstance(rel, str) or not rel:
        return "it is empty" if rel == "" else "it is not text"
    if "\0" in rel:
        return "it holds a NUL character"
    if rel.startswith("/"):
        return "it is absolute"
    try:
        raw = os.fsencode(rel)
    except UnicodeError:
        return "it is not a name this system can hold"
    if len(raw) > MAX_PATH_BYTES:
        return f"it is over {MAX_PATH_BYTES} bytes"
    for part in rel.split("/"):
        if part in ("", ".", ".."):
            return "it has an empty, '.' or '..' part"
        if len(os.fsencode(part)) > MAX_NAME_BYTES:
            return f"a part of it is over {MAX_NAME_BYTES} bytes"
    return None


def _entry(rel: str, item: Any) -> Shipped:
    """One manifest entry, as ``snapshot.Entry.to_json`` writes it, with every field checked."""
    bad = f"the shipped entry for {_shown(rel)} is malformed"
    if not isinstance(item, list) or len(item) not in (3, 4):
        raise UsageError(f"{bad} (expected [sha256, size, mode] or [sha256, 0, '0o777', target]): update the "
                         "orchestrator on your machine")
    sha, size, mode = item[:3]
    link = item[3] if len(item) == 4 else None
    if not isinstance(sha, str) or not _SHA.fullmatch(sha):
        raise UsageError(f"{bad}: its hash {_shown(sha)} is not 64 lowercase hex digits; submit again")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_FILE_BYTES:
        raise UsageError(f"{bad}: its size {_shown(size)} is not a whole number of bytes from 0 to {MAX_FILE_BYTES}")
    if link is None:
        if mode not in FILE_MODES:
            raise UsageError(f"{bad}: its mode {_shown(mode)} is not one of {', '.join(FILE_MODES)}")
        return Shipped(sha=sha, size=size, mode=mode)
    if mode != LINK_MODE or size != 0:
        raise UsageError(f"{bad}: a link has mode {LINK_MODE} and size 0")
    if not isinstance(link, str) or not link or "\0" in link:
        raise UsageError(f"{bad}: its link target {_shown(link)} is not a non-empty text without NUL")
    try:
        raw = os.fsencode(link)
    except UnicodeError:
        raise UsageError(f"{bad}: its link target {_shown(link)} is not a name this system can hold") from None
    if len(raw) > MAX_PATH_BYTES or hashlib.sha256(raw).hexdigest() != sha:
        raise UsageError(f"{bad}: its link target is over {MAX_PATH_BYTES} bytes, or not what its hash says")
    return Shipped(sha=sha, size=0, mode=mode, link=link)


def _check_tree(entries: Mapping[str, Shipped]) -> None:
    """Nothing is shipped beneath a shipped file (it cannot be a folder too) or link (it would be
    written through the link), and no file takes the name of the checkout's own record, at its
    root or below (``snapshot`` trusts the nearest one above the folder it runs in)."""
    for rel in entries:
        parts = rel.split("/")
        if parts[-1] == SHIPPED_NAME:
            raise UsageError(f"refusing the shipped path {_shown(rel)}: the login node keeps its own record of what "
                             "was shipped under that name; rename that file, or list it in the ignore file")
        for depth in range(1, len(parts)):
            above = "/".join(parts[:depth])
            holder = entries.get(above)
            if holder is not None:
                kind = "link" if holder.link is not None else "file"
                raise UsageError(f"refusing the shipped path {_shown(rel)}: {_shown(above)} is shipped as a {kind}, "
                                 "and nothing is written beneath one; ship one or the other")


def _check_links(entries: Mapping[str, Shipped]) -> None:
    """Every shipped link stays inside the project, followed as the kernel follows it."""
    links = {rel: e.link for rel, e in entries.items() if e.link is not None}
    budget = [_LINK_WORK]
    for rel, target in sorted(links.items()):
        if not _stays_inside(rel, links, budget):
            raise UsageError(f"refusing the shipped link {_shown(rel)} -> {_shown(target)}: it leads out of the "
                             "project, and the login node's checkout is not where your project is; make it a "
                             "relative link that stays inside the project, or leave it out of the snapshot (the "
                             "ignore file or code.exclude) and use the path on the cluster itself")


def _stays_inside(rel: str, links: Mapping[str, str], budget: list[int]) -> bool:
    """Whether the link ``rel`` resolves inside the project: its target walked part by part from
    the link's folder, each shipped link met on the way replaced by its own target (so a link
    to ``..`` followed by ``..`` is seen to climb two folders, not zero). A loop leads nowhere,
    so it does not lead out."""
    here = rel.split("/")[:-1]
    pending = list(reversed(links[rel].split("/")))
    if links[rel].startswith("/"):
        return False
    hops = 0
    while pending:
        budget[0] -= 1
        if budget[0] < 0:
            raise UsageError("the shipped links are too many or too tangled to check: ship fewer links")
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if not here:
                return False
            here.pop()
            continue
        here.append(part)
        target = links.get("/".join(here))
        if target is None:
            continue
        hops += 1
        if hops > MAX_LINK_HOPS:
            return True
        if target.startswith("/"):
            return False
        here.pop()
        pending.extend(reversed(target.split("/")))
    return True


def _checked_cwd(cwd: Any, entries: Mapping[str, Shipped]) -> str:
    """The folder the user submitted from: ``.`` or a folder inside the project (never through
    a shipped file or link: the jobs would start elsewhere than they did on the laptop)."""
    if cwd == ".":
        return cwd
    problem = _path_problem(cwd)
    if problem is None and not entries:
        problem = "nothing was shipped, so the only folder there is '.'"
    if problem is not None:
        raise UsageError(f"refusing the folder you submitted from, {_shown(cwd)}: {problem}; submit from inside "
                         "the project")
    parts = cwd.split("/")
    for depth in range(1, len(parts) + 1):
        above = "/".join(parts[:depth])
        holder = entries.get(above)
        if holder is not None:
            kind = "link" if holder.link is not None else "file"
            raise UsageError(f"refusing the folder you submitted from, {_shown(cwd)}: it passes through "
                             f"{_shown(above)}, a shipped {kind}; submit from a folder of the project itself")
    return cwd


def _checked_project(project: Any, entries: Mapping[str, Shipped]) -> Optional[str]:
    """The checkout's name: one plain folder name in ``remote/projects`` (never ``.``, ``..``,
    a hidden name that could be a lock file, or the shared checkout of nothing)."""
    if project is None and not entries:
        return None
    if not isinstance(project, str) or not _PROJECT.fullmatch(project) or project == NO_PROJECT:
        raise UsageError(f"the submission names no valid project ({_shown(project)}; letters, digits, '_', '.', '-', "
                         "not starting with '.' or '-', up to 120): update the orchestrator on your machine")
    return project


def _checked_legacy(legacy: Any, project: Optional[str]) -> Optional[str]:
    """The name an older client gave this project's checkout (its host name's hash): a plain name
    as ``project`` is, differing from it only in the hash, so a checkout it adopts is this
    project's (never a folder outside ``remote/projects``, nor another project's)."""
    if legacy is None:
        return None
    if project is None or not isinstance(legacy, str) or not _PROJECT.fullmatch(legacy) or legacy == NO_PROJECT \
            or legacy.rpartition("-")[0] != project.rpartition("-")[0]:
        raise UsageError(f"the submission's older checkout name {_shown(legacy)} is not its project's name with "
                         "another hash: update the orchestrator on your machine")
    return legacy


def _checked_flag(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    raise UsageError(f"the submission's {name} is {_shown(value)}, not true or false: update the orchestrator on "
                     "your machine")


def _checked_plan(plan: Any) -> Optional[PlanRequest]:
    """``plan --remote``'s options: a mapping of ``json`` (true/false) and one of ``node`` and
    ``rank`` (a whole number from 0 to the largest world), or nothing (a submission)."""
    if plan is None:
        return None
    from orchestrator.validators import MAX_WORLD

    bad = "update the orchestrator on your machine"
    if not isinstance(plan, dict) or set(plan) - _PLAN_KEYS:
        raise UsageError(f"the submission's plan options {_shown(plan)} are not json, node and rank: {bad}")
    as_json = _checked_flag(plan.get("json", False), "plan option json")
    picked = {}
    for key in ("node", "rank"):
        value = plan.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_WORLD):
            raise UsageError(f"plan --{key} {_shown(value)}: give a whole number from 0 to {MAX_WORLD - 1}")
        picked[key] = value
    if picked["node"] is not None and picked["rank"] is not None:
        raise UsageError(f"plan takes one of --node and --rank, not both: {bad}")
    return PlanRequest(as_json=as_json, node=picked["node"], rank=picked["rank"])


def _checked_spec(spec: Any) -> dict:
    """The spec, as a mapping whose executor is SLURM: a login node is shared, so it only queues
    jobs (executor local or debug would run the user's code on the login node itself)."""
    if not isinstance(spec, dict):
        raise UsageError("the submission's header lacks its spec: update the orchestrator on your machine")
    executor = spec.get("executor")
    if executor != "slurm":
        named = "the default (local)" if executor is None else _shown(executor)
        raise UsageError(f"refusing to run this spec on the login node: its executor is {named}, and a remote "
                         "submission only queues jobs on SLURM (nothing runs on a shared login node); set "
                         "executor: slurm, or run it on your machine without --remote")
    return spec


def _checked_commit(commit: Any) -> Optional[str]:
    """The laptop's git commit, or None: recorded in the checkout and shown by ``diff``, so only a commit id."""
    if commit is None or (isinstance(commit, str) and _COMMIT.fullmatch(commit)):
        return commit
    raise UsageError(f"the submission's commit {_shown(commit)} is not a git commit id: update the orchestrator on "
                     "your machine")


def _checked_text(value: Any, name: str) -> str:
    """A free-text field (the uncommitted diff): text or nothing, never another JSON type."""
    if value is None or isinstance(value, str):
        return value or ""
    raise UsageError(f"the submission's {name} is not text: update the orchestrator on your machine")


# ---- the blobs -----------------------------------------------------------------------------------
def _receive_blobs(stdin: IO[bytes], blobs: Path, wanted: Mapping[str, int]) -> None:
    """Each blob asked for, once, with the size the header gave it; then ``END``."""
    left = dict(wanted)
    while True:
        line = stdin.readline(128)
        if line in (b"END\n", b""):
            if left:
                raise UsageError(f"the submission ended with {len(left)} file(s) still missing; submit again")
            return
        match = _BLOB_LINE.fullmatch(line)
        if match is None:
            raise UsageError(f"malformed blob header {line[:80]!r} (expected '<sha256> <size>'): update the "
                             "orchestrator on your machine")
        sha, size = match[1].decode(), int(match[2])
        if not 0 <= size <= MAX_FILE_BYTES:
            raise UsageError(f"the file {sha} arrived announced as {size} bytes, not a size from 0 to "
                             f"{MAX_FILE_BYTES}: update the orchestrator on your machine")
        if sha not in left:
            raise UsageError(f"received {sha}, which was not asked for (or was sent twice): update the orchestrator "
                             "on your machine")
        if size != left[sha]:
            raise UsageError(f"the file {sha} arrived announced as {size} bytes, and the header gave it {left[sha]}: "
                             "submit again")
        put_blob(blobs / sha[:2] / sha, sha, _framed(stdin, size),
                 UsageError(f"a file arrived damaged (its hash is not {sha}); submit again"))
        del left[sha]


def _framed(stdin: IO[bytes], size: int) -> Iterator[bytes]:
    """The next ``size`` bytes of the stream, in chunks; a stream that ends first is an error."""
    left = size
    while left:
        chunk = stdin.read(min(left, 1 << 20))
        if not chunk:
            raise UsageError("the connection closed in the middle of a file; submit again")
        left -= len(chunk)
        yield chunk


# ---- the checkout's name -------------------------------------------------------------------------
def checkout_name(projects: Path, submission: Submission) -> str:
    """The checkout this submission uses (only read here; ``_adopt`` records a choice):

    - the one its project adopted earlier (``.aliases/<project>`` names it), while it exists;
    - else its project's own, when it exists;
    - else the checkout an older client made of this project under its host-name key
      (``legacy_project``), when that exists: runs under a relative runs_dir there resume;
    - else its own, made now.
    A submission that ships nothing uses the shared ``NO_PROJECT`` checkout."""
    if not submission.files or not submission.project:
        return NO_PROJECT
    project = submission.project
    adopted = _read_alias(projects, project)
    if adopted is not None and _is_folder(projects / adopted):
        return adopted
    if os.path.lexists(projects / project):
        return project
    legacy = submission.legacy_project
    if legacy is not None and _is_folder(projects / legacy):
        return legacy
    return project


def _is_folder(path: Path) -> bool:
    """A real folder (a link is never taken for a checkout: ``_open_checkout`` refuses it)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _read_alias(projects: Path, project: str) -> Optional[str]:
    """The checkout ``project`` adopted (None: none, or a record that names no plain checkout)."""
    try:
        fd = os.open(projects / ALIASES / project, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            name = f.read(256).decode("ascii", "replace").strip()
    except OSError:
        return None
    return name if _PROJECT.fullmatch(name) and name != NO_PROJECT else None


def _adopt(projects: Path, project: str, checkout: str) -> None:
    """Record that ``project`` uses the older checkout ``checkout`` from now on (a file replaced
    whole, in a folder opened without following links), so a later submission finds it again
    even after the host name, and so the older name, changed."""
    if checkout == project or _read_alias(projects, project) == checkout:
        return
    parent = os.open(projects, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            folder = _open_child(parent, ALIASES, create=True)
        except _Blocked:
            raise UsageError(f"{projects / ALIASES} is not a folder: move it aside there, then submit again") from None
        assert folder is not None
        try:
            def make(tmp: str) -> None:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                             dir_fd=folder)
                with os.fdopen(fd, "w", encoding="ascii") as out:
                    out.write(checkout + "\n")

            _replace_at(folder, project, make)
        finally:
            os.close(folder)
    finally:
        os.close(parent)
    print(f"[orchestrator] {project}: using the checkout {checkout} that an older version made of this project "
          "(named by your machine's host name then); later submissions keep using it", file=sys.stderr, flush=True)


# ---- where runs land ---------------------------------------------------------------------------------
def _login_home() -> str:
    return os.path.expanduser("~")


def runs_in_home_problem(spec: Mapping[str, Any], cwd: Path, home: str, env: Mapping[str, str]) -> Optional[str]:
    """Why this submission's runs or checkpoints would land under the login user's ``home``
    without the user asking for it (None: they would not).

    A relative ``runs_dir`` (the default ``runs`` too) or ``checkpoint.dir`` is read from the
    folder the user submitted from, in the checkout (``cwd``), which lives under the home unless
    ``ORCHESTRATOR_HOME`` moved it; homes have small quotas on most clusters, and a full one
    ends the job's checkpoints. Written on purpose: an absolute path, or '~' (kept as written
    from the laptop), is the user's choice and never refused. ``spec`` is the received mapping
    (values of another type are left to the spec's validation); ``env`` gives ``$SCRATCH`` and
    ``$WORK`` for the suggestion."""
    home_real = os.path.realpath(home)
    checkpoint = spec.get("checkpoint")
    fields = [("runs_dir", spec.get("runs_dir", "runs"), "runs and their checkpoints", "orchestrator-runs"),
              ("checkpoint.dir", checkpoint.get("dir") if isinstance(checkpoint, dict) else None, "checkpoints",
               "checkpoints")]
    for field, value, what, leaf in fields:
        if not isinstance(value, str) or not value.strip() or value.startswith(("/", "~")):
            continue
        landing = os.path.normpath(os.path.join(cwd, value))
        real = os.path.realpath(landing)
        if real != home_real and not real.startswith(home_real.rstrip("/") + "/"):
            continue
        return (f"{field}: {_shown(value)} is relative, so {what} would be written under your home on the login "
                f"node ({landing}), whose quota is small on most clusters; {_storage_hint(field, leaf, env)}; or "
                f"keep them in your home on purpose: {field}: ~/{value.strip('/')}, or remote.allow_runs_in_home: "
                "true in the orchestrator config on your machine")
    return None


def _storage_hint(field: str, leaf: str, env: Mapping[str, str]) -> str:
    """The fix with the site's own storage: ``$SCRATCH`` or ``$WORK`` as this node sets them."""
    found = [(name, env[name]) for name in SITE_STORAGE
             if isinstance(env.get(name), str) and os.path.isabs(env[name]) and "\n" not in env[name]]
    if not found:
        return (f"give {field} an absolute path on the cluster's scratch or work filesystem (this login node sets "
                "neither $SCRATCH nor $WORK: ask your site which one is for job output)")
    shown = ", ".join(f"${name} is {value}" for name, value in found)
    return (f"give {field} an absolute path on the cluster's shared storage ({shown} here), e.g. "
            f"--set {field}={found[0][1].rstrip('/')}/{leaf}")


# ---- the submission ------------------------------------------------------------------------------
def _submit(submission: Submission, checkout: Path, blobs: Path) -> dict:
    """Make the checkout what was shipped, enter the folder the user was in, submit from there,
    then prune the runs folder's snapshot store (never failing the submission for it)."""
    from orchestrator.api import submit
    from orchestrator.snapshot_prune import store_lock

    with _entered_checkout(submission, checkout, blobs) as spec:
        store = _store_of(spec)
        with store_lock(store, exclusive=False):  # a prune waits until this run's snapshot is recorded
            handle = submit(spec, executor="slurm", on_plan=_say_plan)
        _prune(store)
        return {"run": handle.id, "jobs": list(handle.job_ids), "run_dir": str(handle.run_dir)}


def _plan(submission: Submission, checkout: Path, blobs: Path, request: PlanRequest) -> str:
    """``plan --remote``: the checkout updated as for a submission, then ``plan``'s output as
    this node makes it (its interpreter, its paths), captured for the client; nothing submitted."""
    from orchestrator.api import plan_for
    from orchestrator.operations import show_plan

    with _entered_checkout(submission, checkout, blobs) as spec:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            show_plan(plan_for(spec, "slurm"), as_json=request.as_json, node=request.node, rank=request.rank)
        return out.getvalue()


@contextlib.contextmanager
def _entered_checkout(submission: Submission, checkout: Path, blobs: Path) -> Iterator[Any]:
    """The checkout made exactly the shipped files, under its lock (two submissions of one
    project update it in turn), this process in the folder the user was in, and the spec
    validated there ('~' expanded for this node's user): the JobSpec."""
    from orchestrator.loading import spec_from_dict

    projects = checkout.parent
    projects.mkdir(parents=True, exist_ok=True)
    lock = _lock(projects / f".{checkout.name}.lock") if submission.files else None
    try:
        if submission.files:
            if submission.project is not None and checkout.name != submission.project:
                _adopt(projects, submission.project, checkout.name)
            update_checkout(checkout, submission.files, blobs, submission.commit, submission.diff)
        _enter(checkout, submission.cwd)
        spec = spec_from_dict(dict(submission.spec))
        if spec.executor != "slurm":  # checked in the header already; this is the last door before a run
            raise UsageError(f"refusing to run a spec with executor {spec.executor} on the login node")
        yield spec
    finally:
        if lock is not None:
            os.close(lock)


def _store_of(spec: Any) -> Path:
    """The runs folder's store of code snapshots, as ``snapshot.scan_project`` places it."""
    from orchestrator.snapshot import STORE_NAME

    return Path(os.path.abspath(os.path.expanduser(spec.runs_dir))) / STORE_NAME


def _prune(store: Path) -> None:
    """Prune the store after a submission (``snapshot_prune``); a failure there is one line on
    stderr, never the submission's failure."""
    from orchestrator.snapshot_prune import prune

    try:
        report = prune(store)
    except (OrchestratorError, OSError) as exc:
        print(f"[orchestrator] old code snapshots in {store} were not pruned: {exc}", file=sys.stderr, flush=True)
        return
    if report is not None and (report.removed or report.skipped):
        print(report.line(), file=sys.stderr, flush=True)


def _lock(path: Path) -> int:
    """An exclusive lock on ``path`` (made if missing, never through a link, never truncated)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _enter(checkout: Path, cwd: str) -> None:
    """Make ``cwd`` in the checkout (never through a link) and change into it."""
    root = _open_checkout(checkout)
    folders = _Folders(root)
    try:
        try:
            where = folders.at([] if cwd == "." else cwd.split("/"), create=True)
        except _Blocked as blocked:
            raise UsageError(f"refusing the folder you submitted from, {_shown(cwd)}: "
                             f"{blocked.describe(checkout)}") from None
        assert where is not None
        os.fchdir(where)
    finally:
        folders.close()
        os.close(root)


def _say_plan(launch: Any) -> None:
    from orchestrator.identity import plan_lines

    for line in plan_lines(launch):
        print(line, file=sys.stderr, flush=True)


# ---- the checkout --------------------------------------------------------------------------------
class _Blocked(Exception):
    """A path's folder that cannot be entered: a link (never followed) or a file."""

    def __init__(self, where: str, kind: str) -> None:
        super().__init__(where)
        self.where, self.kind = where, kind

    def describe(self, checkout: Path) -> str:
        if self.kind == "link":
            return (f"{self.where} in the login node's checkout {checkout} is a link, and nothing is written through "
                    "one (a link leading out of the checkout would write outside it); remove that link there, or "
                    "stop shipping files beneath it")
        return (f"{self.where} is a file in the login node's checkout {checkout}, where a folder is needed; move it "
                "aside there, then submit again")


def _lstat_at(folder: int, name: str) -> Optional[os.stat_result]:
    try:
        return os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _open_child(folder: int, name: str, create: bool) -> Optional[int]:
    """The folder ``name`` in ``folder``, opened without following a link (made first when
    missing and ``create``; None when missing otherwise). Raises _Blocked on a link or a file."""
    for _ in range(3):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=folder)
        except FileNotFoundError:
            if not create:
                return None
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o777, dir_fd=folder)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            st = _lstat_at(folder, name)
            raise _Blocked(name, "link" if st is not None and stat.S_ISLNK(st.st_mode) else "file") from None
    raise FileNotFoundError(errno.ENOENT, "made and removed again meanwhile", name)


class _Folders:
    """The open folders along the path being written, from the checkout down: each one opened
    relative to the one above with O_NOFOLLOW, so a link there (however it got there) is
    refused, never followed. Only one path's folders are open at a time (sorted paths share them)."""

    def __init__(self, root: int) -> None:
        self.names: list[str] = []
        self.fds: list[int] = [root]

    def at(self, parts: list[str], create: bool) -> Optional[int]:
        """The folder ``parts`` below the checkout (None: missing, and not ``create``)."""
        common = 0
        while common < min(len(self.names), len(parts)) and self.names[common] == parts[common]:
            common += 1
        while len(self.names) > common:
            self.names.pop()
            os.close(self.fds.pop())
        for depth in range(common, len(parts)):
            try:
                fd = _open_child(self.fds[-1], parts[depth], create)
            except _Blocked as blocked:
                raise _Blocked("/".join(parts[:depth + 1]), blocked.kind) from None
            if fd is None:
                return None
            self.names.append(parts[depth])
            self.fds.append(fd)
        return self.fds[-1]

    def close(self) -> None:
        while self.names:
            self.names.pop()
            os.close(self.fds.pop())


def _open_checkout(checkout: Path) -> int:
    """The checkout folder itself, made when missing, never a link."""
    checkout.parent.mkdir(parents=True, exist_ok=True)
    parent = os.open(checkout.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = _open_child(parent, checkout.name, create=True)
    except _Blocked as blocked:
        raise UsageError(f"the login node's checkout {checkout} is a {blocked.kind}, not a folder, and nothing is "
                         "written through one: move it aside there, then submit again") from None
    finally:
        os.close(parent)
    assert fd is not None
    return fd


def update_checkout(checkout: Path, files: Mapping[str, Any], blobs: Path, commit: Any, diff: str) -> None:
    """Make the checkout's files exactly the shipped ones (see the module's doc). ``files``: the
    header's entries (checked again here: this is the function that writes), or checked ones."""
    entries = files if all(isinstance(e, Shipped) for e in files.values()) else file_entries(dict(files))
    root = _open_checkout(checkout)
    folders = _Folders(root)
    try:
        before = _previously_shipped(root)
        recorded: dict[str, list] = {}
        for rel, entry in sorted(entries.items()):
            *parents, name = rel.split("/")
            try:
                folder = folders.at(parents, create=True)
            except _Blocked as blocked:
                raise UsageError(f"refusing to write {rel}: {blocked.describe(checkout)}") from None
            assert folder is not None
            inode = _place(folder, name, entry, blobs, checkout / rel)
            recorded[rel] = [entry.sha, entry.size, entry.mode, entry.link, inode]
        for rel in sorted(before - set(entries)):  # what the last shipment had and this one lacks (never a folder)
            _remove_stale(folders, rel)
        _write_record(root, {"files": recorded, "commit": commit, "diff": diff})
    finally:
        folders.close()
        os.close(root)


def _previously_shipped(root: int) -> set[str]:
    """The paths the last shipment recorded (its record lies in a folder jobs write to: only
    paths that could have been shipped count)."""
    try:
        fd = os.open(SHIPPED_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=root)
    except OSError:
        return set()
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return set()
            files = json.loads(f.read()).get("files")
    except (OSError, ValueError, AttributeError, RecursionError):
        return set()
    return {rel for rel in files if _path_problem(rel) is None} if isinstance(files, dict) else set()


def _place(folder: int, name: str, entry: Shipped, blobs: Path, shown: Path) -> int:
    """Put one shipped file or link at ``name`` in ``folder`` unless it is there already; its inode."""
    st = _lstat_at(folder, name)
    if st is not None and stat.S_ISDIR(st.st_mode):  # it holds what jobs wrote (or a run folder): never removed
        raise UsageError(f"{shown} is a folder in the login node's checkout, and a file or link in what you "
                         "shipped; move that folder aside there (it may hold runs or outputs), then submit again")
    if entry.link is not None:
        link = entry.link
        if not (st is not None and stat.S_ISLNK(st.st_mode) and os.readlink(name, dir_fd=folder) == link):
            _replace_at(folder, name, lambda tmp: os.symlink(link, tmp, dir_fd=folder))
    else:
        blob = blobs / entry.sha[:2] / entry.sha
        executable = entry.mode == "0o755"
        if st is None or st.st_ino != os.stat(blob).st_ino or executable:
            _replace_at(folder, name, lambda tmp: _link_or_copy(blob, folder, tmp, executable))
    return os.stat(name, dir_fd=folder, follow_symlinks=False).st_ino


def _replace_at(folder: int, name: str, make: Callable[[str], None]) -> None:
    """Make a new file or link beside ``name`` (``make(temporary name)``) and rename it onto
    ``name``: a file or link there is replaced whole, and nothing is written through it."""
    for _ in range(16):
        tmp = f".orch-tmp-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            make(tmp)
            break
        except FileExistsError:
            continue
        except BaseException:
            _unlink_quietly(folder, tmp)
            raise
    else:
        raise FileExistsError(errno.EEXIST, "no free temporary name beside it", name)
    try:
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        _unlink_quietly(folder, tmp)
        raise


def _unlink_quietly(folder: int, name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=folder)


def _link_or_copy(blob: Path, folder: int, tmp: str, executable: bool) -> None:
    """A hard link to the blob, or (another filesystem, an executable's own mode) a read-only copy."""
    if not executable:
        try:
            os.link(blob, tmp, dst_dir_fd=folder)
            return
        except FileExistsError:
            raise
        except OSError:
            pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
    with os.fdopen(fd, "wb") as out, open(blob, "rb") as source:
        shutil.copyfileobj(source, out, 1 << 20)
        os.fchmod(out.fileno(), 0o555 if executable else 0o444)


def _remove_stale(folders: _Folders, rel: str) -> None:
    """Remove a file or link the last shipment made and this one lacks; a folder, a missing one,
    or one beneath a link or a file is left alone."""
    *parents, name = rel.split("/")
    try:
        folder = folders.at(parents, create=False)
    except _Blocked:
        return
    if folder is None:
        return
    st = _lstat_at(folder, name)
    if st is not None and (stat.S_ISLNK(st.st_mode) or stat.S_ISREG(st.st_mode)):
        _unlink_quietly(folder, name)


def _write_record(root: int, data: dict) -> None:
    """The checkout's record of this shipment (``SHIPPED_NAME``), replaced whole."""
    def make(tmp: str) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=root)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=2, default=str)
            out.flush()
            os.fsync(out.fileno())

    _replace_at(root, SHIPPED_NAME, make)


def send_files(run_ref: str, what: str, stdout: IO[bytes]) -> int:
    """``orchestrator remote-files RUN report``: the run's report PNGs as a tar stream."""
    from orchestrator.api import Run

    if what != "report":
        raise UsageError(f"remote-files can send: report (not {what!r})")
    run = Run.get(run_ref)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:") as tar:
        for png in sorted((run.run_dir / "report").glob("*.png")):
            tar.add(png, arcname=png.name)
    stdout.write(buffer.getvalue())
    stdout.flush()
    return 0
