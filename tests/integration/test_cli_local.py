"""The CLI as a user drives it for a local run: run --detach, status, logs, list, report, cancel."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.integration.helpers import leftover_ranks


def orch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True, timeout=timeout)


def test_detached_run_then_status_logs_report(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "cli", "entrypoint": "jobs.train:main", "nodes": 2, "cpu_ranks_per_node": 1,
        "runs_dir": str(tmp_path / "runs"),
        "args": {"dataset": "digits", "epochs": 2, "batch-size": 32, "log-every": 5},
    }))
    started = orch("run", str(spec), "--detach")
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.split()[1]
    # Wait on the record the supervisor writes (a `status` process every 0.5 s cost more CPU than
    # the training on 2 busy cores), then ask `status` once.
    record = tmp_path / "runs" / run_id / "record.json"
    deadline = time.monotonic() + 180
    while json.loads(record.read_text()).get("state") not in ("COMPLETED", "FAILED", "CANCELLED"):
        assert time.monotonic() < deadline, record.read_text()
        time.sleep(0.2)
    shown = orch("status", run_id, "--json")
    state = json.loads(shown.stdout)[0]["state"]
    assert state == "COMPLETED", shown.stdout
    logs = orch("logs", run_id, "--rank", "1")
    assert logs.returncode == 0 and "attempt 1 started" in logs.stdout
    assert "test accuracy" in orch("logs", run_id, "--rank", "0").stdout
    assert run_id in orch("list").stdout
    report = orch("report", run_id)
    assert report.returncode == 0, report.stderr
    assert "final test accuracy" in report.stdout
    assert (tmp_path / "runs" / run_id / "report" / "metrics.png").stat().st_size > 10_000
    again = orch("run", str(spec))  # same spec: resumes from the final checkpoint, trains nothing more
    assert again.returncode == 0 and "resumed from" in again.stdout


def test_unknown_run_is_a_clear_error() -> None:
    out = orch("status", "no-such-run")
    assert out.returncode == 1 and "no run 'no-such-run'" in out.stderr and "Traceback" not in out.stderr


def test_run_refuses_slurm_specs(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "s", "entrypoint": "jobs.train:main", "executor": "slurm",
                                    "runs_dir": str(tmp_path / "runs")}))  # not 'runs' in a checkout in /tmp
    out = orch("run", str(spec))
    assert out.returncode == 2 and "orchestrator submit" in out.stderr


def _train_detached(tmp_path: Path, name: str, step_delay: float, stop_check_every: int,
                    steps: int) -> tuple[str, Path]:
    """jobs.train on 2 local ranks, started with run --detach; returns once rank 0 logged ``steps``."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": name, "entrypoint": "jobs.train:main", "nodes": 1, "cpu_ranks_per_node": 2,
        "runs_dir": str(tmp_path / "runs"),
        "args": {"dataset": "digits", "epochs": 50, "batch-size": 16, "log-every": 1, "step-delay": step_delay,
                 "stop-check-every": stop_check_every},
    }))
    started = orch("run", str(spec), "--detach")
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.split()[1]
    run_dir = tmp_path / "runs" / run_id
    metrics = run_dir / "metrics" / "rank-0.jsonl"
    deadline = time.monotonic() + 120
    try:
        while not (metrics.exists() and metrics.read_text().count('"train"') >= steps):
            assert time.monotonic() < deadline, "training never started"
            time.sleep(0.1)
    except BaseException:
        orch("cancel", run_id, timeout=90)
        raise
    return run_id, run_dir


def test_cancel_from_the_cli_stops_every_rank_with_a_checkpoint(tmp_path: Path) -> None:
    """orchestrator cancel RUN: exit 0, says CANCELLED, the ranks checkpoint together and are gone,
    and status agrees."""
    run_id, run_dir = _train_detached(tmp_path, "cancel", step_delay=0.05, stop_check_every=1, steps=3)
    try:
        t0 = time.monotonic()
        cancelled = orch("cancel", run_id, timeout=60)
        assert cancelled.returncode == 0, cancelled.stderr
        assert cancelled.stdout.strip() == f"{run_id}: CANCELLED"
        assert time.monotonic() - t0 < 30
    finally:
        if not cancelled_cleanly(run_dir):
            orch("cancel", run_id, timeout=60)
    assert json.loads(orch("status", run_id, "--json").stdout)[0]["state"] == "CANCELLED"
    assert not leftover_ranks(str(run_dir))
    ckpts = sorted((run_dir / "checkpoints").glob("ckpt-*.pt"))
    assert ckpts, "the ranks did not checkpoint on cancel"
    assert "stopped at step" in orch("logs", run_id, "--rank", "0").stdout


def cancelled_cleanly(run_dir: Path) -> bool:
    record = run_dir / "record.json"
    return record.exists() and json.loads(record.read_text()).get("state") in ("CANCELLED", "COMPLETED", "FAILED")


def test_cancel_waits_stop_grace_s_for_slow_steps_to_checkpoint(tmp_path: Path) -> None:
    """A job whose next stop check is ~9 s away when cancelled (1 s steps, a check every 10) still
    checkpoints: the ranks get stop_grace_s (default 30 s, SLURM's KillWait), not a fixed few
    seconds, before SIGKILL."""
    # just past step 1: the next stop check (step 10) is 9 one-second steps away
    run_id, run_dir = _train_detached(tmp_path, "slow", step_delay=1.0, stop_check_every=10, steps=1)
    try:
        t0 = time.monotonic()
        cancelled = orch("cancel", run_id, timeout=90)
        took = time.monotonic() - t0
        assert cancelled.returncode == 0 and cancelled.stdout.strip() == f"{run_id}: CANCELLED", cancelled.stderr
    finally:
        if not cancelled_cleanly(run_dir):
            orch("cancel", run_id, timeout=90)
    assert took > 6, f"the ranks stopped after {took:.1f}s, before their next stop check"
    assert sorted((run_dir / "checkpoints").glob("ckpt-*.pt")), "killed before the stop check: no checkpoint"
    assert not leftover_ranks(str(run_dir))
