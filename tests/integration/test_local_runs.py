"""Real multi-process gloo runs on this machine through the local executor."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from orchestrator.core.records import RunRecord
from tests.integration.helpers import (SCRIPTS, final_weights, leftover_ranks, make_plan, run_local, start_detached,
                                       wait_ended)

TRAIN_ARGS = {"dataset": "digits", "model": "smallcnn", "batch-size": 16, "lr": 0.05, "momentum": 0.0,
              "epochs": 1, "max-steps": 6, "log-every": 1}


def _reference_weights(world: int, per_rank_batch: int, steps: int, lr: float) -> dict[str, torch.Tensor]:
    """One process, combined batch: the same samples DistributedSampler gives each rank, with a
    new shuffle each epoch (set_epoch), as an uninterrupted DDP run sees them."""
    from torch.utils.data import DistributedSampler

    from jobs import data, models
    from jobs.train import seed_everything

    seed_everything(0)
    train_set = data.digits(True)
    model = models.build("smallcnn", 1, 10)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.0)
    samplers = [DistributedSampler(train_set, num_replicas=world, rank=r, shuffle=True, seed=0, drop_last=True)
                for r in range(world)]
    steps_per_epoch = samplers[0].num_samples // per_rank_batch
    per_rank: list[list[int]] = []
    for step in range(steps):
        epoch, i = divmod(step, steps_per_epoch)
        if i == 0:
            for s in samplers:
                s.set_epoch(epoch)
            per_rank = [list(s) for s in samplers]
        idx = [j for r in range(world) for j in per_rank[r][i * per_rank_batch:(i + 1) * per_rank_batch]]
        x = torch.stack([train_set[j][0] for j in idx])
        y = torch.stack([train_set[j][1] for j in idx])
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model.state_dict()


# Big per-rank batches, so that 6 steps cross epoch boundaries (2 ranks: 5 steps an epoch; 4 ranks: 2):
# a run that reshuffled the same way every epoch (no set_epoch) gives other weights.
EPOCH_ARGS = {**TRAIN_ARGS, "batch-size": 128, "epochs": 5}


@pytest.mark.parametrize("nodes,per_node,init", [(1, 2, "tcp"), (2, 2, "file")])
def test_ddp_matches_single_process_with_combined_batch(tmp_path: Path, nodes: int, per_node: int, init: str) -> None:
    # tmp_path is under /tmp, a node-local path: locally that is fine (every emulated node is this
    # machine), so a cluster's file:// spec dry-runs without rendezvous_dir_is_shared.
    launch = make_plan(tmp_path, nodes=nodes, cpu_ranks_per_node=per_node, args=EPOCH_ARGS,
                       distributed={"init_method": init, "backend": "gloo"})
    if init == "file" and nodes > 1:
        assert any("file:// rendezvous is on this machine" in n for n in launch.notes), launch.notes
    record = run_local(launch)
    assert record.state == "COMPLETED", record.error
    got = final_weights(launch)
    want = _reference_weights(nodes * per_node, 128, 6, 0.05)
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-4, atol=1e-5, msg=name)
    logs = sorted((Path(launch.run_dir) / "logs").glob("rank-*.log"))
    assert len(logs) == nodes * per_node
    result = json.loads((Path(launch.run_dir) / "result.json").read_text())["result"]
    assert result["world_size"] == nodes * per_node and result["global_step"] == 6 and result["epoch"] >= 1
    # The init method the ranks really used, and what it left behind.
    rdir = Path(launch.payload.rendezvous_dir)
    if init == "file":
        assert result["init_method"].startswith(f"file://{rdir}/rendezvous-{launch.run_id}-"), result["init_method"]
        assert rdir.is_dir(), "the rendezvous folder was never made"
        assert not Path(result["init_method"][len("file://"):]).exists(), "rendezvous file left behind"
        assert not list(rdir.iterdir()), f"left in {rdir}: {list(rdir.iterdir())}"
    else:
        assert result["init_method"] == f"tcp://127.0.0.1:{record.master_port}"


def test_torchrun_style_script_runs_unchanged(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    launch = make_plan(tmp_path, entrypoint=str(SCRIPTS / "byo_ddp.py"), nodes=2, cpu_ranks_per_node=2,
                       extra_args=["--out", str(out)])
    record = run_local(launch)
    assert record.state == "COMPLETED", record.error
    rows = [json.loads((out / f"byo-{r}.json").read_text()) for r in range(4)]
    assert [(r["rank"], r["local_rank"], r["node_rank"]) for r in rows] == [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)]
    assert all(r["sum"] == 10.0 and r["world"] == 4 for r in rows)
    # The socket interface of the local downscale reaches the script under both names.
    assert {(r["gloo_ifname"], r["nccl_ifname"]) for r in rows} == {("lo", "lo")}
    # By default ranks are forked from the launcher that pre-imported torch, not spawned by us.
    assert all("orchestrator.backends.local.zygote" in r["cmdline"] and r["ppid"] != os.getpid() for r in rows), rows


def test_an_exported_nccl_socket_ifname_reaches_the_ranks_unchanged(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """interface auto never overrides the user's NCCL_SOCKET_IFNAME (issue 32): the ranks see the
    exported value, plan says so, and gloo still gets the interface every rank meets on."""
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib7")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    out = tmp_path / "out"
    out.mkdir()
    launch = make_plan(tmp_path, entrypoint=str(SCRIPTS / "byo_ddp.py"), nodes=1, cpu_ranks_per_node=2,
                       extra_args=["--out", str(out)])
    assert "NCCL: ib7 (auto keeps it: your environment sets NCCL_SOCKET_IFNAME=ib7)" in (launch.interfaces or "")
    record = run_local(launch)
    assert record.state == "COMPLETED", record.error
    rows = [json.loads((out / f"byo-{r}.json").read_text()) for r in range(2)]
    assert {(r["gloo_ifname"], r["nccl_ifname"]) for r in rows} == {("lo", "ib7")}


def test_failing_rank_fails_the_run_fast_with_its_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRASH_RANK", "2")
    launch = make_plan(tmp_path, entrypoint="tests.integration.scripts.crash:main", nodes=2, cpu_ranks_per_node=2)
    t0 = time.monotonic()
    record = run_local(launch)
    assert record.state == "FAILED"
    assert record.failed_rank == 2
    assert "boom on rank 2" in (record.error or "") and "Traceback" in (record.error or "")
    assert time.monotonic() - t0 < 60
    assert not leftover_ranks(launch.run_dir)


def test_killed_rank_ends_the_run_within_10s(tmp_path: Path) -> None:
    args = {**TRAIN_ARGS, "max-steps": 0, "epochs": 50, "step-delay": 0.05}
    launch = make_plan(tmp_path, nodes=2, cpu_ranks_per_node=2, args=args)
    from orchestrator.executors.base import prepare_run_dir
    from orchestrator.backends.local.supervisor import Supervisor

    record, lock = prepare_run_dir(launch)
    killed: dict[str, float] = {}

    def killer() -> None:
        metrics = Path(launch.run_dir) / "metrics" / "rank-0.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if metrics.exists() and metrics.read_text().count('"train"') >= 3:
                pid = RunRecord.load(launch.run_dir).rank_pids[1]
                os.kill(pid, signal.SIGKILL)
                killed["at"] = time.monotonic()
                return
            time.sleep(0.1)

    thread = threading.Thread(target=killer)
    thread.start()
    record = Supervisor(launch, record, lock).run()
    ended = time.monotonic()
    thread.join()
    assert "at" in killed, "training never started"
    assert record.state == "FAILED" and record.failed_rank == 1
    assert "SIGKILL" in (record.error or "")
    assert ended - killed["at"] < 10
    assert not leftover_ranks(launch.run_dir)


def test_interrupt_and_resume_is_bit_identical(tmp_path: Path) -> None:
    args = {**TRAIN_ARGS, "max-steps": 0, "epochs": 2, "momentum": 0.9}
    # 4 ranks: with 2, a reduction is a single addition and would hide summation-order effects.
    whole = make_plan(tmp_path / "a", nodes=2, cpu_ranks_per_node=2, args=args)
    start_detached(whole)  # the uninterrupted reference trains while the other run is interrupted

    slow = {**args, "step-delay": 0.05}
    # Same training, but slowed down so it can be interrupted mid-epoch.
    launch = make_plan(tmp_path / "b", nodes=2, cpu_ranks_per_node=2, args=slow)
    from orchestrator.backends.local.executor import LocalExecutor

    ex = LocalExecutor()
    record = ex.submit(launch)
    metrics = Path(launch.run_dir) / "metrics" / "rank-0.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count('"train"') >= 12):
        assert time.monotonic() < deadline, "training never started"
        time.sleep(0.1)
    record = ex.cancel(record)
    assert record.state == "CANCELLED"
    assert not leftover_ranks(launch.run_dir)
    from jobs.checkpoint import latest_checkpoint, load_checkpoint

    ckpt_dir = Path(launch.payload.checkpoint.dir)
    mid_path = latest_checkpoint(ckpt_dir)
    mid = load_checkpoint(mid_path)
    steps_per_epoch = 1437 // 4 // 16
    total = 2 * steps_per_epoch
    assert 0 < mid["global_step"] < total, "the interruption did not land mid-run"
    # What a checkpoint write killed mid-way leaves behind: the resume must remove it.
    orphan = ckpt_dir / f".ckpt-{mid['global_step'] + 1:010d}.pt.4242424.tmp"
    orphan.write_bytes(b"\0" * 1_000_000)
    resumed_at = time.time()
    resumed = run_local(launch)
    assert resumed.state == "COMPLETED" and resumed.attempts == 2
    # The second attempt resumed from that checkpoint: it says so, reports it, and trained only the rest.
    log = (Path(launch.run_dir) / "logs" / "rank-0.log").read_text().split("=== attempt 2")[1]
    assert f"resumed from {mid_path} (epoch {mid['epoch']}, step {mid['global_step']})" in log, log[-2000:]
    result = json.loads((Path(launch.run_dir) / "result.json").read_text())["result"]
    assert result["resumed_from_step"] == mid["global_step"] and result["global_step"] == total
    steps = [r["step"] for r in map(json.loads, metrics.read_text().splitlines())
             if r["kind"] == "train" and r["time"] >= resumed_at]
    assert steps == list(range(mid["global_step"] + 1, total + 1)), steps
    assert not orphan.exists() and not list(ckpt_dir.glob("*.tmp"))
    assert wait_ended(whole).state == "COMPLETED"
    a, b = final_weights(whole), final_weights(launch)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after resume"


def test_unreachable_master_is_an_error_not_a_hang(tmp_path: Path) -> None:
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29999", "ORCH_INIT_METHOD": "env://", "ORCH_INIT_TIMEOUT_S": "3",
           "ORCH_RUN_DIR": str(tmp_path)}
    code = "from jobs.distributed import distributed\nwith distributed():\n    pass\n"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "could not join the process group" in proc.stderr
    assert time.monotonic() - t0 < 30


def test_debug_executor_runs_one_rank_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import jobs.train
    from orchestrator.backends.local.debug import DebugExecutor
    from orchestrator.spec.loading import spec_from_dict
    from orchestrator.plan import plan as make

    launch = make_plan(tmp_path, nodes=2, cpu_ranks_per_node=2, args=TRAIN_ARGS)
    debug = make(spec_from_dict({**launch.spec.model_dump(mode="json"), "executor": "debug"}), "debug")
    assert debug.world_size == 1
    seen: list[dict] = []
    real_train = jobs.train.train

    def spy(ctx, args, stop):  # type: ignore[no-untyped-def]
        # Called in this very process (a subprocess would never reach this function object).
        seen.append({"pid": os.getpid(), "world": ctx.world_size, "rank": ctx.rank})
        return real_train(ctx, args, stop)

    monkeypatch.setattr(jobs.train, "train", spy)
    children_before = _children()
    record = DebugExecutor().run(debug)
    assert record.state == "COMPLETED", record.error
    assert seen == [{"pid": os.getpid(), "world": 1, "rank": 0}]
    assert _children() == children_before, "the debug executor started processes"
    result = json.loads((Path(debug.run_dir) / "result.json").read_text())["result"]
    assert result["global_step"] == 6 and result["world_size"] == 1 and result["stopped"] == "max_steps"


def _children() -> set[int]:
    """Live child processes of this process."""
    kids = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                kids.add(int(pid))
    return kids


def test_inference_spread_over_ranks_matches_training_accuracy(tmp_path: Path) -> None:
    args = {**TRAIN_ARGS, "max-steps": 0, "epochs": 2}
    train = make_plan(tmp_path, nodes=1, cpu_ranks_per_node=2, args=args)
    assert run_local(train).state == "COMPLETED"
    trained = json.loads((Path(train.run_dir) / "result.json").read_text())["result"]["test_accuracy"]
    out = tmp_path / "predictions.jsonl"
    infer = make_plan(tmp_path, name="infer", entrypoint="jobs.infer:main", nodes=1, cpu_ranks_per_node=2,
                      args={"checkpoint": train.payload.checkpoint.dir, "output": str(out)})
    assert run_local(infer).state == "COMPLETED"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(359))  # every test sample once, in order
    accuracy = sum(r["prediction"] == r["label"] for r in rows) / len(rows)
    assert abs(accuracy - trained) < 1e-9


def test_allreduce_check_reports_bandwidth(tmp_path: Path) -> None:
    launch = make_plan(tmp_path, name="ar", entrypoint="jobs.allreduce:main", nodes=2, cpu_ranks_per_node=1,
                       args={"sizes-mb": [1, 4], "iters": 3})
    assert run_local(launch).state == "COMPLETED"
    report = json.loads((Path(launch.run_dir) / "allreduce.json").read_text())
    assert report["world_size"] == 2 and [r["size_mb"] for r in report["rows"]] == [1, 4]
    for row in report["rows"]:
        assert row["algbw_gbps"] > 0 and row["busbw_gbps"] == pytest.approx(row["algbw_gbps"])  # 2(n-1)/n = 1


def test_local_timeout_stops_every_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRASH_RANK", "-1")  # nobody crashes: every rank sleeps
    launch = make_plan(tmp_path, entrypoint="tests.integration.scripts.crash:main", nodes=1, cpu_ranks_per_node=2,
                       local={"timeout_s": 4})
    t0 = time.monotonic()
    record = run_local(launch)
    assert record.state == "TIMEOUT" and "timeout_s" in (record.error or "")
    assert time.monotonic() - t0 < 30
    assert not leftover_ranks(launch.run_dir)


def test_local_sweep_runs_every_point(tmp_path: Path) -> None:
    out = tmp_path / "points"
    out.mkdir()
    launch = make_plan(tmp_path, entrypoint=str(SCRIPTS / "point.py"), args={"out": str(out)},
                       sweep={"x": [1, 2, 3]})
    record = run_local(launch)
    assert record.state == "COMPLETED", record.error
    assert sorted(p.read_text() for p in out.glob("point-*.txt")) == ["1", "2", "3"]


def test_a_failed_sweep_point_does_not_stop_the_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a SLURM job array: every point runs whatever another's outcome; the run is FAILED, its
    error names the point, and each point's state is recorded (``status`` shows the grid)."""
    out = tmp_path / "points"
    out.mkdir()
    monkeypatch.setenv("FAIL_AT_X", "2")
    launch = make_plan(tmp_path, entrypoint=str(SCRIPTS / "point.py"), args={"out": str(out)},
                       sweep={"x": [1, 2, 3]})
    record = run_local(launch)
    assert record.state == "FAILED"
    assert sorted(p.read_text() for p in out.glob("point-*.txt")) == ["1", "2", "3"]  # point 2 ran before failing
    assert record.point_states == {"0": "COMPLETED", "1": "FAILED", "2": "COMPLETED"}
    assert (record.error or "").startswith("point 1 (x=2) ended FAILED:") and "fails on purpose" in record.error


