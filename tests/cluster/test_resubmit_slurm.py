"""A spec submitted again after its job ended, with nobody asking in between, is a new attempt of the
same run: the record still said PENDING (what submission saw), and the second ``orchestrator submit``
was refused as "still PENDING" until someone ran ``status`` (seen on the 64-node cluster). A
resubmission that sbatch refuses loses nothing: the COMPLETED attempt stays as it was."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from orchestrator.core.records import RunRecord


def _submit(folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", "submit", "spec.yaml"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120)


def _files(run_dir: Path) -> dict[str, bytes]:
    """The run folder's files, but for the lock and lease a submission takes and gives back."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name not in ("lock", "lease.json")}


def test_a_spec_submitted_again_after_its_job_ended_is_the_next_attempt(cluster: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "hello.py").write_text("print('hello from', __import__('os').environ['RANK'])\n")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({
        "name": "again", "executor": "slurm", "entrypoint": "hello.py", "nodes": 1, "cpu_ranks_per_node": 1,
        "runs_dir": cluster["runs_dir"], "slurm": {"time": "00:05:00"}}))
    env = {**os.environ, "SLURM_CONF": cluster["SLURM_CONF"]}
    first = _submit(tmp_path, env)
    assert first.returncode == 0, first.stdout + first.stderr
    run_dir = next(line.rsplit("run folder ", 1)[1] for line in first.stdout.splitlines() if "run folder " in line)
    job = RunRecord.load(run_dir).job_ids[0]
    deadline = time.monotonic() + 120
    while "COMPLETED" not in subprocess.run(["sacct", "-n", "-X", "-j", job, "-o", "State"], capture_output=True,
                                            text=True, env=env).stdout:
        assert time.monotonic() < deadline, f"job {job} did not complete"
        time.sleep(0.5)
    assert not RunRecord.load(run_dir).state.terminal  # nobody asked: the record says what submission saw
    status = subprocess.run([sys.executable, "-m", "orchestrator", "status", "again"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert "COMPLETED" in status.stdout, status.stdout + status.stderr
    before = _files(Path(run_dir))
    refused = _submit(tmp_path, {**env, "SBATCH_ACCOUNT": "no-such-account"})  # sbatch refuses: the site enforces accounts
    assert refused.returncode != 0 and "account" in refused.stderr.lower(), refused.stdout + refused.stderr
    assert _files(Path(run_dir)) == before  # the COMPLETED attempt, its record and its log, exactly as they were
    assert RunRecord.load(run_dir).state.name == "COMPLETED"
    again = _submit(tmp_path, env)
    assert again.returncode == 0, again.stdout + again.stderr
    record = RunRecord.load(run_dir)
    assert record.attempts == 2 and record.job_ids[-1] != job, record
