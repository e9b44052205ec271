"""Experiment trackers' defaults: one tracker run per orchestrator run, across attempts.

A requeue, a restart after a crash and a resubmission of the same spec (the same run identity,
``orchestrator.spec.identity``) all continue one W&B run, log into one TensorBoard folder and one MLflow
file store, all under the run folder. ``settings`` decides at plan time which trackers get their
defaults (a variable the user set, in the spec's ``env`` or the submitting shell, wins);
``environment`` gives a rank the variables. Standard library only: every rank imports it.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Mapping

from orchestrator.core.payload import TrackingSettings

if TYPE_CHECKING:
    from orchestrator.core.payload import Payload
    from orchestrator.core.views import LaunchView, SpecView, TrackingView  # plan.py imports this module

#: The variables each tracker's defaults set: the user setting any one of them keeps all of that
#: tracker's defaults off (a WANDB_DIR of theirs with our run id, or the reverse, would split runs).
WANDB_VARS = ("WANDB_RUN_ID", "WANDB_RESUME", "WANDB_DIR")
TENSORBOARD_VARS = ("ORCH_TENSORBOARD_DIR",)
MLFLOW_VARS = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME")
#: W&B run ids: at most 64 characters, none of / \\ # ? % : (W&B refuses them).
WANDB_ID_MAX = 64
_WANDB_BAD = re.compile(r"[^A-Za-z0-9_.-]")
#: How ``plan`` writes a sweep point's index in what differs by point (its rank table: run id,
#: run folder, checkpoints): a rule, which the trackers' values keep as written (never cleaned up,
#: hashed or percent-encoded into something that looks like a real value).
POINT_RULE = "<point index, 4 digits>"
_FIRST_POINT = "0000"


def settings(spec: TrackingView, env: Mapping[str, str], environ: Mapping[str, str]) -> TrackingSettings:
    """Which trackers get defaults: those the spec leaves on and whose variables nobody set."""

    def free(names: tuple[str, ...]) -> bool:
        return not any(name in env or name in environ for name in names)

    return TrackingSettings(wandb=spec.wandb and free(WANDB_VARS),
                            tensorboard=spec.tensorboard and free(TENSORBOARD_VARS),
                            mlflow=spec.mlflow and free(MLFLOW_VARS))


def wandb_run_id(run_id: str) -> str:
    """ORCH_RUN_ID as W&B accepts it: unchanged when it fits, else shortened with a hash (stable).
    In plan's rule for every sweep point (``POINT_RULE``), the rule stays: each point's id is its own."""
    if POINT_RULE in run_id:
        first = run_id.replace(POINT_RULE, _FIRST_POINT)
        if wandb_run_id(first) == first:  # no point's id is changed: the rule is every point's
            return run_id
        return f"<each point's own, shortened with a hash: {wandb_run_id(first)} for point {_FIRST_POINT}>"
    clean = _WANDB_BAD.sub("_", run_id)
    if len(clean) <= WANDB_ID_MAX and clean == run_id:
        return clean
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:10]
    return f"{clean[:WANDB_ID_MAX - 11]}-{digest}"


def folders(run_dir: str) -> dict[str, str]:
    """Where each tracker writes, under the run folder."""
    return {"wandb": os.path.join(run_dir, "wandb"), "tensorboard": os.path.join(run_dir, "tensorboard"),
            "mlflow": os.path.join(run_dir, "mlruns")}


def file_uri(path: str) -> str:
    """``path`` as a file:// URI, percent-encoded: a '#', '?', '%' or space in a folder's name is
    part of the path, not a fragment, a query or an escape (MLflow reads the URI back with
    urllib, which would otherwise drop or decode them and write somewhere else). Plan's rule for
    every sweep point (``POINT_RULE``) stays as written."""
    uri = PurePosixPath(os.path.abspath(path)).as_uri()
    if POINT_RULE in path:  # the rule's own encoding: any '%' of the path itself is encoded as '%25'
        uri = uri.replace(PurePosixPath("/" + POINT_RULE).as_uri()[len("file:///"):], POINT_RULE)
    return uri


def environment(payload: Payload) -> dict[str, str]:
    """The trackers' variables for a rank of this payload (its run id and folder: a sweep point's own)."""
    t, where = payload.tracking, folders(payload.run_dir)
    env: dict[str, str] = {}
    if t.wandb:
        env.update(WANDB_RUN_ID=wandb_run_id(payload.run_id), WANDB_RESUME="allow", WANDB_DIR=where["wandb"])
    if t.tensorboard:
        env["ORCH_TENSORBOARD_DIR"] = where["tensorboard"]
    if t.mlflow:
        # MLflow 3 refuses a file store unless told that it is wanted: it is here (one folder per run,
        # no server and no database on a shared filesystem).
        env.update(MLFLOW_TRACKING_URI=file_uri(where["mlflow"]), MLFLOW_EXPERIMENT_NAME=payload.job_name,
                   MLFLOW_ALLOW_FILE_STORE="true")
    return env


def plan_lines(launch: LaunchView, environ: Mapping[str, str] | None = None) -> list[str]:
    """What ``plan`` says about the trackers: where each one's defaults point, and which are off and why
    (the spec's tracking section, or a variable the user set: then theirs are used as they are)."""
    environ = os.environ if environ is None else environ
    p = launch.payload_for_point(0) if launch.sweep else launch.payload  # a point's: its own id and folders
    where = folders(p.run_dir)
    points = f" (sweep point 0 of {len(launch.sweep)}: each point has its own, under points/NNNN/)" if launch.sweep else ""
    on = []
    if p.tracking.wandb:
        on.append(f"W&B run {wandb_run_id(p.run_id)} (WANDB_RESUME=allow) in {where['wandb']}")
    if p.tracking.tensorboard:
        on.append(f"TensorBoard {where['tensorboard']}")
    if p.tracking.mlflow:
        on.append(f"MLflow {file_uri(where['mlflow'])} (experiment {p.job_name})")
    lines = [f"tracking: {'; '.join(on)}{points}"] if on else []
    off = [why for why in (_off_reason(launch.spec, environ, name, label, names) for name, label, names in
                           (("wandb", "W&B", WANDB_VARS), ("tensorboard", "TensorBoard", TENSORBOARD_VARS),
                            ("mlflow", "MLflow", MLFLOW_VARS)) if not getattr(p.tracking, name)) if why]
    if off:
        lines.append("tracking off: " + "; ".join(off))
    if p.tracking.wandb or p.tracking.tensorboard:
        lines.append("tracking: jobs.MetricsWriter writes TensorBoard events, and W&B when WANDB_MODE or WANDB_API_KEY "
                     f"is set; push offline W&B runs with `orchestrator sync {launch.run_id}`")
    return lines


def _off_reason(spec: SpecView, environ: Mapping[str, str], name: str, label: str,
                names: tuple[str, ...]) -> str:
    """Why one tracker's defaults are off: the spec turned them off, or whose variable is set."""
    if not getattr(spec.tracking, name):
        return f"{label} (tracking.{name}: false)"
    mine = [n for n in names if n in spec.env]
    if mine:
        return f"{label} (the spec's env sets {', '.join(mine)}: yours are used)"
    shell = [n for n in names if n in environ]
    return f"{label} (your shell sets {', '.join(shell)}: yours are used)" if shell else label
