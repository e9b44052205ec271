"""The SLURM executor against real slurmctld/slurmd/slurmdbd daemons (deploy/cluster.sh)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from orchestrator.backends.slurm.executor import SlurmExecutor
from orchestrator.spec.loading import spec_from_dict
from orchestrator.plan import LaunchPlan, plan
from orchestrator.core.records import RunRecord
from tests.integration.helpers import SCRIPTS

from .streams import belongs_to_another_stream

TRAIN = {"dataset": "digits", "epochs": 1, "batch-size": 16, "momentum": 0.0, "max-steps": 8, "log-every": 2}


def slurm_plan(cluster: dict[str, str], **fields: Any) -> LaunchPlan:
    spec = {"name": "c", "entrypoint": "jobs.train:main", "executor": "slurm", "nodes": 2, "cpu_ranks_per_node": 2,
            "runs_dir": cluster["runs_dir"], "slurm": {"time": "00:10:00", "signal_margin_s": 30},
            "distributed": {"backend": "gloo", "init_method": "tcp"}, **fields}
    return plan(spec_from_dict(spec), "slurm")


def run(launch: LaunchPlan, timeout: float = 240) -> RunRecord:
    ex = SlurmExecutor()
    record = ex.submit(launch)
    deadline = time.monotonic() + timeout
    while record.state not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"):
        assert time.monotonic() < deadline, f"job did not finish: {record}"
        time.sleep(0.5)
        record = ex.refresh([RunRecord.load(record.run_dir)])[0]
    return record


def rank_processes() -> list[str]:
    """Live rank processes (python) left in the node namespaces (this session's: not those of the
    other session that tests/run_suites.py runs beside it, tests/cluster/streams.py)."""
    left = []
    for ns in ("orch-node1", "orch-node2"):
        for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
            if belongs_to_another_stream(pid):
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError):
                continue
            if "python" in cmd and state != "Z":
                left.append(f"{ns}:{pid}:{cmd}")
    return left


def no_job_processes(within_s: float = 10) -> bool:
    deadline = time.monotonic() + within_s
    while rank_processes():
        if time.monotonic() > deadline:
            print("left behind:", rank_processes())
            return False
        time.sleep(0.2)
    return True


def test_single_node_two_ranks(cluster: dict[str, str]) -> None:
    launch = slurm_plan(cluster, name="single", nodes=1, args=TRAIN)
    record = run(launch)
    assert record.state == "COMPLETED", record.error
    run_dir = Path(launch.run_dir)
    assert sorted(p.name for p in (run_dir / "metrics").glob("rank-*.jsonl")) == ["rank-0.jsonl", "rank-1.jsonl"]
    assert len(list((run_dir / "slurm").glob("*_log.out"))) == 2
    assert (run_dir / "result.json").exists() and list((run_dir / "checkpoints").glob("ckpt-*.pt"))


def test_two_nodes_tcp_training_completes(cluster: dict[str, str]) -> None:
    launch = slurm_plan(cluster, args=TRAIN)
    record = run(launch)
    assert record.state == "COMPLETED", record.error
    run_dir = Path(launch.run_dir)
    assert len(list((run_dir / "metrics").glob("rank-*.jsonl"))) == 4
    logs = sorted((run_dir / "slurm").glob("*_log.out"))
    assert len(logs) == 4
    hosts = {line.split(" on ")[1].split(",")[0] for p in logs for line in p.read_text().splitlines()
             if line.startswith("[launcher] rank ")}
    assert hosts == {"node1", "node2"}
    assert json.loads((run_dir / "result.json").read_text())["result"]["world_size"] == 4


def test_two_nodes_file_init(cluster: dict[str, str]) -> None:
    launch = slurm_plan(cluster, args=TRAIN, distributed={"backend": "gloo", "init_method": "file",
                                                          "rendezvous_dir_is_shared": True, "interface": "eth0"})
    record = run(launch)
    assert record.state == "COMPLETED", record.error
    # The ranks joined through the file planned for this job and attempt, on the shared folder...
    result = json.loads((Path(launch.run_dir) / "result.json").read_text())["result"]
    rdir = Path(launch.payload.rendezvous_dir)
    assert result["init_method"] == f"file://{rdir}/rendezvous-{record.job_ids[0]}-0", result
    assert result["world_size"] == 4
    # ...and left nothing behind.
    assert rdir.is_dir() and not list(rdir.iterdir()), list(rdir.iterdir())


def test_torchrun_style_script_on_two_nodes(cluster: dict[str, str], tmp_path: Path) -> None:
    out = Path(cluster["runs_dir"]) / "byo-out"
    out.mkdir(exist_ok=True)
    launch = slurm_plan(cluster, entrypoint=str(SCRIPTS / "byo_ddp.py"), extra_args=["--out", str(out)],
                        distributed={"backend": "gloo", "interface": "eth0"})
    record = run(launch)
    assert record.state == "COMPLETED", record.error
    rows = [json.loads((out / f"byo-{r}.json").read_text()) for r in range(4)]
    assert all(r["sum"] == 10.0 for r in rows) and {r["master"] for r in rows} == {"node1"}
    assert [r["node_rank"] for r in rows] == [0, 0, 1, 1]


def test_fake_gpus_follow_the_torchrun_contract(cluster: dict[str, str]) -> None:
    """Every rank sees the node's GPUs and LOCAL_RANK indexes them, as under torchrun: a script
    that calls torch.cuda.set_device(LOCAL_RANK) finds a valid, distinct device on every rank."""
    out = Path(cluster["runs_dir"]) / "gpu-out"
    out.mkdir(exist_ok=True)
    launch = slurm_plan(cluster, entrypoint=str(SCRIPTS / "show_devices.py"), extra_args=["--out", str(out)],
                        gpus_per_node=2, nodes=1, distributed={"backend": "gloo"})
    record = run(launch)
    assert record.state == "COMPLETED", record.error
    seen = [json.loads((out / f"dev-{r}.json").read_text()) for r in range(2)]
    assert [r["CUDA_VISIBLE_DEVICES"] for r in seen] == ["0,1", "0,1"], seen
    picked = [r["CUDA_VISIBLE_DEVICES"].split(",")[int(r["LOCAL_RANK"])] for r in seen]
    assert sorted(picked) == ["0", "1"], seen


def start_long_training(cluster: dict[str, str], name: str, **slurm: Any) -> tuple[LaunchPlan, RunRecord]:
    """Submit a job that trains for minutes, and return once every rank is training."""
    fields: dict[str, Any] = {"slurm": {"time": "00:10:00", **slurm}} if slurm else {}
    launch = slurm_plan(cluster, name=name, args={**TRAIN, "max-steps": 0, "epochs": 100, "step-delay": 0.05}, **fields)
    record = SlurmExecutor().submit(launch)
    deadline = time.monotonic() + 120
    while not all((Path(launch.run_dir) / "metrics" / f"rank-{r}.jsonl").exists() for r in range(4)):
        assert time.monotonic() < deadline, "training never started"
        time.sleep(0.2)
    return launch, record


def test_cancel_gives_cancelled_quickly(cluster: dict[str, str]) -> None:
    launch, record = start_long_training(cluster, "cancel")
    ex = SlurmExecutor()
    t0 = time.monotonic()
    record = ex.cancel(record)
    assert record.state == "CANCELLED"
    assert time.monotonic() - t0 < 15
    time.sleep(2)
    assert no_job_processes()


def test_killed_rank_fails_the_job_fast(cluster: dict[str, str]) -> None:
    launch, record = start_long_training(cluster, "killed")
    ex = SlurmExecutor()
    pids = subprocess.run(["ip", "netns", "pids", "orch-node2"], capture_output=True, text=True).stdout.split()
    def is_rank_3(pid: str) -> bool:  # the title names the rank; setproctitle may reuse environ's memory
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # it ended since the listing (a probe, another stream's task): not the rank
            return False
        return "orchestrator.backends.slurm.node.slurm_rank" in cmd and ("rank 3/4" in cmd or "SLURM_PROCID=3" in environ)

    tasks = [p for p in pids if Path(f"/proc/{p}/cmdline").exists() and is_rank_3(p) and not belongs_to_another_stream(p)]
    assert len(tasks) == 1, tasks  # the srun task is the rank itself, as under plain srun
    victim = tasks[0]
    subprocess.run(["kill", "-9", victim])
    t0 = time.monotonic()
    while record.state not in ("FAILED", "CANCELLED", "COMPLETED"):
        assert time.monotonic() - t0 < 30
        time.sleep(0.3)
        record = ex.refresh([RunRecord.load(record.run_dir)])[0]
    assert record.state == "FAILED"
    assert time.monotonic() - t0 < 10
    # named, though it left no traceback and its peers failed after it with their own
    assert record.failed_rank == 3 and "rank 3 on node2 was killed by a signal (Killed)" in (record.error or ""), \
        record.error
    assert no_job_processes()


REQUEUE_ARGS = {**TRAIN, "max-steps": 0, "epochs": 2, "stop-check-every": 1}


@pytest.fixture(scope="module")
def uninterrupted(cluster: dict[str, str]) -> LaunchPlan:
    whole = slurm_plan(cluster, name="whole", args=REQUEUE_ARGS)
    assert run(whole).state == "COMPLETED"
    return whole


@pytest.mark.parametrize("how", ["scontrol-requeue", "usr2-preemption"])
def test_requeue_resumes_to_the_same_weights(cluster: dict[str, str], uninterrupted: LaunchPlan, how: str) -> None:
    # The scontrol case joins through file:// (shared folder): the next attempt must use its own
    # file and remove the one a crashed first attempt would have left.
    init = {"distributed": {"backend": "gloo", "init_method": "file", "rendezvous_dir_is_shared": True}} \
        if how == "scontrol-requeue" else {}
    launch = slurm_plan(cluster, name=f"requeued-{how}", args={**REQUEUE_ARGS, "step-delay": 0.1},
                        checkpoint={"interval_steps": 5}, **init)
    ex = SlurmExecutor()
    record = ex.submit(launch)
    metrics = Path(launch.run_dir) / "metrics" / "rank-0.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count('"train"') >= 8):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    if how == "scontrol-requeue":
        subprocess.run(["scontrol", "requeue", record.job_ids[0]], check=True)
    else:  # what SLURM does signal_margin_s before the time limit, or on preemption
        subprocess.run(["scancel", "--signal=USR2", record.job_ids[0]], check=True)
    stale = Path(launch.payload.rendezvous_dir) / f"rendezvous-{record.job_ids[0]}-0"
    if init:
        wait_for_restart_hold(record.job_ids[0])
        stale.write_text("left by the first attempt")  # as a crashed attempt would leave it
    release_requeued(record.job_ids[0])
    final = run_wait(ex, record, 300)
    log = "".join(p.read_text() for p in sorted((Path(launch.run_dir) / "slurm").glob("*_log.out")))
    assert final.state == "COMPLETED", (final.error, log[-3000:])
    log = "".join(p.read_text() for p in (Path(launch.run_dir) / "slurm").glob("*_0_log.out"))
    result = json.loads((Path(launch.run_dir) / "result.json").read_text())["result"]
    assert "resumed from" in log and result["resumed_from_step"], result  # the last attempt resumed
    assert 0 < result["resumed_from_step"] < result["global_step"]
    if how == "usr2-preemption":
        assert "requeueing" in log
    if init:
        rdir = Path(launch.payload.rendezvous_dir)
        assert result["init_method"] == f"file://{rdir}/rendezvous-{record.job_ids[0]}-1", result
        assert f"removed the previous attempt's rendezvous file {stale}" in log
        assert not list(rdir.iterdir()), list(rdir.iterdir())
    from jobs.checkpoint import latest_checkpoint, load_checkpoint

    ca = load_checkpoint(latest_checkpoint(uninterrupted.payload.checkpoint.dir))
    cb = load_checkpoint(latest_checkpoint(launch.payload.checkpoint.dir))
    assert (ca["epoch"], ca["global_step"]) == (cb["epoch"], cb["global_step"])
    for name in ca["model"]:
        assert torch.equal(ca["model"][name], cb["model"][name]), f"{name} differs after {how}"


def wait_for_restart_hold(job_id: str) -> None:
    """Until the requeued job waits to start again (its first attempt is over)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
        if "Restarts=1" in out and "JobState=PENDING" in out:
            return
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} was not requeued: {out}")


