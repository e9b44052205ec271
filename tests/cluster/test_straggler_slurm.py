"""recovery.on: [straggler] on the SLURM cluster (issue 51, item 3): a jobs.train job of two ranks on
one node and a spare node; `orchestrator chaos --slow-rank 1 --factor 4` (a SIGSTOP/SIGCONT duty
cycle on the rank, through srun on its node) makes rank 1 the straggler; named for
watchdog.straggler_window_s, it ends the attempt with its node blamed, and the ranks restart inside
the job on the spare. One SLURM job, never requeued, COMPLETED, the straggler's node named in
status and left out."""

from __future__ import annotations

import subprocess
import sys
import time

from orchestrator.backends.slurm.executor import SlurmExecutor
from orchestrator.core.recovery import History
from orchestrator.front.chaos import Injection, inject

from .test_slurm import no_job_processes, slurm_plan
from .test_survivors_slurm import ARGS, _batch_log, _train_steps, _wait


def test_a_persistent_straggler_moves_the_ranks_to_the_spare_inside_the_job(cluster: dict[str, str]) -> None:
    launch = slurm_plan(cluster, name="straggler-spare", nodes=1, cpu_ranks_per_node=2,
                        args={**ARGS, "epochs": 12, "step-delay": 0.02}, checkpoint={"interval_steps": 40},
                        recovery={"max_restarts": 1, "spares": 1, "on": ["crash", "straggler"]},
                        watchdog={"straggler_window_s": 10})
    ex = SlurmExecutor()
    record = ex.submit(launch)
    deadline = time.monotonic() + 180
    while len(_train_steps(launch.run_dir)) < 20:
        assert time.monotonic() < deadline, _batch_log(launch.run_dir)[-3000:]
        time.sleep(0.3)
    said = inject(launch.run_dir, Injection("slow-rank", rank=1, factor=4, seconds=150))
    assert "slow-rank rank 1 on node1" in said, said
    record = _wait(ex, record, 300)
    log = _batch_log(launch.run_dir)
    assert record.state == "COMPLETED", f"{record.error}\n{log[-4000:]}"
    attempts = History.load(launch.run_dir).attempts
    assert len(attempts) == 2, ([(a.outcome, a.why) for a in attempts], log[-4000:])
    first, second = attempts
    assert (first.outcome, first.action, first.inside_job) == ("straggler", "restart", True), first
    assert "straggler: rank 1 on node1 spends" in first.why and first.blamed == ["node1"], first
    assert first.nodes == ["node1"] and second.nodes == ["node2"] and first.job == second.job  # the spare, one job
    assert second.outcome == "completed"
    status = subprocess.run([sys.executable, "-m", "orchestrator", "status", launch.run_dir], capture_output=True,
                            text=True, timeout=60).stdout
    assert "straggler, restarted inside the job: straggler: rank 1 on node1" in status, status
    assert no_job_processes()
