"""A restart inside a SLURM job without new interpreters (issue 50, item 2): an unmodified
torchrun-style script (no rank API) that snapshots itself; once its ranks train, the agent holds a
warm standby on each node, and when `orchestrator chaos` kills a rank, the next attempt's ranks
are forked from the standbys (no new step, no torch import) and resume from the script's own
snapshot. A rank killed in that forked attempt ends its peer as --kill-on-bad-exit would, and the
attempt after is forked again. One SLURM job, never requeued, COMPLETED, nothing left running."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from orchestrator.backends.slurm.executor import SlurmExecutor
from orchestrator.core.recovery import History
from orchestrator.front.chaos import Injection, inject

from .test_recovery_slurm import _flaky, _logs
from .test_slurm import no_job_processes
from .test_survivors_slurm import _wait

FORKED = "rank(s) forked from the warm standbys on node1,node2"


def _until(run_dir: str, pattern: str, count: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while len(re.findall(pattern, log := _logs(run_dir))) < count:
        assert time.monotonic() < deadline, f"never saw {pattern!r} x{count}:\n{log[-4000:]}"
        time.sleep(0.2)
    return log


def _pid(run_dir: str, rank: int) -> int:
    return int(json.loads((Path(run_dir) / "ranks" / f"rank-{rank}.json").read_text())["pid"])


def test_a_killed_ranks_restart_is_forked_from_the_nodes_standbys_and_resumes_from_its_snapshot(
        cluster: dict[str, str]) -> None:
    launch, ckpt = _flaky(cluster, "warm-restart", "none", {"max_restarts": 3}, steps=800, sleep=0.1, every=3)
    assert launch.payload.recovery.standbys  # the default
    ex = SlurmExecutor()
    record = ex.submit(launch)
    _until(launch.run_dir, r"warm standby ready on node[12]", 2, 240)
    log = _logs(launch.run_dir)
    assert "done.json" not in {p.name for p in ckpt.iterdir()}, "the job ended before its standbys were warm"
    cold = _pid(launch.run_dir, 1)
    said = inject(launch.run_dir, Injection("kill-rank", rank=1))
    assert "kill-rank rank 1 on node2" in said, said
    _until(launch.run_dir, re.escape(FORKED), 1, 60)
    log = _until(launch.run_dir, r"rank 1: attempt 1 starts at step [1-9]\d*", 1, 60)  # from its snapshot
    _until(launch.run_dir, r"rank 0: step \d+ first_step_time", 2, 60)  # the forked attempt trains
    assert _pid(launch.run_dir, 1) != cold
    said = inject(launch.run_dir, Injection("kill-rank", rank=0))  # a forked rank, killed by its pid
    assert "kill-rank rank 0 on node1" in said, said
    _until(launch.run_dir, re.escape(FORKED), 2, 60)
    record = _wait(ex, record, 300)
    log = _logs(launch.run_dir)
    assert record.state == "COMPLETED", f"{record.error}\n{log[-4000:]}"
    attempts = History.load(launch.run_dir).attempts
    assert len(attempts) == 3, ([(a.outcome, a.why) for a in attempts], log[-4000:])
    first, second, third = attempts
    assert first.job == second.job == third.job and all(a.inside_job for a in (first, second))  # no requeue
    assert "rank 1 on node2 was killed by a signal" in first.why, first.why
    assert "rank 0 on node1 was killed by a signal" in second.why, second.why  # not its peer
    assert "srun: error: node2: task 1: " in log.split(FORKED, 1)[1]  # ended (its peer gone, or killed by the agent)
    assert re.search(r"rank 0: attempt 2 starts at step [1-9]\d*", log), log[-3000:]
    assert "ranks_at" in second.times and "joined_at" in third.times  # (no rank API: no step marks)
    assert json.loads((ckpt / "done.json").read_text())["steps"] == 800
    assert no_job_processes()  # no standby, no forked rank left