def test_fresh_interpreters_when_preload_is_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """local.preload_torch: false starts each rank as its own interpreter, as on SLURM."""
    out = tmp_path / "out"
    out.mkdir()
    launch = make_plan(tmp_path, entrypoint=str(SCRIPTS / "byo_ddp.py"), nodes=1, cpu_ranks_per_node=2,
                       extra_args=["--out", str(out)], local={"preload_torch": False})
    record = run_local(launch)
    assert record.state == "COMPLETED", record.error
    rows = [json.loads((out / f"byo-{r}.json").read_text()) for r in range(2)]
    assert all(r["sum"] == 3.0 for r in rows)
    # Fresh interpreters: each exec'd as 'python -c BOOTSTRAP orchestrator.node.launcher PAYLOAD' by the run's
    # zygote (one parent for all ranks, which stops their leftovers), never a fork that kept
    # the pre-imported launcher's command line.
    assert len({r["ppid"] for r in rows}) == 1 and rows[0]["ppid"] != os.getpid()
    for r in rows:
        assert "sys.path.pop(0)" in r["cmdline"] and " orchestrator.node.launcher " in r["cmdline"], r
        assert "zygote" not in r["cmdline"], r
    assert sorted(r["pid"] for r in rows) == sorted(record.rank_pids)
    monkeypatch.setenv("CRASH_RANK", "1")
    crash = make_plan(tmp_path, name="crash", entrypoint="tests.integration.scripts.crash:main", nodes=1,
                      cpu_ranks_per_node=2, local={"preload_torch": False})
    failed = run_local(crash)
    assert failed.state == "FAILED" and failed.failed_rank == 1 and "boom on rank 1" in (failed.error or "")
    assert not leftover_ranks(crash.run_dir)


