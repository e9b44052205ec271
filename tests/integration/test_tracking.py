"""Experiment tracking across a restart, through the real CLI (issue 22's acceptance): a rank-API job
with WANDB_MODE=offline that crashes once and resumes leaves one W&B run (every attempt's offline
folder carries the one run id, from ORCH_RUN_ID), its TensorBoard events hold every step once as
TensorBoard's own reader reads them, MLflow wrote into the run's file store, and ``orchestrator sync``
hands all the offline folders to ``wandb sync`` (a fake one on PATH: the network boundary)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.node.tracking import wandb_run_id
from tests.integration.helpers import SCRIPTS, leftover_ranks

STEPS, FAIL_AT, INTERVAL = 10, 7, 5


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This process's environment without the user's tracker settings; W&B's own config kept in tmp."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_", "ORCH_"))}
    env.update(WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"), WANDB_CACHE_DIR=str(tmp_path / "wandb-cache"),
               WANDB_DATA_DIR=str(tmp_path / "wandb-data"), **extra)
    return env


def orch(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True,
                          timeout=120, env=env or _env(tmp_path))


def _scalar_steps(log_dir: Path, tag: str, purge: bool) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), purge_orphaned_data=purge)
    acc.Reload()
    return sorted(e.step for e in acc.Scalars(tag))


def test_a_restarted_offline_job_is_one_wandb_run_and_tensorboard_holds_every_step_once(tmp_path: Path) -> None:
    spec = tmp_path / "tracked.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "tracked", "entrypoint": str(SCRIPTS / "tracked_crash_once.py"), "nodes": 1, "cpu_ranks_per_node": 2,
        "runs_dir": str(tmp_path / "runs"), "checkpoint": {"interval_steps": INTERVAL},
        "recovery": {"max_restarts": 1}, "args": {"steps": STEPS, "fail-at": FAIL_AT, "mlflow": True},
        "env": {"WANDB_MODE": "offline", "WANDB_SILENT": "true"},
    }))
    shown = orch(tmp_path, "plan", str(spec), "--rank", "0")
    assert shown.returncode == 0, shown.stderr
    ran = orch(tmp_path, "run", str(spec))
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    run_dir = next((tmp_path / "runs").glob("tracked-*"))
    logs = "".join(p.read_text() for p in sorted((run_dir / "logs").glob("rank-*.log")))
    assert f"injected crash at step {FAIL_AT}" in logs and logs.count(f"finished at step {STEPS}") == 2, logs[-3000:]
    assert not leftover_ranks(str(run_dir))  # no W&B service process outlived its rank either

    # W&B: one offline folder per attempt, all of the one run id that ORCH_RUN_ID gives
    expected = wandb_run_id(run_dir.name)
    folders = sorted((run_dir / "wandb" / "wandb").glob("offline-run-*"))
    assert len(folders) == 2, folders
    assert {f.name.split("-", 3)[-1] for f in folders} == {expected}
    assert all((f / f"run-{expected}.wandb").is_file() for f in folders)
    assert f"WANDB_RUN_ID={expected}" in shown.stdout and "WANDB_RESUME=allow" in shown.stdout  # as plan showed

    # TensorBoard: the first attempt's steps after the checkpoint are there twice, and TensorBoard's
    # reader (purge_orphaned_data, its default) shows every step once
    tb = run_dir / "tensorboard"
    raw = _scalar_steps(tb, "train/loss", purge=False)
    assert raw.count(INTERVAL + 1) == 2, raw  # the check below could fail: the orphans are in the files
    assert _scalar_steps(tb, "train/loss", purge=True) == list(range(1, STEPS + 1))

    # MLflow: both attempts' runs in the run's file store, under the job's name as the experiment
    metric_files = list((run_dir / "mlruns").glob("*/*/metrics/resumed_at"))
    assert sorted(float(f.read_text().split()[1]) for f in metric_files) == [0, INTERVAL], metric_files

    # sync: --dry-run lists both folders; a real sync hands both to `wandb sync`
    dry = orch(tmp_path, "sync", run_dir.name, "--dry-run")
    assert dry.returncode == 0 and all(str(f) in dry.stdout for f in folders), dry.stdout + dry.stderr
    assert "tensorboard --logdir" in dry.stdout and "mlflow ui --backend-store-uri" in dry.stdout
    fake_bin, record = tmp_path / "bin", tmp_path / "wandb-argv.txt"
    fake_bin.mkdir()
    fake = fake_bin / "wandb"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {record}\necho synced\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    pushed = orch(tmp_path, "sync", run_dir.name, env=_env(tmp_path, PATH=f"{fake_bin}:{os.environ['PATH']}"))
    assert pushed.returncode == 0, pushed.stderr
    assert record.read_text().split("\n")[:-1] == ["sync", *map(str, folders)]
    assert "synced" in pushed.stdout



def test_start_after_the_first_scalar_still_purges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer opened by a scalar before ``start`` (no purge_step then) writes TensorBoard's START
    events itself; each writer's throughput lands at its latest step."""
    from jobs.metrics import MetricsWriter

    tb = tmp_path / "tb"
    monkeypatch.setenv("ORCH_TENSORBOARD_DIR", str(tb))
    for name in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with MetricsWriter(tmp_path, 0) as first:
        for step in range(6):
            first.train(step, 1.0 / (step + 1))
    # (event files sort by name: the time in seconds, host, pid, then a counter, so this one reads later)
    with MetricsWriter(tmp_path, 0) as second:
        second.train(4, 0.5)  # logged before start: voided by it like the first attempt's steps 4 and 5
        second.start(3)  # the checkpoint at 3: the record at 3 describes it and stays
        for step in range(4, 8):
            second.train(step, 0.1)
        second.throughput(0, 64, 2.0)
    assert _scalar_steps(tb, "train/loss", purge=True) == list(range(8))
    assert _scalar_steps(tb, "throughput/samples_per_s", purge=True) == [7]
