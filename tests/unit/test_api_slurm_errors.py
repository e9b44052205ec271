"""Submitting or asking for status with no SLURM cluster to talk to: one line, with the fix."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.core.errors import SubmissionError
from orchestrator.backends.slurm.executor import check_slurm_conf, controller_problem

ROOT = Path(__file__).resolve().parents[2]
DNS_FAILURE = ("sbatch: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
               "sbatch: error: fetch_config: DNS SRV lookup failed\n"
               "sbatch: fatal: Could not establish a configuration source")


def test_missing_configuration_is_named_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_CONF", raising=False)
    line = controller_problem("sbatch", DNS_FAILURE)
    assert line is not None and "\n" not in line
    assert "SLURM_CONF is not set" in line and "source /var/tmp/orch-cluster/env" in line


def test_unreachable_controller_and_dbd_are_told_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    ctl = controller_problem("squeue", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)")
    assert ctl is not None and "slurmctld" in ctl and "/etc/slurm/slurm.conf" in ctl and "scontrol ping" in ctl
    dbd = controller_problem("sacct", "sacct: error: Problem talking to the database: Connection refused")
    assert dbd is not None and "slurmdbd" in dbd
    assert controller_problem("sbatch", "sbatch: error: invalid partition specified: gpu") is None


def test_a_slurm_conf_that_does_not_exist_fails_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(Every SLURM tool would retry reading it for a minute.)"""
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    with pytest.raises(SubmissionError, match="missing.conf does not exist"):
        check_slurm_conf()


def _submit(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "nocluster", "entrypoint": "jobs.train:main", "executor": "slurm",
                                    "runs_dir": str(tmp_path / "runs")}))
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "orchestrator", "submit", str(spec)], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=120)
    return out, time.monotonic() - t0


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="needs SLURM's client tools (sbatch)")
def test_submit_without_a_cluster_prints_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    out, _ = _submit(tmp_path, env)
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("error: sbatch found no SLURM cluster (SLURM_CONF is not set"), out.stderr
    assert "DNS SRV" not in out.stderr and "Traceback" not in out.stderr


def test_submit_with_a_missing_slurm_conf_prints_one_line_at_once(tmp_path: Path) -> None:
    env = {**os.environ, "SLURM_CONF": str(tmp_path / "nowhere.conf")}
    out, seconds = _submit(tmp_path, env)
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert "nowhere.conf does not exist" in out.stderr and seconds < 10
    assert not (tmp_path / "runs").exists()  # refused before a run folder was made


def test_status_from_a_laptop_shows_every_run_when_slurm_cannot_be_asked(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A SLURM run registered beside a local one, and no cluster from here: `status` lists both (the
    SLURM one as last recorded) with one warning, instead of failing as a whole; naming the SLURM run
    makes the exit code 1."""
    from orchestrator.core.records import RunRecord, register
    from orchestrator.core.states import State

    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["ORCHESTRATOR_HOME"] = str(tmp_path / "home")
    env["PATH"] = f"{tmp_path / 'bin'}:{env['PATH']}"
    (tmp_path / "bin").mkdir()
    sacct = tmp_path / "bin" / "sacct"  # a login node's sacct with no cluster configured here
    sacct.write_text("#!/bin/sh\necho 'sacct: fatal: Could not establish a configuration source' >&2\nexit 1\n")
    sacct.chmod(0o755)
    for name, executor, state in (("on-slurm", "slurm", State.RUNNING), ("on-laptop", "local", State.COMPLETED)):
        folder = tmp_path / "runs" / name
        folder.mkdir(parents=True)
        record = RunRecord(run_id=name, run_dir=str(folder), executor=executor, state=state,
                           job_ids=["42"] if executor == "slurm" else [])
        record.save()
        monkeypatch.setenv("ORCHESTRATOR_HOME", env["ORCHESTRATOR_HOME"])
        register(record)
    every = subprocess.run([sys.executable, "-m", "orchestrator", "status"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    assert every.returncode == 0, every.stderr
    assert "on-slurm" in every.stdout and "RUNNING" in every.stdout and "on-laptop" in every.stdout
    assert every.stderr.count("warning: could not ask the slurm scheduler (") == 1, every.stderr
    named = subprocess.run([sys.executable, "-m", "orchestrator", "status", "on-slurm"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    assert named.returncode == 1 and "on-slurm" in named.stdout and "shown as last recorded" in named.stderr
