"""A user script on the public rank API (jobs/examples/rank_api_example.py) on the 2-node SLURM
cluster: a real time limit's USR2 stops it, the ranks checkpoint together, the agent requeues it
(slurm.requeue: auto, on the rank API's marker), and the next attempt resumes to the very weights
and loss of an uninterrupted run."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import torch

from orchestrator.backends.slurm.executor import SlurmExecutor
from orchestrator.core.records import RunRecord

from .test_slurm import no_job_processes, run, slurm_plan, start_held_job

EXAMPLE = "jobs.examples.rank_api_example:main"
ARGS = {"epochs": 2, "batch-size": 32}
TOTAL = 2 * (4096 // 4 // 32)  # 4 ranks (2 nodes x 2)


def _weights(checkpoint_dir: str) -> dict[str, torch.Tensor]:
    from jobs.checkpoint import latest_checkpoint, load_checkpoint

    path = latest_checkpoint(checkpoint_dir)
    assert path is not None, f"no checkpoint in {checkpoint_dir}"
    return load_checkpoint(path)["model"]


def _result(run_dir: str) -> dict:
    return json.loads((Path(run_dir) / "result.json").read_text())["result"]


def _stops_and_resumes(run_dir: str, signal: str) -> tuple[str, list[int], list[int]]:
    """Rank 0's log over every attempt, the steps where the ranks stopped on ``signal`` (or a
    peer's) and checkpointed, and the steps each later attempt resumed from."""
    rank0 = "".join(p.read_text() for p in sorted((Path(run_dir) / "slurm").glob("*_0_log.out")))
    stops = [int(s) for s in re.findall(rf"^stopped at step (\d+) by (?:{signal}|a peer); checkpoint written$",
                                        rank0, re.M)]
    resumes = [int(s) for s in re.findall(r"^resumed from .*ckpt-\d+\.pt at step (\d+)$", rank0, re.M)]
    return rank0, stops, resumes


def test_rank_api_script_resumes_bit_exactly_after_its_time_limit(cluster: dict[str, str]) -> None:
    whole = slurm_plan(cluster, name="rank-api-whole", entrypoint=EXAMPLE, args=ARGS, checkpoint={"interval_steps": 10})
    assert run(whole).state == "COMPLETED"
    assert _result(whole.run_dir)["step"] == TOTAL

    # A real 3-minute limit: USR2 comes 120 s before it, to the batch shell (as at a time limit or a
    # preemption), part-way through the 64 steps of 1 s; the agent forwards it to every rank. The
    # requeued attempt gets 10 minutes, as an admin may give it: a slow start under load (the
    # suites run side by side) once left attempt after attempt a few steps each, until the
    # requeues ran out.
    launch = slurm_plan(cluster, name="rank-api-preempted", entrypoint=EXAMPLE, args={**ARGS, "step-delay": 1.0},
                        checkpoint={"interval_steps": 10},
                        slurm={"time": "3", "signal_margin_s": 120, "requeue": "auto", "max_requeues": 3})
    ex = SlurmExecutor()
    record = ex.submit(launch)
    final = _run_releasing_requeues(ex, record, timeout=900, then_time_limit="10")
    rank0, stops, resumes = _stops_and_resumes(launch.run_dir, "SIGUSR2")
    assert final.state == "COMPLETED", (final.error, rank0[-3000:])
    requeues = rank0.count("slurm.requeue: auto: requeueing")
    assert stops and requeues >= 1 and len(resumes) == requeues, rank0[-3000:]
    # Every attempt after the first started mid-run, from the checkpoint the ranks wrote together at the stop.
    assert resumes == stops[:requeues] and all(0 < s < TOTAL for s in resumes), (stops, resumes)
    result = _result(launch.run_dir)
    assert result["step"] == TOTAL, result
    assert result["loss"] == _result(whole.run_dir)["loss"]
    a, b = _weights(whole.payload.checkpoint.dir), _weights(launch.payload.checkpoint.dir)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after the time limit and requeue"
    from orchestrator.core.progress import read_progress

    progress = read_progress(launch.run_dir, 4)[3]  # inside a job: progress/node-G.json (issue 36)
    assert progress is not None and (progress.step, progress.attempt) == (TOTAL, requeues), progress  # the last attempt's heartbeat
    assert no_job_processes()


def _run_releasing_requeues(ex: SlurmExecutor, record: RunRecord, timeout: float,
                            then_time_limit: str | None = None) -> RunRecord:
    """Until the job ends; SLURM holds a requeued job ~2 minutes (BeginTime): start it at once
    (``then_time_limit``: with this time limit, as an admin may give a requeued job)."""
    deadline = time.monotonic() + timeout
    while True:
        record = ex.refresh([RunRecord.load(record.run_dir)])[0]
        if record.state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):  # as test_slurm.run_wait
            return record
        assert time.monotonic() < deadline, record
        job = record.job_ids[0]
        if "Reason=BeginTime" in subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout:
            if then_time_limit:
                subprocess.run(["scontrol", "update", f"jobid={job}", f"TimeLimit={then_time_limit}"], check=True)
            start_held_job(job)
        time.sleep(0.5)


@pytest.mark.parametrize("gate", [True, False])
def test_a_checkpoint_folder_the_nodes_do_not_share_fails_the_job_naming_the_ranks(cluster: dict[str, str],
                                                                                    gate: bool) -> None:
    """The site profile gives every node its own /mnt/orch-node-local (a node's local disk). With
    the checkpoints there, rank 0 would resume from its own and node 2's ranks from nothing, and
    the weights would part ways; instead the health gate (the job agent's token in the folder,
    looked for by every node) fails the job before any rank starts, naming the nodes and the field; with
    the gate off, the ranks prove at the start that they all see the folder rank 0 sees, and the job
    fails at once naming the ranks and the fix."""
    launch = slurm_plan(cluster, name=f"nodelocal-{gate}", entrypoint=EXAMPLE, args=ARGS,
                        checkpoint={"dir": "/mnt/orch-node-local/ckpt", "interval_steps": 10},
                        recovery={"health_check": gate})
    record = run(launch)
    logs = "".join(p.read_text() for p in sorted((Path(launch.run_dir) / "slurm").glob("*_log.out")))
    assert record.state == "FAILED", (record.error, logs[-3000:])
    if gate:  # the agent runs on the batch node (node1): node2 does not see its token, and is all the others
        error = record.error or ""
        why = ("node2 does not see the job agent's health token under /mnt/orch-node-local/ckpt after 60s: "
               "is checkpoint.dir shared between the nodes?")
        folder = ("checkpoint.dir /mnt/orch-node-local/ckpt is not one folder the nodes share: 1 of the 1 node(s) "
                  "besides node1 (the job agent's) do not see what the agent wrote there")
        assert why in error and error.count(folder) == 2, (error, logs[-3000:])  # both nodes blamed, for the folder
        assert "node1: " in error and "; node2: " in error, error
        assert "[launcher] rank " not in logs, logs[-3000:]  # no rank started
    else:
        why = "rank(s) 2, 3 (on node2) cannot see the checkpoint folder /mnt/orch-node-local/ckpt as rank 0 does"
        assert why in (record.error or "") + logs, (record.error, logs[-3000:])
        assert "shared filesystem" in (record.error or "") + logs
    assert no_job_processes()
