"""Experiment tracking across a real SLURM requeue (issue 22): jobs.train on 1 node x 2 ranks with
WANDB_MODE=offline, requeued by ``scontrol requeue`` mid-run, resumes from its checkpoint; both
attempts' offline W&B folders carry the one run id, and TensorBoard's reader shows every logged step
once."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from orchestrator.backends.slurm.executor import SlurmExecutor
from orchestrator.node.tracking import wandb_run_id

from .test_slurm import TRAIN, no_job_processes, release_requeued, run_wait, slurm_plan


def _steps(log_dir: Path, purge: bool) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), purge_orphaned_data=purge)
    acc.Reload()
    return sorted(e.step for e in acc.Scalars("train/loss"))


def test_a_requeued_offline_job_is_one_wandb_run_and_tensorboard_holds_every_step_once(cluster: dict[str, str]) -> None:
    launch = slurm_plan(cluster, name="tracked-requeue", nodes=1, checkpoint={"interval_steps": 5},
                        args={**TRAIN, "max-steps": 0, "epochs": 1, "stop-check-every": 1, "step-delay": 0.1},
                        env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    ex = SlurmExecutor()
    record = ex.submit(launch)
    metrics = Path(launch.run_dir) / "metrics" / "rank-0.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count('"train"') >= 4):
        assert time.monotonic() < deadline, "the first attempt logged too little"
        time.sleep(0.2)
    subprocess.run(["scontrol", "requeue", record.job_ids[0]], check=True)
    release_requeued(record.job_ids[0])
    final = run_wait(ex, record, 300)
    run_dir = Path(launch.run_dir)
    log = "".join(p.read_text() for p in sorted((run_dir / "slurm").glob("*_0_log.out")))
    assert final.state == "COMPLETED", (final.error, log[-3000:])
    result = json.loads((run_dir / "result.json").read_text())["result"]
    assert result["resumed_from_step"], result  # the second attempt resumed mid-run

    expected = wandb_run_id(launch.run_id)
    folders = sorted((run_dir / "wandb" / "wandb").glob("offline-run-*"))
    assert len(folders) == 2 and {f.name.split("-", 3)[-1] for f in folders} == {expected}, folders

    raw, shown = _steps(run_dir / "tensorboard", purge=False), _steps(run_dir / "tensorboard", purge=True)
    assert shown == sorted(set(raw)) and len(shown) == len(set(shown)), (raw, shown)  # every step once
    assert shown[-1] == result["global_step"] and all(s % TRAIN["log-every"] == 0 for s in shown[:-1]), shown
    assert no_job_processes()
