"""The login node's side of ``orchestrator --remote HOST submit`` (``orchestrator remote-receive``).

One SSH session, on its stdin and stdout (the human-readable output goes to stderr):

    client -> {"protocol", "version", "spec", "project", "cwd", "files": {path: entry}, "commit", "diff"}\\n
    server -> {"missing": [sha256...]}\\n          the blobs this node has never received
    client -> "<sha256> <size>\\n" <bytes>  ...  "END\\n"
    server -> {"submitted": {"run", "jobs", "run_dir"}}\\n   or {"error": "..."}\\n

Received files are kept once, by hash, in ``$ORCHESTRATOR_HOME/remote/blobs``. The project is a
checkout in ``remote/projects/<name>-<hash of host and path>/``: each submission makes its files
exactly the shipped ones (hard links to the blobs; files the previous shipment had and this one
lacks are removed, files the jobs wrote are left), records the manifest in
``.orchestrator-shipped.json`` (which ``snapshot`` then freezes as is, without hashing again),
and submits from the folder the user was in, so relative paths in the spec mean what they meant
on the laptop, and a relative ``runs_dir`` stays the same between submissions (runs resume).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import re
import shutil
import sys
import tarfile
from pathlib import Path
from typing import IO, Any, Iterator

from orchestrator.errors import OrchestratorError, UsageError
from orchestrator.snapshot import put_blob

_SHA = re.compile(r"^[0-9a-f]{64}$")
_PROJECT = re.compile(r"^[A-Za-z0-9_.-]{1,120}$")
MAX_HEADER_BYTES = 256 << 20


def remote_home() -> Path:
    from orchestrator.records import home

    return home() / "remote"


def serve(stdin: IO[bytes], stdout: IO[bytes]) -> int:
    def say(message: dict) -> None:
        stdout.write(json.dumps(message).encode() + b"\n")
        stdout.flush()

    try:
        header = _header(stdin.readline(MAX_HEADER_BYTES + 1))
        base = remote_home()
        blobs = base / "blobs"
        files: dict[str, list] = header["files"]
        needed = sorted({item[0] for item in files.values() if len(item) < 4 or item[3] is None})
        missing = [sha for sha in needed if not (blobs / sha[:2] / sha).is_file()]
        say({"missing": missing})
        _receive_blobs(stdin, blobs, set(missing))
        with contextlib.redirect_stdout(sys.stderr):  # the CLI's own lines are for the user, not the protocol
            run = _submit(header, base, blobs)
        say({"submitted": run})
        return 0
    except OrchestratorError as exc:
        say({"error": str(exc)})
        return exc.exit_code
    except OSError as exc:
        say({"error": f"on the login node: {exc}"})
        return 1


def _header(line: bytes) -> dict:
    from orchestrator.remote import PROTOCOL

    try:
        header = json.loads(line)
    except ValueError:
        raise UsageError("the submission's header is not JSON: update the orchestrator on your machine") from None
    if not isinstance(header, dict) or header.get("protocol") != PROTOCOL:
        raise UsageError(f"this login node speaks protocol {PROTOCOL}; install the same orchestrator version on both")
    files = header.get("files")
    if not isinstance(files, dict) or not isinstance(header.get("spec"), dict):
        raise UsageError("the submission's header lacks its spec or files")
    for rel, item in files.items():
        parts = rel.split("/")
        if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in rel:
            raise UsageError(f"refusing the shipped path {rel!r}: paths must be relative and stay inside the project")
        if not isinstance(item, list) or len(item) < 3 or not _SHA.match(str(item[0])):
            raise UsageError(f"the shipped entry for {rel!r} is malformed")
    cwd = header.get("cwd", ".")
    if not isinstance(cwd, str) or cwd.startswith("/") or ".." in cwd.split("/"):
        raise UsageError(f"refusing the shipped folder {cwd!r}")
    if files and not _PROJECT.match(str(header.get("project", ""))):
        raise UsageError("the submission names no valid project")
    return header


def _receive_blobs(stdin: IO[bytes], blobs: Path, wanted: set[str]) -> None:
    while True:
        line = stdin.readline(200)
        if line in (b"END\n", b""):
            if wanted:
                raise UsageError(f"the submission ended with {len(wanted)} file(s) still missing; submit again")
            return
        try:
            sha, size_text = line.decode().split()
            size = int(size_text)
        except ValueError:
            raise UsageError(f"malformed blob header {line[:80]!r}") from None
        if sha not in wanted:
            raise UsageError(f"received {sha}, which was not asked for")
        put_blob(blobs / sha[:2] / sha, sha, _framed(stdin, size),
                 UsageError(f"a file arrived damaged (its hash is not {sha}); submit again"))
        wanted.discard(sha)


def _framed(stdin: IO[bytes], size: int) -> Iterator[bytes]:
    """The next ``size`` bytes of the stream, in chunks; a stream that ends first is an error."""
    left = size
    while left:
        chunk = stdin.read(min(left, 1 << 20))
        if not chunk:
            raise UsageError("the connection closed in the middle of a file; submit again")
        left -= len(chunk)
        yield chunk


def _submit(header: dict, base: Path, blobs: Path) -> dict:
    from orchestrator.api import submit
    from orchestrator.loading import spec_from_dict

    files: dict[str, list] = header["files"]
    spec_data = dict(header["spec"])
    if files:
        checkout = base / "projects" / str(header["project"])
        checkout.mkdir(parents=True, exist_ok=True)
        lock_file = open(base / "projects" / f".{header['project']}.lock", "w")
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # two submissions of one project update its checkout in turn
    else:  # an installed package's module: nothing shipped
        checkout = base / "projects" / "_no-project"
        checkout.mkdir(parents=True, exist_ok=True)
        lock_file = None
    try:
        if files:
            update_checkout(checkout, files, blobs, header.get("commit"), header.get("diff") or "")
        where = checkout / header.get("cwd", ".")
        where.mkdir(parents=True, exist_ok=True)
        os.chdir(where)
        spec = spec_from_dict(spec_data)
        handle = submit(spec, executor=spec.executor, on_plan=_say_plan)
        return {"run": handle.id, "jobs": list(handle.job_ids), "run_dir": str(handle.run_dir)}
    finally:
        if lock_file is not None:
            lock_file.close()


def _say_plan(launch: Any) -> None:
    from orchestrator.identity import plan_lines

    for line in plan_lines(launch):
        print(line, file=sys.stderr, flush=True)


def update_checkout(checkout: Path, files: dict[str, list], blobs: Path, commit: Any, diff: str) -> None:
    """Make the checkout's files exactly the shipped ones (see the module's doc)."""
    from orchestrator.records import write_json_atomic
    from orchestrator.snapshot import SHIPPED_NAME

    marker = checkout / SHIPPED_NAME
    try:
        before = set(json.loads(marker.read_text(encoding="utf-8")).get("files", {}))
    except (OSError, ValueError, AttributeError):
        before = set()
    recorded: dict[str, list] = {}
    real = os.path.realpath(checkout)
    for rel, item in sorted(files.items()):
        dest = checkout / rel
        _check_inside(dest, real, rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        _check_inside(dest, real, rel)  # a folder created above may be a link that was shipped before
        link = item[3] if len(item) > 3 else None
        if link is not None:
            if not (dest.is_symlink() and os.readlink(dest) == link):
                _replace(dest, lambda tmp: os.symlink(link, tmp))
            recorded[rel] = [item[0], 0, item[2], link, os.lstat(dest).st_ino]
            continue
        blob = blobs / item[0][:2] / item[0]
        executable = int(item[2], 8) & 0o111
        st = os.lstat(dest) if dest.exists() or dest.is_symlink() else None
        if st is None or st.st_ino != os.stat(blob).st_ino or executable:
            _replace(dest, lambda tmp: _link_or_copy(blob, tmp, executable))
        recorded[rel] = [item[0], int(item[1]), item[2], None, os.lstat(dest).st_ino]
    for rel in sorted(before - set(files)):  # what the last shipment had and this one lacks (never a folder)
        gone = checkout / rel
        if os.path.realpath(gone.parent).startswith(real + os.sep) or os.path.realpath(gone.parent) == real:
            if gone.is_symlink() or gone.is_file():
                gone.unlink()
    write_json_atomic(marker, {"files": recorded, "commit": commit, "diff": diff})


def _check_inside(dest: Path, real_checkout: str, rel: str) -> None:
    """Every write stays inside the checkout: no folder on the way may be a link leading out."""
    parent = os.path.realpath(dest.parent) if dest.parent.exists() else None
    if parent is not None and parent != real_checkout and not parent.startswith(real_checkout + os.sep):
        raise UsageError(f"refusing to write {rel}: a folder on its way in the login node's checkout is a link "
                         f"leading out of it ({parent}); remove that link there, or stop shipping it")


def _replace(dest: Path, make: Any) -> None:
    """Put a new file or link at ``dest`` atomically. A folder there is never removed: it holds
    what jobs wrote (or a run folder), so the shipment is refused instead."""
    if dest.is_dir() and not dest.is_symlink():
        raise UsageError(f"{dest} is a folder in the login node's checkout, and a file or link in what you "
                         "shipped; move that folder aside there (it may hold runs or outputs), then submit again")
    tmp = dest.with_name(f".{dest.name}.orch-tmp-{os.getpid()}")
    if tmp.exists() or tmp.is_symlink():
        tmp.unlink()
    make(tmp)
    os.replace(tmp, dest)


def _link_or_copy(blob: Path, tmp: Path, executable: int) -> None:
    if not executable:
        try:
            os.link(blob, tmp)
            return
        except OSError:
            pass
    shutil.copyfile(blob, tmp)
    os.chmod(tmp, 0o555 if executable else 0o444)


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
