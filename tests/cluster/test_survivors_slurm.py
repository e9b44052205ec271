"""recovery.survivors: keep on the SLURM cluster (issue 50): a rank killed by `orchestrator chaos`
on its node is forked again from that node's warm standby beside the survivors' still running
step; the survivors keep their processes, the group is rebuilt (jobs.heal) and the replacement gets
the model, optimizer and step from a survivor by broadcast, no checkpoint read. Then the replacement
is frozen (`chaos --stop-rank`): the watchdog names it, it alone is killed and replaced again. One
SLURM job, never requeued, COMPLETED, and its weights equal those of the same job run without
either failure, bit for bit."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import torch

from orchestrator.backends.slurm.executor import SlurmExecutor
from orchestrator.core.recovery import History
from orchestrator.core.records import RunRecord
from orchestrator.front.chaos import Injection, inject

from .test_slurm import no_job_processes, slurm_plan

ARGS = {"dataset": "digits", "model": "smallcnn", "batch-size": 16, "lr": 0.05, "momentum": 0.9, "epochs": 4,
        "max-steps": 0, "log-every": 1}
STEPS = 4 * (1437 // 2 // 16)  # four epochs of digits, 2 ranks of 16
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY")


def _train_steps(run_dir: str) -> list[int]:
    path = Path(run_dir) / "metrics" / "rank-0.jsonl"
    if not path.exists():
        return []
    return [r["step"] for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "train"]


def _batch_log(run_dir: str) -> str:  # the agent's lines share rank 0's log (slurm/%j_0_log.out)
    return "".join(p.read_text(errors="replace") for p in sorted((Path(run_dir) / "slurm").glob("*_0_log.out")))


def _wait(ex: SlurmExecutor, record: RunRecord, timeout: float) -> RunRecord:
    deadline = time.monotonic() + timeout
    while record.state not in ENDED:
        assert time.monotonic() < deadline, f"job did not finish: {record}"
        time.sleep(0.5)
        record = ex.refresh([RunRecord.load(record.run_dir)])[0]
    return record


def _weights(folder: str) -> dict[str, torch.Tensor]:
    from jobs.checkpoint import latest_checkpoint, load_checkpoint

    path = latest_checkpoint(Path(folder))
    assert path is not None, f"no checkpoint in {folder}"
    return load_checkpoint(path)["model"]


def test_a_killed_or_hung_rank_is_forked_from_its_nodes_standby_and_rejoins_the_survivors(
        cluster: dict[str, str]) -> None:
    common = {"nodes": 2, "cpu_ranks_per_node": 1, "checkpoint": {"interval_steps": 1000}}  # no checkpoint before the end
    ex = SlurmExecutor()
    reference = slurm_plan(cluster, name="keep-whole", args=ARGS, **common)
    whole = ex.submit(reference)  # the same job without the kill, side by side
    launch = slurm_plan(cluster, name="keep-killed", args={**ARGS, "step-delay": 0.15},
                        recovery={"max_restarts": 2, "survivors": "keep"}, watchdog={"stall_s": 20}, **common)
    record = ex.submit(launch)
    deadline = time.monotonic() + 240
    while "warm standby ready on node2" not in _batch_log(launch.run_dir):  # a replacement there starts warm
        assert time.monotonic() < deadline, f"no standby on node2:\n{_batch_log(launch.run_dir)[-3000:]}"
        time.sleep(0.2)
    steps = _train_steps(launch.run_dir)
    assert steps and steps[-1] < STEPS - 40, f"the job trained to step {steps[-1:]} before its standbys were warm"
    rank0 = json.loads((Path(launch.run_dir) / "ranks" / "rank-0.json").read_text())["pid"]
    killed_after = max(_train_steps(launch.run_dir))
    said = inject(launch.run_dir, Injection("kill-rank", rank=1))
    assert "kill-rank rank 1 on node2" in said, said
    while "rank 0: rejoined in generation 1" not in _batch_log(launch.run_dir):
        assert time.monotonic() < deadline + 60, _batch_log(launch.run_dir)[-3000:]
        time.sleep(0.2)
    time.sleep(2)  # a few steps in generation 1
    said = inject(launch.run_dir, Injection("stop-rank", rank=1))  # the replacement, forked by the standby
    assert "stop-rank rank 1 on node2" in said, said
    record = _wait(ex, record, 300)
    log = _batch_log(launch.run_dir)
    assert record.state == "COMPLETED", f"{record.error}\n{log[-4000:]}"
    assert json.loads((Path(launch.run_dir) / "ranks" / "rank-0.json").read_text())["pid"] == rank0  # kept its process
    first, second, third = History.load(launch.run_dir).attempts
    assert (first.outcome, first.action, first.inside_job) == ("crash", "restart", True), first
    assert "rank 1 on node2 was killed by a signal (SIGKILL)" in first.why, first.why
    assert (second.outcome, second.action, second.inside_job) == ("hang", "restart", True), second
    assert "straggler: rank 1" in second.why, second.why
    assert third.outcome == "completed" and first.job == second.job == third.job  # one SLURM job, never requeued
    assert "first_step_at" in second.times and "first_step_at" in third.times  # each rejoined world trained
    # from where the survivors were, not their first step ever: status counts no lost work
    assert second.times["first_step"] >= killed_after - 1, (killed_after, second.times)
    assert log.count("rank 1: forked from node2's warm standby") == 2, log[-4000:]
    assert "rank 1, the straggler, killed alone on node2" in log
    for generation in (1, 2):
        assert re.search(rf"rank 0: rejoined in generation {generation} with rank\(s\) 1 in [\d.]+s; state from "
                         "rank 0", log), log[-4000:]
    assert "resumed from" not in log  # no checkpoint was read
    steps = _train_steps(launch.run_dir)
    assert steps[-1] == STEPS and len(set(steps)) == STEPS and len(steps) - STEPS <= 2, steps  # 1 in flight each
    assert _wait(ex, whole, 240).state == "COMPLETED"
    a, b = _weights(reference.payload.checkpoint.dir), _weights(launch.payload.checkpoint.dir)
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after the rejoin"
    assert no_job_processes()


def test_a_script_that_cannot_rejoin_restarts_every_rank_inside_the_job(cluster: dict[str, str]) -> None:
    """survivors: keep with a torchrun-style script (no jobs.Healer): its survivors never said they can
    rejoin, so once a rank fails the agent ends the others (the ranks' step has no
    --kill-on-bad-exit to do it) and every rank restarts inside the job from the script's snapshot."""
    from .test_recovery_slurm import _flaky, _logs, _run_through_restarts

    launch, ckpt = _flaky(cluster, "keep-torchrun", "crash_once", {"max_restarts": 2, "survivors": "keep"})
    assert "--kill-on-bad-exit=0" in launch.payload.srun
    record = _run_through_restarts(launch)
    logs = _logs(launch.run_dir)
    assert record.state == "COMPLETED", f"{record.error}\n{logs[-4000:]}"
    assert json.loads((ckpt / "done.json").read_text()) == {"steps": 12, "start": 6}
    first, second = History.load(launch.run_dir).attempts
    assert (first.outcome, first.action, first.inside_job) == ("crash", "restart", True), first
    assert "injected crash at step 7" in first.why and second.job == first.job
    # its survivor said nothing of rejoining; or, on a busy machine, it had failed too before the agent looked
    assert re.search(r"cannot rejoin \(the script does not use jobs.Healer\): every rank restarts|"
                     r"rank\(s\) 0, 1 failed and cannot rejoin the others: every rank ends|"
                     r"rank\(s\) 0, 1 failed and the ranks' step ended before a rejoin could begin", logs), logs[-3000:]
    assert "rejoin the survivors" not in logs and "kept its process" not in logs
    assert no_job_processes()
