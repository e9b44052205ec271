"""The ``--remote`` protocol as the login node reads it (``remote_receive`` serves it): the
header line and the blob stream, checked whole before anything is written or answered.

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
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator, Mapping, Optional

from orchestrator.core.errors import UsageError
from orchestrator.code.snapshot_files import SHIPPED_NAME
from orchestrator.code.snapshot_store import put_blob

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
_SHA = re.compile(r"[0-9a-f]{64}")
PROJECT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,119}")
_COMMIT = re.compile(r"[0-9a-f]{7,64}")
_BLOB_LINE = re.compile(rb"([0-9a-f]{64}) (-?[0-9]{1,20})\n")


@dataclass(frozen=True)
class Shipped:
    """One checked entry of the manifest: a file's content hash, size and mode, or a link."""

    sha: str
    size: int
    mode: str
    link: Optional[str] = None

    @property
    def kind(self) -> str:
        return "link" if self.link is not None else "file"


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


def read_header(stdin: IO[bytes]) -> Submission:
    """Read the submission's first line (at most ``MAX_HEADER_BYTES``) and check it (``_header``)."""
    return _header(stdin.readline(MAX_HEADER_BYTES + 1))


def _header(line: bytes) -> Submission:
    """The submission's first line, checked whole before anything is written or answered."""
    from orchestrator.remote.remote_ship import PROTOCOL

    if len(line) > MAX_HEADER_BYTES:
        raise UsageError(f"the submission's header is over {MAX_HEADER_BYTES >> 20} MiB: ship fewer files (list data "
                         "and outputs in the ignore file or code.exclude)")
    header = _json(line)
    if not isinstance(header, dict) or isinstance(header.get("protocol"), bool) or header.get("protocol") != PROTOCOL:
        raise UsageError(f"this login node speaks protocol {PROTOCOL}; install the same orchestrator version on both")
    unknown = sorted(set(header) - _HEADER_KEYS)
    if unknown:
        raise UsageError(f"the submission's header has unknown field(s) {shown_received(', '.join(unknown))}: install the "
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
        raise _old_client("header is not JSON") from None


def _old_client(what: str) -> UsageError:
    """The refusal of a header field only an older (or foreign) client would send."""
    return UsageError(f"the submission's {what}: update the orchestrator on your machine")


def shown_received(value: Any, limit: int = 120) -> str:
    """A received value as the error line shows it: quoted, escaped, cut short (it may hold anything)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def file_entries(files: Any) -> dict[str, Shipped]:
    """The manifest's entries, each checked (``path_problem``, ``_entry``), and checked together:
    one size per content, a bounded total, nothing beneath a shipped file or link."""
    if not isinstance(files, dict):
        raise _old_client("header lacks its files")
    if len(files) > MAX_FILES:
        raise UsageError(f"the submission ships {len(files)} files, over the limit of {MAX_FILES}: list data and "
                         "outputs in the ignore file or code.exclude")
    entries: dict[str, Shipped] = {}
    sizes: dict[str, int] = {}
    for rel, item in files.items():
        problem = path_problem(rel)
        if problem is not None:
            raise UsageError(f"refusing the shipped path {shown_received(rel)}: {problem}; paths must be relative and stay "
                             "inside the project")
        entry = _entry(rel, item)
        if entry.link is None and sizes.setdefault(entry.sha, entry.size) != entry.size:
            raise UsageError(f"the shipped entry for {shown_received(rel)} is malformed: its content has another size in "
                             "another entry; submit again")
        entries[rel] = entry
    if sum(sizes.values()) > MAX_TOTAL_BYTES:
        raise UsageError(f"the submission ships over {MAX_TOTAL_BYTES} bytes: list data and outputs in the ignore "
                         "file or code.exclude")
    _check_tree(entries)
    return entries


def path_problem(rel: Any) -> Optional[str]:
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
    bad = f"the shipped entry for {shown_received(rel)} is malformed"
    if not isinstance(item, list) or len(item) not in (3, 4):
        raise UsageError(f"{bad} (expected [sha256, size, mode] or [sha256, 0, '0o777', target]): update the "
                         "orchestrator on your machine")
    sha, size, mode = item[:3]
    link = item[3] if len(item) == 4 else None
    if not isinstance(sha, str) or not _SHA.fullmatch(sha):
        raise UsageError(f"{bad}: its hash {shown_received(sha)} is not 64 lowercase hex digits; submit again")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_FILE_BYTES:
        raise UsageError(f"{bad}: its size {shown_received(size)} is not a whole number of bytes from 0 to {MAX_FILE_BYTES}")
    if link is None:
        if mode not in FILE_MODES:
            raise UsageError(f"{bad}: its mode {shown_received(mode)} is not one of {', '.join(FILE_MODES)}")
        return Shipped(sha=sha, size=size, mode=mode)
    if mode != LINK_MODE or size != 0:
        raise UsageError(f"{bad}: a link has mode {LINK_MODE} and size 0")
    if not isinstance(link, str) or not link or "\0" in link:
        raise UsageError(f"{bad}: its link target {shown_received(link)} is not a non-empty text without NUL")
    try:
        raw = os.fsencode(link)
    except UnicodeError:
        raise UsageError(f"{bad}: its link target {shown_received(link)} is not a name this system can hold") from None
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
            raise UsageError(f"refusing the shipped path {shown_received(rel)}: the login node keeps its own record of what "
                             "was shipped under that name; rename that file, or list it in the ignore file")
        above = _shipped_along(parts[:-1], entries)
        if above is not None:
            raise UsageError(f"refusing the shipped path {shown_received(rel)}: {shown_received(above)} is shipped as "
                             f"a {entries[above].kind}, and nothing is written beneath one; ship one or the other")


def _shipped_along(parts: list[str], entries: Mapping[str, Shipped]) -> Optional[str]:
    """The first path along ``parts`` (the top folder first) that is a shipped file or link; None if none is."""
    return next((above for above in ("/".join(parts[:d]) for d in range(1, len(parts) + 1)) if above in entries), None)


def _check_links(entries: Mapping[str, Shipped]) -> None:
    """Every shipped link stays inside the project, followed as the kernel follows it."""
    links = {rel: e.link for rel, e in entries.items() if e.link is not None}
    budget = [_LINK_WORK]
    for rel, target in sorted(links.items()):
        if not _stays_inside(rel, links, budget):
            raise UsageError(f"refusing the shipped link {shown_received(rel)} -> {shown_received(target)}: it leads out of the "
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
    problem = path_problem(cwd)
    if problem is None and not entries:
        problem = "nothing was shipped, so the only folder there is '.'"
    if problem is not None:
        raise UsageError(f"refusing the folder you submitted from, {shown_received(cwd)}: {problem}; submit from inside "
                         "the project")
    above = _shipped_along(cwd.split("/"), entries)
    if above is not None:
        raise UsageError(f"refusing the folder you submitted from, {shown_received(cwd)}: it passes through "
                         f"{shown_received(above)}, a shipped {entries[above].kind}; submit from a folder of the "
                         "project itself")
    return cwd


def _checked_project(project: Any, entries: Mapping[str, Shipped]) -> Optional[str]:
    """The checkout's name: one plain folder name in ``remote/projects`` (never ``.``, ``..``,
    a hidden name that could be a lock file, or the shared checkout of nothing)."""
    if project is None and not entries:
        return None
    if not isinstance(project, str) or not PROJECT.fullmatch(project) or project == NO_PROJECT:
        raise UsageError(f"the submission names no valid project ({shown_received(project)}; letters, digits, '_', '.', '-', "
                         "not starting with '.' or '-', up to 120): update the orchestrator on your machine")
    return project


def _checked_legacy(legacy: Any, project: Optional[str]) -> Optional[str]:
    """The name an older client gave this project's checkout (its host name's hash): a plain name
    as ``project`` is, differing from it only in the hash, so a checkout it adopts is this
    project's (never a folder outside ``remote/projects``, nor another project's)."""
    if legacy is None:
        return None
    if project is None or not isinstance(legacy, str) or not PROJECT.fullmatch(legacy) or legacy == NO_PROJECT \
            or legacy.rpartition("-")[0] != project.rpartition("-")[0]:
        raise _old_client(f"older checkout name {shown_received(legacy)} is not its project's name with another hash")
    return legacy



def _checked_flag(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    raise _old_client(f"{name} is {shown_received(value)}, not true or false")


def _checked_plan(plan: Any) -> Optional[PlanRequest]:
    """``plan --remote``'s options: a mapping of ``json`` (true/false) and one of ``node`` and
    ``rank`` (a whole number from 0 to the largest world), or nothing (a submission)."""
    if plan is None:
        return None
    from orchestrator.spec.validators import MAX_WORLD

    if not isinstance(plan, dict) or set(plan) - _PLAN_KEYS:
        raise _old_client(f"plan options {shown_received(plan)} are not json, node and rank")
    as_json = _checked_flag(plan.get("json", False), "plan option json")
    for key in ("node", "rank"):
        value = plan.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_WORLD):
            raise UsageError(f"plan --{key} {shown_received(value)}: give a whole number from 0 to {MAX_WORLD - 1}")
    node, rank = plan.get("node"), plan.get("rank")
    if node is not None and rank is not None:
        raise UsageError("plan takes one of --node and --rank, not both: update the orchestrator on your machine")
    return PlanRequest(as_json=as_json, node=node, rank=rank)


def _checked_spec(spec: Any) -> dict:
    """The spec, as a mapping whose executor is SLURM: a login node is shared, so it only queues
    jobs (executor local or debug would run the user's code on the login node itself)."""
    if not isinstance(spec, dict):
        raise _old_client("header lacks its spec")
    from orchestrator.backends import BACKENDS

    executor = spec.get("executor")
    kind = BACKENDS.get(executor) if isinstance(executor, str) else None
    if kind is None or not kind.scheduled:
        named = "the default (local)" if executor is None else shown_received(executor)
        raise UsageError(f"refusing to run this spec on the login node: its executor is {named}, and a remote "
                         "submission only queues jobs on SLURM (nothing runs on a shared login node); set "
                         "executor: slurm, or run it on your machine without --remote")
    return spec


def _checked_commit(commit: Any) -> Optional[str]:
    """The laptop's git commit, or None: recorded in the checkout and shown by ``diff``, so only a commit id."""
    if commit is None or (isinstance(commit, str) and _COMMIT.fullmatch(commit)):
        return commit
    raise _old_client(f"commit {shown_received(commit)} is not a git commit id")


def _checked_text(value: Any, name: str) -> str:
    """A free-text field (the uncommitted diff): text or nothing, never another JSON type."""
    if value is None or isinstance(value, str):
        return value or ""
    raise _old_client(f"{name} is not text")


def receive_blobs(stdin: IO[bytes], blobs: Path, wanted: Mapping[str, int]) -> None:
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