def test_every_rank_finds_the_checkpoint_when_save_returns(tmp_path: Path) -> None:
    """The barrier after rank 0's write: no rank goes on before the checkpoint is complete."""
    launch = make_plan(tmp_path, name="barrier", entrypoint="tests.integration.scripts.ckpt_barrier:main",
                       nodes=1, cpu_ranks_per_node=2, extra_args=["--dir", str(tmp_path / "ckpt")])
    record = run_local(launch)
    assert record.state == "COMPLETED", record.error


def test_python_m_jobs_train_runs(tmp_path: Path) -> None:
    """python -m jobs.train (and so torchrun -m jobs.train) trains, and refuses intervals of 0."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(ORCH_RUN_DIR=str(tmp_path), ORCH_CHECKPOINT_DIR=str(tmp_path / "ckpt"))
    helped = subprocess.run([sys.executable, "-m", "jobs.train", "--help"], capture_output=True, text=True,
                            timeout=120, env=env)
    assert helped.returncode == 0 and "--stop-check-every" in helped.stdout and "--max-steps" in helped.stdout
    trained = subprocess.run([sys.executable, "-m", "jobs.train", "--max-steps", "3", "--log-every", "1"],
                             capture_output=True, text=True, timeout=120, env=env)
    assert trained.returncode == 0, trained.stderr
    assert "step 3/" in trained.stdout and list((tmp_path / "ckpt").glob("ckpt-*.pt"))
    for bad in (["--stop-check-every", "0"], ["--log-every", "-1"], ["--batch-size", "0"]):
        refused = subprocess.run([sys.executable, "-m", "jobs.train", *bad], capture_output=True, text=True,
                                 timeout=120, env=env)
        assert refused.returncode == 2 and bad[0] in refused.stderr, refused.stderr


def _two_ranks(cmd: list[str], rfile: Path, tmp_path: Path) -> None:
    """Start 2 ranks of cmd joined through file://rfile, without any supervisor, and wait for both."""
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
               "ORCH_INIT_METHOD": f"file://{rfile}", "ORCH_INIT_TIMEOUT_S": "60", "ORCH_BACKEND": "gloo",
               "ORCH_RUN_DIR": str(tmp_path), "ORCH_CHECKPOINT_DIR": str(tmp_path / "ckpt")}
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs


