"""Experiment trackers' defaults: one tracker run per orchestrator run, across attempts.

A requeue, a restart after a crash and a resubmission of the same spec (the same run identity,
``orchestrator.identity``) all continue one W&B run, log into one TensorBoard folder and one MLflow
file store, all under the run folder. ``settings`` decides at plan time which trackers get their
defaults (a variable the user set, in the spec's ``env`` or the submitting shell, wins);
``environment`` gives a rank the variables. Standard library only: every rank imports it.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import TYPE_CHECKING, Mapping

from orchestrator.payload import TrackingSettings

if TYPE_CHECKING:
    from orchestrator.payload import Payload
    from orchestrator.spec import TrackingSpec

#: The variables each tracker's defaults set: the user setting any one of them keeps all of that
#: tracker's defaults off (a WANDB_DIR of theirs with our run id, or the reverse, would split runs).
WANDB_VARS = ("WANDB_RUN_ID", "WANDB_RESUME", "WANDB_DIR")
TENSORBOARD_VARS = ("ORCH_TENSORBOARD_DIR",)
MLFLOW_VARS = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME")
#: W&B run ids: at most 64 characters, none of / \\ # ? % : (W&B refuses them).
WANDB_ID_MAX = 64
_WANDB_BAD = re.compile(r"[^A-Za-z0-9_.-]")


def settings(spec: TrackingSpec, env: Mapping[str, str], environ: Mapping[str, str]) -> TrackingSettings:
    """Which trackers get defaults: those the spec leaves on and whose variables nobody set."""

    def free(names: tuple[str, ...]) -> bool:
        return not any(name in env or name in environ for name in names)

    return TrackingSettings(wandb=spec.wandb and free(WANDB_VARS),
                            tensorboard=spec.tensorboard and free(TENSORBOARD_VARS),
                            mlflow=spec.mlflow and free(MLFLOW_VARS))


def wandb_run_id(run_id: str) -> str:
    """ORCH_RUN_ID as W&B accepts it: unchanged when it fits, else shortened with a hash (stable)."""
    clean = _WANDB_BAD.sub("_", run_id)
    if len(clean) <= WANDB_ID_MAX and clean == run_id:
        return clean
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:10]
    return f"{clean[:WANDB_ID_MAX - 11]}-{digest}"


def folders(run_dir: str) -> dict[str, str]:
    """Where each tracker writes, under the run folder."""
    return {"wandb": os.path.join(run_dir, "wandb"), "tensorboard": os.path.join(run_dir, "tensorboard"),
            "mlflow": os.path.join(run_dir, "mlruns")}


def environment(payload: Payload) -> dict[str, str]:
    """The trackers' variables for a rank of this payload (its run id and folder: a sweep point's own)."""
    t, where = payload.tracking, folders(payload.run_dir)
    env: dict[str, str] = {}
    if t.wandb:
        env.update(WANDB_RUN_ID=wandb_run_id(payload.run_id), WANDB_RESUME="allow", WANDB_DIR=where["wandb"])
    if t.tensorboard:
        env["ORCH_TENSORBOARD_DIR"] = where["tensorboard"]
    if t.mlflow:
        env.update(MLFLOW_TRACKING_URI="file://" + where["mlflow"], MLFLOW_EXPERIMENT_NAME=payload.job_name)
    return env
