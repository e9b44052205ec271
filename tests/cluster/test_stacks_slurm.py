"""Hang forensics on the real 2-node cluster: ``orchestrator stacks`` reaches every rank on every
node through ``srun --overlap`` while they run, and the job's agent enforces the stall watchdog
and the init deadline (stacks saved first), and warns about a job that did nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.backends.slurm.executor import SlurmExecutor
from orchestrator.core.records import RunRecord
from tests.integration.helpers import SCRIPTS

from .test_slurm import no_job_processes, rank_processes, run, slurm_plan

ROOT = Path(__file__).resolve().parents[2]


def _saved(run_dir: str) -> dict[int, str]:
    return {int(p.stem.split("-")[1]): p.read_text() for p in (Path(run_dir) / "stacks").glob("rank-*.txt")}


def _wait_until_running(job: str, within_s: float = 300) -> None:
    deadline = time.monotonic() + within_s
    while subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True,
                         timeout=30).stdout.strip() == "PENDING":
        assert time.monotonic() < deadline, f"job {job} still pending after {within_s:.0f}s"
        time.sleep(0.5)


def test_stacks_reach_every_rank_on_both_nodes_and_they_keep_running(cluster: dict[str, str]) -> None:
    out = Path(cluster["runs_dir"]) / "busy-out"
    out.mkdir(exist_ok=True)
    launch = slurm_plan(cluster, name="busy", entrypoint=str(SCRIPTS / "busy_loop.py"), extra_args=[str(out), "120"])
    ex = SlurmExecutor()
    record = ex.submit(launch)
    env = {**os.environ, "SLURM_CONF": cluster["SLURM_CONF"], "ORCHESTRATOR_HOME": cluster["runs_dir"]}
    try:
        _wait_until_running(record.job_ids[0])  # the queue behind the other streams' jobs is not the ranks' start
        deadline = time.monotonic() + 120
        while not all((out / f"alive-{r}").exists() for r in range(4)):
            assert time.monotonic() < deadline, "the ranks never started stepping"
            time.sleep(0.3)
        t0 = time.monotonic()
        shown = subprocess.run([sys.executable, "-m", "orchestrator", "stacks", launch.run_dir], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t0
        print(f"orchestrator stacks on SLURM (2 nodes x 2 ranks): {took:.2f}s")
        assert shown.returncode == 0, shown.stderr
        headers = [line for line in shown.stdout.splitlines() if line.startswith("=== rank ")]
        assert len(headers) == 4, shown.stdout
        assert all("busy_loop.py" in h and "train_step" in h for h in headers), headers
        assert {h.split("host ")[1].split(",")[0] for h in headers} == {"node1", "node2"}, headers
        assert took < 10
        marks = {r: (out / f"alive-{r}").stat().st_mtime for r in range(4)}
        time.sleep(3)
        assert all((out / f"alive-{r}").stat().st_mtime > marks[r] for r in range(4)), "a rank stopped stepping"
        assert ex.refresh([RunRecord.load(launch.run_dir)])[0].state == "RUNNING"
    finally:
        ex.cancel(RunRecord.load(launch.run_dir))
    assert no_job_processes(), rank_processes()


def test_stall_on_slurm_names_the_straggler_with_every_stack(cluster: dict[str, str]) -> None:
    launch = slurm_plan(cluster, name="stall", entrypoint=str(SCRIPTS / "stuck_rank.py"), extra_args=["3"],
                        watchdog={"stall_s": 20})
    record = run(launch, timeout=240)
    assert record.state == "FAILED", record
    stalled_at = max(p.stat().st_mtime for p in (Path(launch.run_dir) / "slurm").glob("*_3_log.out"))
    print(f"SLURM stall -> job ended: {record.ended - stalled_at:.1f}s (stall_s 20)")
    assert record.failed_rank == 3 and "straggler: rank 3" in (record.error or ""), record.error
    saved = _saved(launch.run_dir)
    assert sorted(saved) == [0, 1, 2, 3], sorted(saved)
    assert "in stuck_here" in saved[3]
    assert all("in all_reduce" in saved[r] for r in (0, 1, 2)), saved
    assert "stuck_here" in record.waits["3"] and "waiting in all_reduce" in record.waits["0"], record.waits
    assert no_job_processes(), rank_processes()


def test_init_deadline_on_slurm_names_the_rank(cluster: dict[str, str]) -> None:
    launch = slurm_plan(cluster, name="nojoin", entrypoint=str(SCRIPTS / "never_joins.py"), extra_args=["1"],
                        distributed={"backend": "gloo", "init_method": "tcp", "init_timeout_s": 30})  # counted from the ranks' start: imports on busy nodes included
    record = run(launch, timeout=240)
    assert record.state == "FAILED" and record.failed_rank == 1, record
    assert "rank 1 never called init_process_group" in (record.error or ""), record.error
    assert "wait_for_data" in _saved(launch.run_dir).get(1, ""), _saved(launch.run_dir)
    assert no_job_processes(), rank_processes()


def test_did_nothing_on_slurm_is_completed_with_a_warning(cluster: dict[str, str]) -> None:
    launch = slurm_plan(cluster, name="nothing", entrypoint=str(SCRIPTS / "no_group.py"))
    record = run(launch, timeout=240)
    assert record.state == "COMPLETED", record
    assert record.warning and "none joined a process group" in record.warning, record


def test_time_limit_without_requeue_saves_the_stacks_first(cluster: dict[str, str]) -> None:
    """USR2 to the batch step is what SLURM sends at the time limit (B:USR2@margin); with
    slurm.requeue: never no requeue follows, so the agent saves the stacks before forwarding it.
    The script has no USR2 handler: it is not ended by the notice, and finishes its own work."""
    out = Path(cluster["runs_dir"]) / "limit-out"
    out.mkdir(exist_ok=True)
    launch = slurm_plan(cluster, name="limit", entrypoint=str(SCRIPTS / "busy_loop.py"), extra_args=[str(out), "40"],
                        slurm={"time": "00:10:00", "signal_margin_s": 30, "requeue": "never"})
    ex = SlurmExecutor()
    record = ex.submit(launch)
    deadline = time.monotonic() + 120
    while not all((out / f"alive-{r}").exists() for r in range(4)):
        assert time.monotonic() < deadline, "the ranks never started stepping"
        time.sleep(0.3)
    subprocess.run(["scancel", "--batch", "--signal=USR2", record.job_ids[0]], check=True)
    deadline = time.monotonic() + 120
    while (record := ex.refresh([RunRecord.load(launch.run_dir)])[0]).state in ("PENDING", "RUNNING"):
        assert time.monotonic() < deadline, record
        time.sleep(0.5)
    saved = _saved(launch.run_dir)
    assert sorted(saved) == [0, 1, 2, 3] and all("train_step" in saved[r] for r in range(4)), saved
    assert "time limit" in saved[0].splitlines()[0]
    assert record.state == "COMPLETED", record  # the notice did not end a script that has no handler for it
    assert no_job_processes(), rank_processes()