def test_ranks_remove_the_rendezvous_file_themselves(tmp_path: Path) -> None:
    """Without the local supervisor (as on SLURM) the ranks leave no file:// rendezvous file behind:
    jobs' process group teardown removes it, and so does the launcher after any entrypoint."""
    rdir = tmp_path / "rdv"
    rdir.mkdir()
    _two_ranks([sys.executable, "-m", "jobs.train", "--max-steps", "2", "--batch-size", "16"], rdir / "a", tmp_path)
    assert not list(rdir.iterdir()), f"jobs.train left {list(rdir.iterdir())}"
    launch = make_plan(tmp_path, name="rdv", entrypoint=str(SCRIPTS / "file_init_no_teardown.py"))
    payload = tmp_path / "payload.json"
    payload.write_text(launch.payload.to_json())
    _two_ranks([sys.executable, "-m", "orchestrator.node.launcher", str(payload)], rdir / "b", tmp_path)
    assert not list(rdir.iterdir()), f"a script that never tore its group down left {list(rdir.iterdir())}"


def test_a_script_that_never_destroys_its_group_exits_cleanly(tmp_path: Path) -> None:
    """torch aborts now and then at the exit of a rank whose gloo group is still up ("terminate
    called without an active exception": 7 of 60 ranks under plain python here); the launcher
    destroys the group a script returned without destroying, as the last exit hook: the script's
    own hook still all_reduces through it. Several rounds of 2 ranks, every exit code checked."""
    out = tmp_path / "out"
    launch = make_plan(tmp_path, name="left", entrypoint=str(SCRIPTS / "file_init_no_teardown.py"),
                       extra_args=[str(out)])
    payload = tmp_path / "payload.json"
    payload.write_text(launch.payload.to_json())
    for round_ in range(5):
        out.mkdir()
        _two_ranks([sys.executable, "-m", "orchestrator.node.launcher", str(payload)], tmp_path / f"rdv-{round_}", tmp_path)
        assert {p.name: p.read_text() for p in out.iterdir()} == {"left-0": "4.0", "left-1": "4.0"}
        shutil.rmtree(out)