def start_held_job(job_id: str) -> None:
    """Start a requeued job that SLURM holds (BeginTime) now, as an admin could, once every node
    has ended the previous attempt. SLURM's hold exists for what comes between: a node ends the
    attempt when its slurmd gets to the controller's terminate message, and under load (three
    sessions side by side on 2 cores) that can come after the next attempt's ranks started on it,
    which it then kills as the same job's (a rank on node2 SIGKILLed as the requeued job starts,
    seen in fresh-clone runs). And not in the second of the requeue: the nodes revoked the previous
    attempt's credentials with that second's time stamp, and a credential issued in the same
    second is refused ("Job credential revoked": the job ends FAILED); two seconds after the last
    step ended is enough for a new credential."""
    deadline = time.monotonic() + 60
    while (left := job_steps_left(job_id)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"the previous attempt of job {job_id} never ended on its nodes: {left}"
    time.sleep(2.0)
    subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], check=True)


def job_steps_left(job_id: str) -> list[str]:
    """The job's slurmstepd processes still on a node (its batch, extern and srun steps)."""
    left = []
    for ns in ("orch-node1", "orch-node2"):
        for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            except OSError:
                continue
            if title.startswith(f"slurmstepd: [{job_id}."):
                left.append(f"{ns}:{pid}:{title}")
    return left


