"""The CLI as a user drives it for a local run: run --detach, status, logs, list, report, cancel."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml


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
    deadline = time.monotonic() + 180
    while True:
        shown = orch("status", run_id, "--json")
        state = json.loads(shown.stdout)[0]["state"]
        if state in ("COMPLETED", "FAILED"):
            break
        assert time.monotonic() < deadline, shown.stdout
        time.sleep(0.5)
    assert state == "COMPLETED"
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
    spec.write_text(yaml.safe_dump({"name": "s", "entrypoint": "jobs.train:main", "executor": "slurm"}))
    out = orch("run", str(spec))
    assert out.returncode == 2 and "orchestrator submit" in out.stderr
