"""A run of jobs.train killed past its last checkpoint and resumed, with DataLoader workers drawing
random augmentations, ends on the very weights of an uninterrupted run, and its metrics and
report show each step once, as the resumed attempt trained it."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from orchestrator.backends.local.executor import LocalExecutor
from orchestrator.plan import LaunchPlan
from orchestrator.core.records import RunRecord
from orchestrator.core.states import TERMINAL
from tests.integration.helpers import final_weights, leftover_ranks, make_plan, run_local, start_detached, wait_ended

# 2 ranks x 2 workers on digits-aug (each image shifted and noised from torch's, Python's and
# NumPy's generators in the workers): 1437 // 2 // 32 = 22 steps an epoch, 44 in all. Checkpoints
# every 15 steps and at each epoch's end: at 30 the run is 8 steps into epoch 1, and the kill lands
# between 33 and 43 (the next checkpoint is the last, at 44).
ARGS = {"dataset": "digits-aug", "model": "smallcnn", "batch-size": 32, "lr": 0.05, "momentum": 0.9,
        "epochs": 2, "max-steps": 0, "log-every": 1, "workers": 2}
STEPS_PER_EPOCH, TOTAL, KILL_AT = 22, 44, 33
CHECKPOINT = {"interval_steps": 15}


def _logged(launch: LaunchPlan) -> list[dict]:
    """Rank 0's metrics records, as written (a line being written is skipped)."""
    path = Path(launch.run_dir) / "metrics" / "rank-0.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _kill_past_a_checkpoint(launch: LaunchPlan) -> RunRecord:
    """Start the run and SIGKILL rank 0 once it has logged step KILL_AT: no checkpoint at the kill."""
    ex = LocalExecutor()
    record = ex.submit(launch)
    deadline = time.monotonic() + 120
    while not any(r["kind"] == "train" and r["step"] >= KILL_AT for r in _logged(launch)[-3:]):
        assert time.monotonic() < deadline, "training never got that far"
        time.sleep(0.02)
    os.kill(RunRecord.load(launch.run_dir).rank_pids[0], signal.SIGKILL)
    until = time.monotonic() + 60
    while (record := ex.refresh([RunRecord.load(record.run_dir)])[0]).state not in TERMINAL:
        assert time.monotonic() < until, "the killed run never ended"
        time.sleep(0.1)
    return record


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """An uninterrupted run, and the same run killed at step KILL_AT and run again (it resumes)."""
    tmp = tmp_path_factory.mktemp("resume-exact")
    with pytest.MonkeyPatch.context() as mp:  # the registry's own per-test fixture comes after this one
        mp.setenv("ORCHESTRATOR_HOME", str(tmp / "home"))
        whole = make_plan(tmp / "a", nodes=1, cpu_ranks_per_node=2, args=ARGS, checkpoint=CHECKPOINT)
        start_detached(whole)  # the uninterrupted reference trains while the other run is killed and resumed
        launch = make_plan(tmp / "b", nodes=1, cpu_ranks_per_node=2, args={**ARGS, "step-delay": 0.02},
                           checkpoint=CHECKPOINT)
        killed = _kill_past_a_checkpoint(launch)
        assert killed.state == "FAILED" and "SIGKILL" in (killed.error or ""), killed.error
        until = time.monotonic() + 10  # the supervisor records the end, then exits
        while leftover_ranks(launch.run_dir):
            assert time.monotonic() < until, leftover_ranks(launch.run_dir)
            time.sleep(0.1)
        before = _logged(launch)
        resumed = run_local(launch)
        assert resumed.state == "COMPLETED" and resumed.attempts == 2, resumed.error
        assert wait_ended(whole).state == "COMPLETED"
        yield {"whole": whole, "launch": launch, "logged_before_resume": before, "home": tmp / "home"}


def _resumed_from(launch: LaunchPlan) -> int:
    result = json.loads((Path(launch.run_dir) / "result.json").read_text())["result"]
    assert result["global_step"] == TOTAL
    return result["resumed_from_step"]


def test_resume_with_workers_drawing_augmentations_is_bit_exact(runs: dict[str, Any]) -> None:
    launch = runs["launch"]
    start = _resumed_from(launch)
    assert start % 15 == 0 and start % STEPS_PER_EPOCH, f"resumed from step {start}: not mid-epoch"
    a, b = final_weights(runs["whole"]), final_weights(launch)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after a resume with DataLoader workers"


def test_after_a_resume_the_metrics_and_report_show_each_step_once(runs: dict[str, Any],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.front.report import read_metrics, write_report

    launch = runs["launch"]
    start = _resumed_from(launch)
    before = [r["step"] for r in runs["logged_before_resume"] if r["kind"] == "train"]
    assert max(before) > start, "the killed attempt logged no step past its checkpoint"
    logged = [r["step"] for r in _logged(launch) if r["kind"] == "train"]
    assert len(logged) > TOTAL, "the file keeps the steps the killed attempt logged past its checkpoint"

    metrics = read_metrics(Path(launch.run_dir))
    train = [m for m in metrics if m["kind"] == "train"]
    assert [m["step"] for m in train] == list(range(1, TOTAL + 1))
    assert [m["attempt"] for m in train] == [0] * start + [1] * (TOTAL - start)
    # Bit-exact: the loss of every step is the uninterrupted run's.
    whole = {m["step"]: m["loss"] for m in read_metrics(Path(runs["whole"].run_dir)) if m["kind"] == "train"}
    assert [m["loss"] for m in train] == [whole[s] for s in range(1, TOTAL + 1)]
    assert [m["epoch"] for m in metrics if m["kind"] == "eval"] == [1, 2]
    assert sorted((m["rank"], m["epoch"]) for m in metrics if m["kind"] == "throughput") == [
        (0, 0), (0, 1), (1, 0), (1, 1)]

    monkeypatch.setenv("ORCHESTRATOR_HOME", str(runs["home"]))
    summary = write_report(launch.run_dir)
    assert f"steps {TOTAL}, final train loss {whole[TOTAL]:.4f}" in summary, summary
    assert "over 2 epoch(s)" in summary, summary