def release_requeued(job_id: str) -> None:
    """SLURM holds a requeued job for ~2 minutes (BeginTime); let it start now, as an admin could."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
        if "Reason=BeginTime" in out:
            start_held_job(job_id)
            return
        if "JobState=RUNNING" in out and "Restarts=1" in out:
            return
        time.sleep(0.2)


def run_wait(ex: SlurmExecutor, record: RunRecord, timeout: float) -> RunRecord:
    deadline = time.monotonic() + timeout
    while True:
        record = ex.refresh([RunRecord.load(record.run_dir)])[0]
        if record.state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return record
        assert time.monotonic() < deadline, record
        time.sleep(0.5)


def test_sweep_is_one_array_and_all_points_complete(cluster: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    out = Path(cluster["runs_dir"]) / "sweep-out"
    out.mkdir(exist_ok=True)
    launch = slurm_plan(cluster, name="sweep", nodes=1, cpu_ranks_per_node=1, entrypoint=str(SCRIPTS / "point.py"),
                        args={"out": str(out)}, sweep={"x": list(range(10))})
    record = run(launch, timeout=300)
    assert record.state == "COMPLETED", record.error
    assert len({j.split("_")[0] for j in record.job_ids}) == 1 and len(record.job_ids) == 10
    assert sorted(int(p.read_text()) for p in out.glob("point-*.txt")) == list(range(10))
    from orchestrator.front.operations import status

    capsys.readouterr()
    status([record.run_dir])
    shown = capsys.readouterr().out
    assert "sweep: 10 COMPLETED" in shown and "x=9" in shown


SCHEDULER = {"sacct", "squeue", "scontrol", "sinfo", "sbatch", "scancel"}


def test_status_is_one_scheduler_query(cluster: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`orchestrator status` over several runs (one of them a sweep) asks the scheduler at most
    twice, and once when accounting knows every job; then `orchestrator cancel` ends them."""
    from orchestrator.cli import main

    runs = [slurm_plan(cluster, name=f"st{i}", nodes=1, cpu_ranks_per_node=1, entrypoint=str(SCRIPTS / "sleep.py"),
                       args={"seconds": 120}, **({"sweep": {"x": [1, 2, 3]}} if i == 2 else {}))
            for i in range(3)]
    records = [SlurmExecutor().submit(launch) for launch in runs]
    dirs = [r.run_dir for r in records]
    calls: list[list[str]] = []
    real = subprocess.run

    def counting(cmd: Any, *a: Any, **k: Any) -> Any:
        if isinstance(cmd, (list, tuple)) and Path(str(cmd[0])).name in SCHEDULER:
            calls.append(list(cmd))
        return real(cmd, *a, **k)

    monkeypatch.setattr(subprocess, "run", counting)
    try:
        calls.clear()
        capsys.readouterr()
        assert main(["status", *dirs]) == 0
        shown = capsys.readouterr().out
        assert len(calls) <= 2, calls  # just submitted: sacct, then squeue for jobs it does not know yet
        assert all(r.run_id in shown for r in records), shown
        assert "sweep:" in shown
        deadline = time.monotonic() + 90
        while True:  # once every job runs (and accounting knows it), one query answers for all
            calls.clear()
            assert main(["status", "--json", *dirs]) == 0
            states = [row["state"] for row in json.loads(capsys.readouterr().out)]
            assert len(calls) <= 2, calls
            if states == ["RUNNING"] * 3 and len(calls) == 1:
                break
            assert time.monotonic() < deadline, (states, calls)
            time.sleep(1)
        assert calls[0][0] == "sacct" and len(calls) == 1
    finally:
        monkeypatch.setattr(subprocess, "run", real)
        for r in records:
            main(["cancel", r.run_dir])
    out = capsys.readouterr().out
    assert all(f"{r.run_id}: CANCELLED" in out for r in records), out


