"""A run's identity: the run folder (and so its checkpoints) is named by what changes the training.

The rule: a run is ``<name>-<hash>``, the hash of the *training* fields of the spec: what is run
(``entrypoint``, ``args``, ``extra_args``, ``sweep``), on what world (``nodes``, ranks per node as
the executor will run them, ``strategy``, ``distributed.grad_compression``) and where (the
executor: a local dry run never resumes a SLURM run's checkpoints, nor the other way round).

Everything else is *operational*: how long, where and how it is scheduled and watched
(``slurm.*``, ``local.*``, ``watchdog.*``, ``recovery.*``, ``stop_grace_s``), the rendezvous
(``distributed.*`` but gradient compression), checkpoint cadence and place (``checkpoint.*`` but
``resume``: a run that starts over must not write its checkpoints among the old ones, whose higher
steps would win the next resume),
``env`` (debugging switches: NCCL_DEBUG, TORCH_*...; a value that changes the training belongs in
``args``), ``workdir``, ``runs_dir`` and the code snapshot (``code.*``; the code itself is not
part of the identity either: fixing a bug and submitting again resumes). Changing an operational
field and submitting again resumes the same run: after a TIMEOUT, raise ``slurm.time`` and submit.

And *which project* it runs (``project_key``): the script's resolved path on this host, or the
folder its top-level module is found in. Two projects that share a job name, args and runs_dir
are two runs, never one continuing the other's checkpoints. The same project resubmitted is the
same key: from the same folder on this host, and with ``--remote`` from the login node's checkout
of it, which keeps its place between submissions (``remote_checkout.checkout_name``: named by the
laptop's client id and the project's path). The orchestrator's own jobs (``jobs.train:main``) and
installed packages are no project: their runs are named by the fields alone, as before.

Runs named before the project was part of the identity keep their folders: while a folder of the
old name (the hash without the project) exists in the runs folder and was submitted from this
project (its payload's source folder says so, or says nothing), ``run_id`` returns that name, so
a resubmission after an upgrade continues its run, and a queued job (its payload carries its run
folder) is never orphaned; a run of another project found there is left alone.

Every field of the spec is classified here; a unit test fails when a new one is not.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Optional

from orchestrator.core.module_origin import module_folder
from orchestrator.core.payload import is_script
from orchestrator.core.safe_read import Unreadable, read_json
from orchestrator.core.snapshot_writes import tree_writes
from orchestrator.spec.models import JobSpec

#: Top-level fields (or dotted sub-fields) that name the run.
TRAINING: tuple[str, ...] = (
    "name", "entrypoint", "args", "extra_args", "sweep", "nodes", "gpus_per_node", "cpu_ranks_per_node",
    "strategy", "executor", "distributed.grad_compression", "checkpoint.resume", "framework", "bool_args")
#: The rest: changing one resumes the same run.
OPERATIONAL: tuple[str, ...] = (
    "distributed.backend", "distributed.init_method", "distributed.port", "distributed.rendezvous_dir",
    "distributed.rendezvous_dir_is_shared", "distributed.interface", "distributed.init_timeout_s",
    "distributed.collective_timeout_s", "distributed.nccl_async_error_handling", "distributed.nccl_flight_recorder",
    "checkpoint.dir", "checkpoint.interval_steps", "checkpoint.keep_last",
    "slurm", "local", "env", "workdir", "watchdog", "recovery", "code", "stop_grace_s", "runs_dir",
    "container", "after", "tracking")
#: Training fields added after run ids were first handed out: left out of the hash while they hold
#: their default, so a spec that does not use them keeps the run id it had.
LATER_TRAINING_DEFAULTS: dict[str, Any] = {"framework": None, "bool_args": "flag"}

_RUN_NAME = re.compile(r"^(?P<name>.+)-(?P<hash>[0-9a-f]{8})$")


def identity_fields(spec: JobSpec, cwd: Optional[str] = None) -> dict[str, Any]:
    """The values that name the run (defaults included, so a default that changes in a release
    is visible: the fields are few and fixed, not the whole spec), and the project it runs, as
    seen from ``cwd`` (default: this process's folder, where relative paths of the spec start)."""
    data = spec.model_dump(mode="json")
    out: dict[str, Any] = {}
    for dotted in TRAINING:
        value: Any = data
        for part in dotted.split("."):
            value = value[part]
        if dotted in LATER_TRAINING_DEFAULTS and value == LATER_TRAINING_DEFAULTS[dotted]:
            continue
        if dotted == "bool_args" and not _has_bool(data["args"], data["sweep"]):
            continue  # no true/false to pass: the command line is the same either way
        out[dotted] = value
    if spec.runs_on.emulated:  # the world the local executor will actually run
        out["local_shape"] = list(spec.local_shape())
    project = project_key(spec.entrypoint, cwd)
    if project is not None:
        out["project"] = project
    return out


def project_key(entrypoint: str, cwd: Optional[str] = None) -> Optional[str]:
    """Which project ``entrypoint`` runs when submitted from ``cwd`` (default: this process's
    folder), on this host: a script's resolved path, or the resolved folder holding a module's
    top-level package (the folder submitted from first, as the ranks search it first). None: no
    project of the user's (an installed package, the orchestrator's own jobs, or a module not
    found here), so the run is named by its fields alone.

    Computed from paths only (no git, no scan): the run id is needed where nothing is scanned
    (``plan`` with ``code.snapshot: false``, ``after:``, a pipeline's stages), and must not depend
    on whether the snapshot is on, an operational field."""
    here = os.path.abspath(cwd or os.getcwd())
    if is_script(entrypoint):
        return os.path.realpath(os.path.join(here, entrypoint))
    folder = module_folder(entrypoint.split(":")[0].split(".")[0], here)
    return None if folder is None or folder == _own_root() else folder


def _own_root() -> str:
    """The folder holding the orchestrator's own packages (``orchestrator``, ``jobs``): its jobs
    are the tool's, the same for every project, in a checkout of it as installed."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def _has_bool(args: dict[str, Any], sweep: dict[str, list[Any]]) -> bool:
    values = [*args.values(), *(x for xs in sweep.values() for x in xs)]
    return any(isinstance(x, bool) or (isinstance(x, list) and any(isinstance(y, bool) for y in x)) for x in values)


def run_id(spec: JobSpec, cwd: Optional[str] = None) -> str:
    """``<name>-<hash>`` of the identity fields, the project included (see the module's doc):
    the name a run of this project had before the project was part of it while that folder
    exists and was submitted from this project, else the hash with the project."""
    fields = identity_fields(spec, cwd)
    named = _hashed(spec.name, fields)
    if "project" not in fields:
        return named
    older = _hashed(spec.name, {key: value for key, value in fields.items() if key != "project"})
    runs = os.path.join(os.path.abspath(cwd or os.getcwd()), os.path.expanduser(spec.runs_dir))
    if os.path.isdir(os.path.join(runs, named)) or not os.path.isdir(os.path.join(runs, older)):
        return named
    theirs = submitted_from(os.path.join(runs, older))
    return older if theirs is None or project_key(spec.entrypoint, theirs) == fields["project"] else named


def _hashed(name: str, fields: dict[str, Any]) -> str:
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:8]}"


def submitted_from(run_dir: str | Path) -> Optional[str]:
    """The folder a run was submitted from, as its ``payload.json`` records it (``source_dir``,
    moved back out of the code snapshot's tree to the live project); None when the payload cannot
    tell (missing, damaged, another format). Read as plain JSON: any payload version will do."""
    from orchestrator.core import safe_read
    from orchestrator.core.run_folder import RunFolder

    try:  # never a FIFO, a link or a huge file: the runs folder is input like any other
        data = safe_read.read_json(RunFolder.of(run_dir).payload)
    except (safe_read.Unreadable, OSError, RecursionError):
        return None
    source = data.get("source_dir") if isinstance(data, dict) else None
    if not isinstance(source, str) or not os.path.isabs(source):
        return None
    code = data.get("code") if isinstance(data, dict) else None
    tree, live = (code.get("tree"), code.get("live_root")) if isinstance(code, dict) else (None, None)
    if isinstance(tree, str) and isinstance(live, str) and os.path.isabs(live):
        rel = os.path.relpath(source, tree)
        if rel == os.curdir:
            return live
        if rel != os.pardir and not rel.startswith(os.pardir + os.sep):
            return os.path.join(live, rel)
    return source


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The identity fields whose values differ (``args.lr``, ``nodes``...)."""
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += [f"{key}.{sub}" for sub in sorted(set(va) | set(vb)) if va.get(sub) != vb.get(sub)]
        elif va != vb:
            out.append(key)
    return out


# ---- what the folder already holds (read by the CLI's plan, never by plan()) ---------------------
def latest_checkpoint(folder: str | Path) -> Optional[tuple[str, Optional[int]]]:
    """The newest checkpoint file in a folder and its step when its name carries one
    (``ckpt-0000000300.pt``, ``step_300.ckpt``, ``epoch=2-step=300.ckpt``); None when empty."""
    try:
        files = [p for p in Path(folder).iterdir() if p.is_file() and not p.name.startswith(".")]
    except OSError:
        return None
    if not files:
        return None
    newest = max(files, key=lambda p: p.stat().st_mtime)
    step = re.search(r"(?:^ckpt-|step[=_-]?)(\d+)", newest.name)
    return newest.name, (int(step[1]) if step else None)


def resume_line(run_dir: str, checkpoint_dir: str, points: int = 0, resume: bool = True) -> str:
    """``plan``'s line: does this spec resume a run, and from where (a sweep: its points' folders)."""
    run = os.path.basename(run_dir)
    folders = [os.path.join(checkpoint_dir, f"point-{i:04d}") for i in range(points)] if points else [checkpoint_dir]
    found = [(f, c) for f in folders if (c := latest_checkpoint(f)) is not None]
    exists = os.path.isdir(run_dir)
    if not found:
        # what the script itself may resume from (a file beside its __file__, a folder of its own) is not looked at
        return f"run {run} exists with no checkpoint in checkpoint.dir ({checkpoint_dir})" if exists else \
            f"new run {run}"
    if not resume:
        return (f"{'run ' + run if exists else 'new run ' + run}: starts at step 0 (checkpoint.resume: false), "
                f"though {checkpoint_dir} holds checkpoints")
    steps = [c[1] for _, c in found if c[1] is not None]
    at = f"step {max(steps)}" if steps else "its newest checkpoint"
    if points:
        return f"resumes run {run}: {len(found)} of {points} points hold checkpoints (up to {at})"
    where = os.path.join(found[0][0], found[0][1][0])
    return (f"resumes run {run} at {at} ({where})" if exists else
            f"new run {run}, but checkpoint.dir holds {at} ({where}): the ranks resume from it")


def sibling_warnings(spec: JobSpec, run_dir: str, limit: int = 3) -> list[str]:
    """Other runs of the same name in the runs folder holding checkpoints: this spec differs from
    theirs in a training field, so it starts fresh; say which fields, so a change made by mistake
    is caught before hours are spent."""
    import yaml

    from orchestrator.spec.loading import spec_from_dict

    parent, own = Path(run_dir).parent, Path(run_dir).name
    mine = identity_fields(spec)
    mine.pop("project", None)
    out = []
    try:
        siblings = sorted(parent.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return []
    for folder in siblings:
        match = _RUN_NAME.match(folder.name)
        if folder.name == own or match is None or match["name"] != spec.name or not folder.is_dir():
            continue
        try:
            theirs_spec = spec_from_dict(yaml.safe_load((folder / "spec.yaml").read_text(encoding="utf-8")))
        except Exception:  # an older or hand-edited folder: no claim about it
            continue
        ckpt = theirs_spec.checkpoint.dir or str(folder / "checkpoints")
        found = latest_checkpoint(ckpt if os.path.isabs(ckpt) else folder / "checkpoints")
        if found is None or not _same_project(theirs_spec, folder):
            continue
        theirs = identity_fields(theirs_spec)
        theirs.pop("project", None)
        changed = differences(theirs, mine)
        step = f"step {found[1]}" if found[1] is not None else found[0]
        out.append(f"run {folder.name} holds checkpoints ({step}) of this job name; this spec differs in "
                   f"{', '.join(changed) or 'fields an older version named the run by'}, so it starts a new run. "
                   f"To resume that one, undo the change")
        if len(out) >= limit:
            break
    return out


def _same_project(theirs: JobSpec, folder: Path) -> bool:
    """The run in ``folder`` (its spec ``theirs``) belongs to the project submitted from here: its
    spec, submitted from here, would run the same project it ran (so a changed entrypoint still
    counts as this project's); or its payload cannot tell. Another project's runs are no concern."""
    source = submitted_from(folder)
    return source is None or project_key(theirs.entrypoint, source) == project_key(theirs.entrypoint)


def plan_lines(launch: Any) -> list[str]:
    """What ``plan``, ``run`` and ``submit`` say about the run's identity: whether the spec resumes
    a run (and from which step) or starts one, and other runs of the job's name holding
    checkpoints, with the fields this spec changed; and the files the script wrote beside itself in
    the run's previous code snapshot, which this attempt, from a new one, will not see."""
    ckpt = launch.payload.checkpoint
    lines = [f"identity: {resume_line(launch.run_dir, ckpt.dir, len(launch.sweep), ckpt.resume)}"]
    code = launch.payload.code
    try:
        left = left_behind(launch.run_dir, code.tree if code is not None else None)
        lines += [f"warning: {left}"] if left else []
        lines += [f"warning: {w}" for w in sibling_warnings(launch.spec, launch.run_dir)]
    except OSError:
        pass
    return lines


def left_behind(run_dir: str, tree: Optional[str]) -> Optional[str]:
    """The warning for files the run's script wrote beside its ``__file__`` inside its previous
    attempt's code snapshot (``<run>/code.json`` still names it when this is called, before the
    attempt starts) when this attempt runs from another tree (``tree``; None: the live files):
    there it will not find them. None when there are none, or the tree is the same."""
    try:
        code = read_json(Path(run_dir) / "code.json")
    except Unreadable:
        return None
    before, manifest = (code.get("tree"), code.get("manifest")) if isinstance(code, dict) else (None, None)
    if not isinstance(before, str) or not isinstance(manifest, str):
        return None
    if tree is not None and os.path.realpath(before) == os.path.realpath(tree):
        return None
    found = tree_writes(before, manifest)
    if not found:
        return None
    now = (f"this attempt runs from a new snapshot and will not see them: write checkpoints to checkpoint.dir or a "
           f"path outside the project's code, or copy them into the new tree ({tree})" if tree is not None else
           "this attempt runs the live files and will not see them: write checkpoints to checkpoint.dir or a path "
           "outside the project's code, or copy them into the project")
    return f"your script wrote files beside itself inside the code snapshot ({before}/...: {found.listing()}); {now}"
