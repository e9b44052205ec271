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

The parts: ``remote_protocol`` reads and checks what arrives (everything received is hostile
input until checked: the rules are listed there); ``remote_checkout`` keeps the checkout; this
module serves one submission from its header to its answer, and sends a run's files back
(``remote-files``). The command line (``orchestrator remote-receive``) and the protocol stay as
they are: an older client calls this node too.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tarfile
from pathlib import Path
from typing import IO, Any, Iterator, Mapping, Optional

from orchestrator.core.errors import OrchestratorError, UsageError
from orchestrator.remote.remote_checkout import adopt, enter_checkout, lock_file, checkout_name, update_checkout
from orchestrator.remote.remote_protocol import (MAX_FILE_BYTES, MAX_FILES, MAX_HEADER_BYTES, MAX_NAME_BYTES, NO_PROJECT,
                                          PlanRequest, Submission, receive_blobs, shown_received, read_header)

__all__ = ["INTERNAL_ERROR", "MAX_FILE_BYTES", "MAX_FILES", "MAX_HEADER_BYTES", "MAX_NAME_BYTES", "NO_PROJECT",
           "SITE_STORAGE", "checkout_name", "remote_home", "runs_in_home_problem", "send_files", "serve",
           "update_checkout"]

#: The site's variables naming large per-user storage, as a refused runs_dir suggests them.
SITE_STORAGE = ("SCRATCH", "WORK")
#: The start of the one line a bug (not the input) ends in; the tests look for it.
INTERNAL_ERROR = "the login node failed on this submission"


def remote_home() -> Path:
    from orchestrator.core.records import home

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
        submission = read_header(stdin)
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
        receive_blobs(stdin, blobs, missing)
        with contextlib.redirect_stdout(sys.stderr):  # the CLI's own lines are for the user, not the protocol
            if submission.plan is not None:  # plan's own output captured
                answer = {"planned": {"text": _plan(submission, checkout, blobs, submission.plan),
                                      "warnings": [home_problem] if home_problem else []}}
            else:
                answer = {"submitted": _submit(submission, checkout, blobs)}
        say(answer)
        return 0
    except OrchestratorError as exc:
        refuse(str(exc))
        return exc.exit_code
    except OSError as exc:
        refuse(f"on the login node: {exc}")
        return 1
    except Exception as exc:  # a bug, not the input: still one line for the client, never a traceback
        refuse(f"{INTERNAL_ERROR} ({type(exc).__name__}: {shown_received(str(exc))}); please report this line")
        return 1


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
        return (f"{field}: {shown_received(value)} is relative, so {what} would be written under your home on the login "
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


def _submit(submission: Submission, checkout: Path, blobs: Path) -> dict:
    """Make the checkout what was shipped, enter the folder the user was in, submit from there,
    then prune the runs folder's snapshot store (never failing the submission for it)."""
    from orchestrator.api import submit
    from orchestrator.front.snapshot_prune import store_lock

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
    from orchestrator.front.operations import show_plan

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
    from orchestrator.spec.loading import spec_from_dict

    projects = checkout.parent
    projects.mkdir(parents=True, exist_ok=True)
    lock = lock_file(projects / f".{checkout.name}.lock") if submission.files else None
    try:
        if submission.files:
            if submission.project is not None and checkout.name != submission.project:
                adopt(projects, submission.project, checkout.name)
            update_checkout(checkout, submission.files, blobs, submission.commit, submission.diff)
        enter_checkout(checkout, submission.cwd)
        spec = spec_from_dict(dict(submission.spec))
        if not spec.runs_on.scheduled:  # checked in the header already; this is the last door before a run
            raise UsageError(f"refusing to run a spec with executor {spec.executor} on the login node")
        yield spec
    finally:
        if lock is not None:
            os.close(lock)


def _store_of(spec: Any) -> Path:
    """The runs folder's store of code snapshots, as ``snapshot.scan_project`` places it."""
    from orchestrator.code.snapshot import STORE_NAME

    return Path(os.path.abspath(os.path.expanduser(spec.runs_dir))) / STORE_NAME


def _prune(store: Path) -> None:
    """Prune the store after a submission (``snapshot_prune``); a failure there is one line on
    stderr, never the submission's failure. Its report is printed as ``gc`` prints it whenever
    a snapshot was removed, the prune was skipped, or a tree was kept for files runs wrote there."""
    from orchestrator.front.snapshot_prune import prune

    try:
        report = prune(store)
    except (OrchestratorError, OSError) as exc:
        print(f"[orchestrator] old code snapshots in {store} were not pruned: {exc}", file=sys.stderr, flush=True)
        return
    if report is not None and (report.removed or report.skipped or report.held):
        print(report.line(), file=sys.stderr, flush=True)


def _say_plan(launch: Any) -> None:
    from orchestrator.spec.identity import plan_lines

    for line in plan_lines(launch):
        print(line, file=sys.stderr, flush=True)


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