def test_validate_against_the_live_cluster(cluster: dict[str, str]) -> None:
    from orchestrator.core.errors import SpecError
    from orchestrator.backends.slurm.slurm_checks import check_against_cluster

    ok = spec_from_dict({"name": "v", "entrypoint": "jobs.train:main", "nodes": 2, "gpus_per_node": 2,
                         "distributed": {"backend": "gloo"}})
    check_against_cluster(ok)
    bad = spec_from_dict({"name": "v", "entrypoint": "jobs.train:main", "nodes": 3, "gpus_per_node": 4,
                          "distributed": {"backend": "gloo"}, "slurm": {"partition": "gpu"}})
    with pytest.raises(SpecError, match="slurm.partition: 'gpu' does not exist"):
        check_against_cluster(bad)
    worse = spec_from_dict({"name": "v", "entrypoint": "jobs.train:main", "nodes": 3, "gpus_per_node": 4,
                            "distributed": {"backend": "gloo"}})
    with pytest.raises(SpecError) as info:
        check_against_cluster(worse)
    assert "nodes: 3 requested" in str(info.value) and "gpus_per_node: 4 requested" in str(info.value)


def test_preflight_allreduce_across_the_allocated_nodes(cluster: dict[str, str], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from orchestrator.cli import main

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "pre", "entrypoint": "jobs.train:main", "executor": "slurm", "nodes": 2,
                                    "cpu_ranks_per_node": 1, "runs_dir": cluster["runs_dir"],
                                    "distributed": {"backend": "gloo", "interface": "eth0"},
                                    "slurm": {"time": "00:05:00"}}))
    assert main(["preflight", str(spec), "--sizes-mb", "1", "4"]) == 0
    out = capsys.readouterr().out
    assert "all-reduce over 2 ranks (gloo)" in out and "busbw GB/s" in out


