"""A job submitted by the layout before the package move (issue 34) runs, is requeued and is
cancelled with the code after it: its batch script calls ``python -m orchestrator.slurm_job`` and
its payload's srun line ``orchestrator.slurm_rank``, names that are no longer files, only aliases
(``orchestrator.core.moved``). As after an upgrade with jobs still queued."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.slurm import slurm_plan as slurm_planner
from orchestrator.backends.slurm.executor import SlurmExecutor
from orchestrator.core.moved import MOVED
from orchestrator.core.records import RunRecord
from orchestrator.core.states import State

from .test_slurm import TRAIN, no_job_processes, release_requeued, slurm_plan

OLD_NAME = {new: old for old, new in MOVED.items()}


def _metrics_lines(run_dir: str) -> int:
    path = Path(run_dir) / "metrics" / "rank-0.jsonl"
    return path.read_text().count('"train"') if path.exists() else 0


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.3)


def test_a_job_of_the_old_layout_runs_is_requeued_and_cancelled(cluster: dict[str, str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    real = slurm_planner.module_argv

    def old_argv(python: str, module: str, *args: str, **kw: Any) -> list[str]:
        return real(python, OLD_NAME.get(module, module), *args, **kw)

    monkeypatch.setattr(slurm_planner, "module_argv", old_argv)  # the batch script and srun line of before
    launch = slurm_plan(cluster, name="old-layout", nodes=1, cpu_ranks_per_node=1,
                        args={**TRAIN, "max-steps": 0, "epochs": 100, "step-delay": 0.05, "stop-check-every": 1},
                        checkpoint={"interval_steps": 5})
    ex = SlurmExecutor()
    record = ex.submit(launch)
    try:
        _old_job_runs_requeues_and_cancels(ex, launch, record.job_ids[0])
    finally:  # a long job left running would hold the cluster for every later test
        ex.cancel(RunRecord.load(launch.run_dir))


def _old_job_runs_requeues_and_cancels(ex: SlurmExecutor, launch: Any, job: str) -> None:
    script = "".join(p.read_text() for p in (Path(launch.run_dir) / "slurm").glob("*_submission.sh"))
    assert " orchestrator.slurm_job " in script and "orchestrator.backends" not in script, script
    assert not (Path(__file__).parents[2] / "orchestrator" / "slurm_job.py").exists()  # a name, not a file
    assert launch.payload.srun is not None and "orchestrator.slurm_rank" in launch.payload.srun, launch.payload.srun
    _wait(lambda: _metrics_lines(launch.run_dir) >= 3, 120, "the old-layout job never trained")

    subprocess.run(["scontrol", "requeue", job], check=True)
    release_requeued(job)
    before = _metrics_lines(launch.run_dir)
    _wait(lambda: "Restarts=1" in subprocess.run(["scontrol", "show", "job", job], capture_output=True,
                                                  text=True).stdout, 60, "the job was not requeued")
    _wait(lambda: _metrics_lines(launch.run_dir) > before + 2, 120, "the requeued old-layout job never trained again")
    log = "".join(p.read_text() for p in (Path(launch.run_dir) / "slurm").glob("*_log.out"))
    assert "resumed from" in log, log[-3000:]

    t0 = time.monotonic()
    record = ex.cancel(RunRecord.load(launch.run_dir))
    assert record.state == State.CANCELLED, (record.error, log[-3000:])
    assert time.monotonic() - t0 < 30
    assert no_job_processes(), "the old-layout job left processes behind"
