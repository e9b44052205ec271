"""The public rank API (``import jobs``): a user script built on it (jobs/examples/rank_api_example.py)
resumes bit-exactly after a real USR2 preemption, with real processes; and the API's pieces."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from orchestrator.backends.local.executor import LocalExecutor
from orchestrator.core.records import RunRecord
from orchestrator.core.states import TERMINAL
from tests.integration.helpers import final_weights, leftover_ranks, make_plan, run_local, start_detached, wait_ended

EXAMPLE = "jobs.examples.rank_api_example:main"
# 4 ranks (with 2, a reduction is one addition and would hide summation-order effects); 2 epochs
# of 32 steps; a checkpoint every 10 steps that the preemption must not depend on.
ARGS = {"epochs": 2, "batch-size": 32}
TOTAL = 2 * (4096 // 4 // 32)


def _result(launch) -> dict:  # type: ignore[no-untyped-def]
    return json.loads((Path(launch.run_dir) / "result.json").read_text())["result"]


def _train_steps(launch, since: float) -> list[int]:  # type: ignore[no-untyped-def]
    rows = map(json.loads, (Path(launch.run_dir) / "metrics" / "rank-0.jsonl").read_text().splitlines())
    return [r["step"] for r in rows if r["kind"] == "train" and r["time"] >= since]


def test_user_script_on_the_rank_api_resumes_bit_exactly_after_usr2(tmp_path: Path) -> None:
    whole = make_plan(tmp_path / "a", entrypoint=EXAMPLE, nodes=2, cpu_ranks_per_node=2, args=ARGS,
                      checkpoint={"interval_steps": 10})
    start_detached(whole)  # the uninterrupted reference trains while the other run is preempted

    launch = make_plan(tmp_path / "b", entrypoint=EXAMPLE, nodes=2, cpu_ranks_per_node=2,
                       args={**ARGS, "step-delay": 0.1}, checkpoint={"interval_steps": 10})
    ex = LocalExecutor()
    record = ex.submit(launch)
    from orchestrator.core.progress import read_progress

    deadline = time.monotonic() + 120
    while not ((seen := read_progress(launch.run_dir, 4)[2]) is not None and seen.step >= 13):
        assert time.monotonic() < deadline, "training never got going"
        time.sleep(0.05)
    # A preemption that reaches one rank only (here rank 2): the ranks agree on it at the next step.
    os.kill(RunRecord.load(launch.run_dir).rank_pids[2], signal.SIGUSR2)
    until = time.monotonic() + 300
    while (first := ex.refresh([RunRecord.load(record.run_dir)])[0]).state not in TERMINAL:
        assert time.monotonic() < until, "the run never ended"
        time.sleep(0.2)
    assert first.state == "COMPLETED", first.error
    stopped = _result(launch)
    assert stopped["stopped"] == "peer" and 13 <= stopped["step"] < TOTAL, stopped  # rank 0 learnt it from rank 2
    gone_by = time.monotonic() + 10  # the detached supervisor records the end state, then exits
    while leftover_ranks(launch.run_dir) and time.monotonic() < gone_by:
        time.sleep(0.1)
    assert not leftover_ranks(launch.run_dir)
    from jobs.checkpoint import latest_checkpoint, load_checkpoint

    mid = latest_checkpoint(launch.payload.checkpoint.dir)
    assert mid is not None and load_checkpoint(mid)["step"] == stopped["step"], "no checkpoint at the stop"

    resumed_at = time.time()
    again = run_local(launch)  # the same spec again: the next attempt
    assert again.state == "COMPLETED" and again.attempts == 2, again.error
    log = (Path(launch.run_dir) / "logs" / "rank-0.log").read_text().split("=== attempt 2")[1]
    assert f"resumed from {mid} at step {stopped['step']}" in log, log[-2000:]
    assert f"stopped at step {stopped['step']} by a peer; checkpoint written" in \
        (Path(launch.run_dir) / "logs" / "rank-0.log").read_text().split("=== attempt 2")[0]
    assert _train_steps(launch, resumed_at) == list(range(stopped["step"] + 1, TOTAL + 1))  # only the rest
    assert wait_ended(whole).state == "COMPLETED"
    assert _result(whole)["step"] == TOTAL
    assert _result(launch)["loss"] == _result(whole)["loss"]
    a, b = final_weights(whole), final_weights(launch)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after the preemption and resume"
    # The heartbeat: every rank's last report is the last step (the writer's 1/s limit notwithstanding).
    # One heartbeat file per node (2 nodes x 2 ranks), published by one of its ranks.
    for rank, report in enumerate(read_progress(launch.run_dir, 4)):
        assert report is not None and (report.step, report.total) == (TOTAL, TOTAL), (rank, report)
    assert sorted(p.name for p in (Path(launch.run_dir) / "progress").iterdir()) == ["node-0.json", "node-1.json"]
    from orchestrator.front.report import write_report

    summary = write_report(launch.run_dir)
    assert "final train loss" in summary and "rank 3:" in summary, summary


def test_import_jobs_is_cheap_and_names_no_submodule() -> None:
    code = ("import sys, pkgutil, jobs\n"
            "assert 'torch' not in sys.modules, 'import jobs imported torch'\n"
            "subs = {m.name for m in pkgutil.iter_modules(jobs.__path__)}\n"
            "print(sorted(set(jobs.__all__) & subs))\n"
            "for name in jobs.__all__:\n"
            "    getattr(jobs, name)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # A public name equal to a submodule's would be replaced by the module once anything imports it.
    assert proc.stdout.strip() == "[]", proc.stdout


def test_stop_flag_agrees_then_marks_the_job_requeueable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import jobs

    marker = tmp_path / "requeue" / "marker"
    monkeypatch.setenv("ORCH_REQUEUE_MARKER", str(marker))
    monkeypatch.setenv("RANK", "0")
    with jobs.StopFlag() as stop:
        assert not stop.should_stop() and not stop.checkpointed() and not marker.exists()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert not stop.should_stop(step=7, every=5), "checked off its interval"
        assert stop.should_stop(step=10, every=5) and stop.signal_name == "SIGUSR2"
        assert stop.checkpointed() and marker.read_text() == "checkpointed\n"
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL  # the handlers were put back


def test_heartbeat_writes_this_ranks_progress_at_most_once_a_second(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import jobs

    monkeypatch.setenv("ORCH_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("ORCH_ATTEMPT", "2")
    assert jobs.heartbeat(1, 100, samples=64)
    assert not jobs.heartbeat(2, 100, samples=64)  # within the second: nothing written
    assert jobs.heartbeat(100, 100, samples=64)  # the last step always is
    report = json.loads((tmp_path / "progress" / "rank-3.json").read_text())
    assert (report["rank"], report["step"], report["total"], report["attempt"]) == (3, 100, 100, 2)
    assert report["samples_per_s"] > 0
    monkeypatch.delenv("ORCH_RUN_DIR")
    assert not jobs.heartbeat(5)  # outside the orchestrator: nothing to write to


def test_heartbeat_of_a_rank_with_a_node_goes_into_its_nodes_file(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank that knows its node (GROUP_RANK, LOCAL_RANK: every rank the orchestrator starts)
    stages its report on the node's own memory, and the node's one file holds it."""
    import jobs
    from orchestrator.core import progress

    for name, value in {"ORCH_RUN_DIR": str(tmp_path), "RANK": "5", "ORCH_ATTEMPT": "1", "GROUP_RANK": "2",
                        "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    assert jobs.heartbeat(7, 7, samples=8)  # the last step: published at once
    assert [p.name for p in (tmp_path / "progress").iterdir()] == ["node-2.json"]
    assert progress.read_progress(tmp_path, 6)[5].step == 7  # type: ignore[union-attr]
    staging = progress.staging_dir(tmp_path, 1, 2)
    assert staging.is_dir()
    progress.leave()  # the rank ends: its node's staging folder goes with its last rank
    assert not staging.exists()


def test_settling_ddp_buckets_changes_nothing_but_the_layout(tmp_path: Path) -> None:
    """wrap_model's first-step bucket settling (a forward and backward before the first training
    step) leaves weights, BatchNorm statistics and RNG as if it had not run: one step through DDP
    (1 rank) equals one step of the bare model."""
    code = f"""
import os, torch, jobs
from torch import nn
os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", ORCH_BACKEND="gloo",
                  ORCH_INIT_METHOD="file://{tmp_path}/rdv", ORCH_RUN_DIR="{tmp_path}")
def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.5), nn.Flatten(), nn.LazyLinear(2))
def step(model):
    torch.manual_seed(1)
    x = torch.randn(8, 3, 6, 6)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    model(x).sum().backward()
    opt.step()
    return [t.detach().clone() for t in list(model.parameters()) + list(model.buffers())], torch.rand(3)
bare = net(); bare(torch.randn(1, 3, 6, 6))
want = step(bare)
with jobs.process_group() as ctx:
    model = net(); model(torch.randn(1, 3, 6, 6))
    ddp = jobs.wrap_model(model, ctx)
    assert type(ddp).__name__ == "DistributedDataParallel", type(ddp)
    got = step(ddp)
assert len(got[0]) == len(want[0])
assert all(torch.equal(a, b) for a, b in zip(got[0], want[0])), "weights or BatchNorm statistics differ"
assert torch.equal(got[1], want[1]), "the RNG moved"
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_grad_compression_values_are_checked() -> None:
    from jobs.runtime import RuntimeConfig

    assert RuntimeConfig.from_env({"ORCH_GRAD_COMPRESSION": "bf16"}).grad_compression == "bf16"
    assert RuntimeConfig.from_env({}).grad_compression == "none"
    with pytest.raises(ValueError, match="ORCH_GRAD_COMPRESSION='fp8' is not one of none, fp16, bf16"):
        RuntimeConfig.from_env({"ORCH_GRAD_COMPRESSION": "fp8"})


@pytest.mark.parametrize("compression,dtype", [("none", None), ("fp16", "float16"), ("bf16", "bfloat16")])
def test_wrap_model_compresses_gradients_as_the_spec_asks(tmp_path: Path, compression: str, dtype: str | None) -> None:
    """distributed.grad_compression (ORCH_GRAD_COMPRESSION) reaches DDP: the all-reduced gradients
    are those of the bare model rounded to that precision (1 rank: the sum is the value itself)."""
    code = f"""
import os, torch, jobs
from torch import nn
os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", ORCH_BACKEND="gloo",
                  ORCH_INIT_METHOD="file://{tmp_path}/rdv", ORCH_GRAD_COMPRESSION="{compression}")
torch.manual_seed(0)
bare, x = nn.Linear(64, 8), torch.randn(16, 64)
bare(x).pow(2).sum().backward()
want = bare.weight.grad.clone()
bare.weight.grad = None
dtype = {dtype!r}
if dtype:
    want = want.to(getattr(torch, dtype)).float()
with jobs.process_group() as ctx:
    model = jobs.wrap_model(bare, ctx)
    model(x).pow(2).sum().backward()  # the first step: settled first, then this one
    got = bare.weight.grad
assert torch.equal(got, want), (got - want).abs().max()
print("ok", torch.equal(got, want.to(torch.float16).float()) if dtype is None else "")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]
    if compression == "none":  # the check above can tell the precisions apart
        assert proc.stdout.split() == ["ok", "False"], proc.stdout