def test_lost_node_ends_the_job(cluster: dict[str, str]) -> None:
    """Kill node2's slurmd and everything on it mid-job: with no requeues allowed the job ends
    (FAILED or NODE_FAIL), never hangs nor waits. The cluster is whole again afterwards, so the
    test can run in any order."""
    launch, record = start_long_training(cluster, "nodelost", max_requeues=0)
    ex = SlurmExecutor()
    for pid in subprocess.run(["ip", "netns", "pids", "orch-node2"], capture_output=True, text=True).stdout.split():
        subprocess.run(["kill", "-9", pid])
    t0 = time.monotonic()
    try:
        while record.state not in ("FAILED", "NODE_FAIL", "CANCELLED", "COMPLETED", "TIMEOUT"):
            assert time.monotonic() - t0 < 120, f"job still {record.state} two minutes after losing a node"
            time.sleep(0.5)
            record = ex.refresh([RunRecord.load(record.run_dir)])[0]
        assert record.state in ("FAILED", "NODE_FAIL"), record
        assert no_job_processes(within_s=30)
    finally:
        ex.cancel(record)
        restore_node2()


def restore_node2() -> None:
    """Bring node2's slurmd back and wait until a 2-node job runs again."""
    from tests.cluster.conftest import ROOT, UP_ARGS

    subprocess.run(["bash", str(ROOT / "deploy" / "cluster.sh"), *UP_ARGS], capture_output=True, timeout=300)
    deadline = time.monotonic() + 120
    while True:
        subprocess.run(["scontrol", "update", "nodename=node2", "state=resume"], capture_output=True, timeout=30)
        state = subprocess.run(["sinfo", "-h", "-n", "node2", "-o", "%t"], capture_output=True, text=True,
                               timeout=30).stdout.strip()
        if state in ("idle", "mix", "alloc"):
            break
        assert time.monotonic() < deadline, f"node2 did not come back: {state}"
        time.sleep(2)
    probe = subprocess.run(["sbatch", "--wait", "-N2", "-n2", "-t", "1", "-o", "/dev/null", "--wrap", "srun true"],
                           capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, f"a 2-node job does not run after node2 came back: {probe.stderr}"
