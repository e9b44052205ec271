"""A real preemption on the site profile (deploy/README.md): a job of the 'high' partition takes
the nodes of a running rank-API job of 'debug' (PreemptMode=REQUEUE, GraceTime). SLURM sends the
ranks SIGTERM, as it does at sites; they checkpoint together, the job is requeued (it asked for
--requeue: the site has JobRequeue=0), and the next attempt resumes from that checkpoint and
completes. (PreemptMode=CANCEL, where the site's policy ends the job and nothing requeues it, is
tests/cluster/test_as_user.py's, as the login user.)"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.slurm.executor import SlurmExecutor

from .conftest import CPUS
from .test_rank_api_slurm import ARGS, EXAMPLE, TOTAL, _result, _run_releasing_requeues, _stops_and_resumes
from .test_slurm import no_job_processes, slurm_plan


def _step(run_dir: str) -> int:
    """Rank 0's last reported step (0 before its first report), read as the orchestrator reads it
    (inside a job the reports are a file per node, progress/node-G.json, since issue 36)."""
    from orchestrator.core.progress import read_progress

    report = read_progress(run_dir, 4)[0]
    return report.step if report is not None else 0


@pytest.fixture
def preempt_mode(request: pytest.FixtureRequest):
    """debug's PreemptMode for one test, put back to the profile's REQUEUE after it."""
    mode = request.param
    subprocess.run(["scontrol", "update", "PartitionName=debug", f"PreemptMode={mode}"], check=True)
    try:
        yield mode
    finally:
        subprocess.run(["scontrol", "update", "PartitionName=debug", "PreemptMode=REQUEUE"], check=True)


def _preempted_mid_run(cluster: dict[str, str], name: str) -> tuple[Any, SlurmExecutor, Any, Any]:
    """A rank-API job of 'debug' past its step 5, then a job of 'high' over every CPU of both
    nodes: SLURM has to preempt debug's job. (The plan, the executor, the record, high's sbatch.)"""
    launch = slurm_plan(cluster, name=name, entrypoint=EXAMPLE, args={**ARGS, "step-delay": 0.5},
                        checkpoint={"interval_steps": 10},
                        slurm={"time": "00:10:00", "partition": "debug", "requeue": "auto", "max_requeues": 3})
    assert "#SBATCH --requeue" in launch.sbatch_script  # JobRequeue=0: without it SLURM would cancel it
    ex = SlurmExecutor()
    record = ex.submit(launch)
    deadline = time.monotonic() + 180
    while _step(launch.run_dir) < 5:
        assert time.monotonic() < deadline, "the job never reached step 5"
        time.sleep(0.5)
    high = subprocess.run(["sbatch", "--parsable", "-p", "high", "-N2", f"--ntasks-per-node={CPUS}", "-t", "2",
                           "-o", "/dev/null", "--wrap", "srun true"], capture_output=True, text=True, check=True)
    return launch, ex, record, high


@pytest.mark.parametrize("preempt_mode", ["REQUEUE"], indirect=True)
def test_a_real_preemption_requeues_a_rank_api_job_which_resumes_and_completes(cluster: dict[str, str],
                                                                               preempt_mode: str) -> None:
    launch, ex, record, high = _preempted_mid_run(cluster, f"preempted-{preempt_mode.lower()}")
    job = record.job_ids[0]
    final = _run_releasing_requeues(ex, record, timeout=600)
    rank0, stops, resumes = _stops_and_resumes(launch.run_dir, "SIGTERM")
    assert final.state == "COMPLETED", (final.error, rank0[-3000:])
    assert stops and resumes and resumes[0] == stops[0] and 0 < stops[0] < TOTAL, (stops, resumes, rank0[-3000:])
    assert _result(launch.run_dir)["step"] == TOTAL
    states = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-j", job, "-o", "State"], capture_output=True,
                            text=True).stdout.split()
    assert "PREEMPTED" in states or "REQUEUED" in states, states  # the first attempt, as accounting saw it
    subprocess.run(["scancel", high.stdout.strip().split(";")[0]], capture_output=True)
    assert no_job_processes()


def test_a_suspended_job_is_not_called_stalled_and_completes(cluster: dict[str, str]) -> None:
    """Under SUSPEND,GANG preemption (here ``scontrol suspend``, which is the same stop) SLURM
    stops every process of the job; suspended longer than watchdog.stall_s, the ranks made no
    progress, yet the watchdog's clock leaves the suspended time out: the job resumes and
    completes, and the agent says how long it was suspended."""
    # stall_s above the ranks' start under load (import torch on one CPU each, beside other suites)
    launch = slurm_plan(cluster, name="suspended", entrypoint=EXAMPLE, args={**ARGS, "step-delay": 0.1},
                        watchdog={"stall_s": 25}, slurm={"time": "00:10:00"})
    ex = SlurmExecutor()
    record = ex.submit(launch)
    job = record.job_ids[0]
    deadline = time.monotonic() + 180
    while _step(launch.run_dir) < 3:
        if time.monotonic() > deadline:
            record = ex.refresh([record])[0]
            show = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
            logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in (Path(launch.run_dir) / "slurm").rglob("*")
                             if p.is_file())
            raise AssertionError(f"the job never reached step 3: {record.state} {record.error}\n{show}\n{logs}")
        time.sleep(0.5)
    subprocess.run(["scontrol", "suspend", job], check=True)
    time.sleep(35)  # well past stall_s, and past the watchdog's look interval
    subprocess.run(["scontrol", "resume", job], check=True)
    final = _run_releasing_requeues(ex, record, timeout=300)
    agent_log = "\n".join(p.read_text(errors="replace") for p in (Path(launch.run_dir) / "slurm").rglob("*")
                          if p.is_file())
    assert final.state == "COMPLETED", (final.error, agent_log[-3000:])
    assert "no progress" not in agent_log and "was suspended for" in agent_log, agent_log[-3000:]
    assert _result(launch.run_dir)["step"] == TOTAL
    assert no_job_processes()
