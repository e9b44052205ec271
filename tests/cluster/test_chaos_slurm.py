"""`orchestrator chaos` on the real 2-node cluster, through the CLI as a user runs it: a sweep's
point (an array task, whose 'A_T' id SLURM 22.05's ``srun --jobid`` refuses) is reached through
its numeric job id and recovers on its own; the sweep as a whole is refused naming the point to
give; a second kill once the point's restarts are used up is refused and kills nothing; and
``--node-down`` refuses a node that runs another job, leaving it up. `orchestrator stacks` on the
sweep reaches the running point's ranks the same way.

The node-down test is in tests/cluster/streams.py's SERIAL_TESTS: when chaos is right no node goes
DOWN, but if the refusal ever broke it would take node1 down for every stream."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from orchestrator.backends.slurm.executor import SlurmExecutor
from orchestrator.core.recovery import History
from orchestrator.core.records import RunRecord

from .test_recovery_slurm import SCRIPT, _logs, _run_through_restarts
from .test_slurm import no_job_processes, slurm_plan

ROOT = Path(__file__).resolve().parents[2]


def _chaos(cluster: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLURM_CONF": cluster["SLURM_CONF"], "ORCHESTRATOR_HOME": cluster["runs_dir"]}
    return subprocess.run([sys.executable, "-m", "orchestrator", "chaos", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def _wait_for(condition, within_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.3)


def test_chaos_breaks_a_sweep_point_through_its_array_tasks_numeric_job_id(cluster: dict[str, str]) -> None:
    base = Path(cluster["runs_dir"]) / f"ckpt-chaos-sweep-{uuid.uuid4().hex[:8]}"
    ckpts = [base / "p0", base / "p1"]
    launch = slurm_plan(cluster, name="chaos-sweep", entrypoint=SCRIPT, nodes=1, cpu_ranks_per_node=2,
                        args={"mode": "none", "steps": 60, "sleep": 0.3}, sweep={"ckpt": [str(c) for c in ckpts]},
                        recovery={"max_restarts": 1})
    ex = SlurmExecutor()
    record = ex.submit(launch)
    point = Path(launch.run_dir) / "points" / "0001"
    _wait_for(lambda: (ckpts[1] / "state.json").exists(), 240, _logs(launch.run_dir)[-3000:])
    # `orchestrator stacks` on the sweep reaches the running point's ranks (its srun --overlap names
    # the array task's own job id: 22.05 refuses 'A_T', and the stacks came back empty).
    env = {**os.environ, "SLURM_CONF": cluster["SLURM_CONF"], "ORCHESTRATOR_HOME": cluster["runs_dir"]}
    shown = subprocess.run([sys.executable, "-m", "orchestrator", "stacks", launch.run_dir], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60)
    headers = [line for line in shown.stdout.splitlines() if line.startswith("=== rank ")]
    assert shown.returncode == 0 and len(headers) == 2, shown.stdout + shown.stderr
    assert all("flaky_snapshot.py" in h for h in headers), shown.stdout
    whole = _chaos(cluster, launch.run_dir, "--kill-rank", "1")
    assert whole.returncode != 0 and "is a sweep of 2 points" in whole.stderr, whole.stderr
    killed = _chaos(cluster, f"{launch.run_dir}/points/1", "--kill-rank", "1")
    assert killed.returncode == 0, killed.stderr  # not "Invalid numeric value": srun got the task's own job id
    assert f"{record.run_id} point 1: kill-rank rank 1 on" in killed.stdout, killed.stdout
    _wait_for(lambda: len(History.load(point).attempts) == 2 and (point / "ranks" / "rank-1.json").exists(), 120,
              "point 1 never restarted")
    again = _chaos(cluster, f"{launch.run_dir}/points/1", "--kill-rank", "1")
    assert again.returncode != 0 and "has used 1 of its 1 restart(s)" in again.stderr, again.stderr
    record = _run_through_restarts(launch, record=record)
    assert record.state == "COMPLETED", f"{record.error}\n{_logs(launch.run_dir)[-4000:]}"
    first, second = History.load(point).attempts
    assert (first.outcome, first.action, second.outcome) == ("crash", "restart", "completed"), (first, second)
    assert [json.loads(line)["action"] for line in (point / "chaos.jsonl").read_text().splitlines()] == ["kill-rank"]
    assert no_job_processes()


def test_node_down_refuses_a_node_that_runs_another_job(cluster: dict[str, str]) -> None:
    ckpt = Path(cluster["runs_dir"]) / f"ckpt-chaos-shared-{uuid.uuid4().hex[:8]}"
    launch = slurm_plan(cluster, name="chaos-shared", entrypoint=SCRIPT, nodes=1, cpu_ranks_per_node=1,
                        args={"ckpt": str(ckpt), "mode": "none", "steps": 200, "sleep": 0.3},
                        recovery={"max_restarts": 2}, slurm={"time": "00:10:00", "signal_margin_s": 30,
                                                             "nodelist": "node1"})
    ex = SlurmExecutor()
    ex.submit(launch)
    other = subprocess.run(["sbatch", "--parsable", "-w", "node1", "-n", "1", "-t", "5", "-o", "/dev/null",
                            "--wrap", "sleep 300"],
                           capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    try:
        _wait_for(lambda: (ckpt / "state.json").exists(), 240, _logs(launch.run_dir)[-3000:])
        _wait_for(lambda: "RUNNING" in subprocess.run(["squeue", "-h", "-j", other, "-o", "%T"], capture_output=True,
                                                      text=True).stdout, 120, "the other job never started")
        refused = _chaos(cluster, launch.run_dir, "--node-down", "node1")
        assert refused.returncode != 0 and "node1 also runs" in refused.stderr, refused.stderr
        assert other not in refused.stderr  # counted, not named
        state = subprocess.run(["sinfo", "-h", "-n", "node1", "-o", "%t"], capture_output=True, text=True).stdout
        assert "down" not in state, state
    finally:
        subprocess.run(["scancel", other], capture_output=True)
        ex.cancel(RunRecord.load(launch.run_dir))
    assert no_job_processes()