@pytest.mark.parametrize("preload", [True, False])
def test_work_a_script_does_as_it_exits_is_kept(tmp_path: Path, preload: bool) -> None:
    """A thread still writing after the script's last line, an atexit hook, a file never closed, a C stream:
    kept, as under plain python, by forked ranks (preload) as by fresh interpreters."""
    out = tmp_path / "out"
    out.mkdir()
    record = run_local(make_plan(tmp_path, name="exitwork", entrypoint=str(SCRIPTS / "exit_work.py"),
                                 extra_args=[str(out)], cpu_ranks_per_node=2, local={"preload_torch": preload}))
    assert record.state == "COMPLETED", record.error
    assert {p.name: p.read_text() for p in out.iterdir()} == \
        {f"{what}-{r}": "done" for what in ("thread", "atexit", "unclosed", "cstdio") for r in range(2)}


@pytest.mark.parametrize("preload", [True, False])
def test_objects_a_script_leaves_are_finalized_as_under_python(tmp_path: Path, preload: bool) -> None:
    """A gzip file and a zip archive left open, and an object with a finalizer: python's exit
    finalizes them (a valid trailer, a central directory, the finalizer's file). So does a forked
    rank, by dropping the script's own namespace before it leaves, whatever the objects are."""
    import gzip
    import zipfile

    out = tmp_path / "out"
    out.mkdir()
    record = run_local(make_plan(tmp_path, name="archives", entrypoint=str(SCRIPTS / "exit_archives.py"),
                                 extra_args=[str(out)], cpu_ranks_per_node=2, local={"preload_torch": preload}))
    assert record.state == "COMPLETED", record.error
    for r in range(2):
        assert gzip.open(out / f"log-{r}.gz", "rt").read() == "done"
        assert zipfile.ZipFile(out / f"bundle-{r}.zip").read("inside.txt") == b"done"
        assert (out / f"finalized-{r}").read_text() == "done"


def test_the_group_is_released_only_after_a_normal_return(tmp_path: Path) -> None:
    import torch.distributed as dist

    from orchestrator.node.launcher import release_if_returned

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        release_if_returned([])  # the entrypoint raised: the group is left alone
        assert dist.is_initialized()
        release_if_returned([True])
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
