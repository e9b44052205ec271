"""`orchestrator chaos` does only what it says, and refuses, before anything is broken, what its
README says it refuses. Each run here is a real run folder (record, payload, recovery.json, a
rank's own record) whose "rank" is a live process of this test: an injection that should not
happen must leave it alive, one that should must end it.

- a failure the recovery would not restart from (restarts used up, the kind not in recovery.on,
  no progress) is refused: the run would end FAILED;
- chaos.jsonl is never written through a link, nor when it is no regular file;
- once the failure is injected the command succeeds (exit 0), whatever srun or the log say after;
- a sweep's point is a run of its own (``RUN/points/N``), reached on SLURM through the array
  task's numeric job id; the sweep itself names the point to give;
- an unreadable or damaged payload is one line, never a traceback;
- a node that runs anyone else's job is never set DOWN.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from orchestrator.backends.slurm.node import slurm_controller
from orchestrator.backends.slurm.chaos_slurm import SlurmChaos
from orchestrator.node import chaos_node
from orchestrator.core import ownership, procs
from orchestrator.core.errors import UsageError
from orchestrator.core.payload import Payload
from orchestrator.core.records import RunRecord, register
from orchestrator.core.recovery import Attempt, History
from orchestrator.core.run_folder import RunFolder
from orchestrator.core.states import State
from orchestrator.front import chaos
from orchestrator.front.chaos import Injection, budget_refusal, inject, node_down_refusal
from orchestrator.backends.slurm.node.slurm_controller import job_id_from_show, job_id_from_squeue
from orchestrator.front.chaos_target import (Target, split_point)
from orchestrator.plan import plan
from orchestrator.spec.loading import spec_from_dict

KILL = Injection("kill-rank", rank=0)


def _same(records: Any) -> list[RunRecord]:
    """The records as recorded: no scheduler, no supervisor to ask."""
    return list(records)


@pytest.fixture
def victim() -> Iterator[subprocess.Popen]:
    """A live process that stands for rank 0."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def _alive(proc: subprocess.Popen) -> bool:
    """Still running a moment later (a signal sent just before takes that moment to land)."""
    try:
        proc.wait(timeout=1)
    except subprocess.TimeoutExpired:
        return True
    return False


def _killed(proc: subprocess.Popen) -> bool:
    try:
        return proc.wait(timeout=10) == -signal.SIGKILL
    except subprocess.TimeoutExpired:
        return False


def _running_history(folder: Path, done: int = 0, restarted: int = 0, nodes: tuple[str, ...] = ("here",)) -> None:
    """recovery.json: ``done`` attempts that ended in a crash (``restarted`` of them restarted), then
    the attempt running now."""
    attempts = [Attempt(number=i + 1, started=time.time() - 60, nodes=list(nodes), ended=time.time() - 30,
                        outcome="crash", why="test", progress=True, action="restart" if i < restarted else "stop")
                for i in range(done)]
    attempts.append(Attempt(number=done + 1, started=time.time() - 10, nodes=list(nodes)))
    History(folder / "recovery.json", attempts).save()


def _rank_record(folder: Path, proc: subprocess.Popen, rank: int = 0, host: Optional[str] = None) -> None:
    ranks = RunFolder(folder).ranks
    ranks.mkdir(parents=True, exist_ok=True)
    (ranks / f"rank-{rank}.json").write_text(json.dumps({
        "rank": rank, "host": host or socket.gethostname(), "host_key": None if host else ownership.this_host(),
        "pid": proc.pid, "start_ticks": procs.start_time(proc.pid)}))


def _run(tmp_path: Path, proc: Optional[subprocess.Popen], *, executor: str = "local", sweep: int = 0,
         recovery: Optional[dict] = None, running_point: int = 0, job_ids: Optional[list[str]] = None,
         host: Optional[str] = None) -> RunRecord:
    """A running run folder (a sweep of ``sweep`` points, ``running_point`` running), rank 0 = proc."""
    spec: dict[str, Any] = {"name": "c", "entrypoint": "jobs.train:main", "runs_dir": str(tmp_path / "runs"),
                            "nodes": 1, "cpu_ranks_per_node": 2, "recovery": recovery or {"max_restarts": 2}}
    if sweep:
        spec["sweep"] = {"lr": list(range(sweep))}
    launch = plan(spec_from_dict(spec), "local")
    run_dir = Path(launch.run_dir)
    run_dir.mkdir(parents=True)
    launch.payload.write(RunFolder(run_dir).payload)
    folder = run_dir
    if sweep:
        for index in range(sweep):
            point = RunFolder(run_dir).point(index)
            point.root.mkdir(parents=True)
            if executor == "slurm" or index <= running_point:
                launch.payload_for_point(index).write(point.payload if executor == "slurm" else point.point_payload)
        folder = RunFolder(run_dir).point(running_point).root
    _running_history(folder)
    if proc is not None:
        _rank_record(folder, proc, host=host)
    point_states = {str(i): State.RUNNING if i == running_point else State.COMPLETED for i in range(sweep)} \
        if executor == "slurm" and sweep > 1 else {}
    record = RunRecord(run_id=launch.run_id, run_dir=str(run_dir), executor=executor, state=State.RUNNING,
                       world_size=2, host=ownership.this_host(), folder_id=ownership.folder_id(run_dir),
                       job_ids=job_ids or [f"local-{os.getpid()}"], sweep_size=sweep, point_states=point_states)
    record.save()
    return record


# ---- 1. no restart left: refused, nothing killed ----------------------------------------------------
def test_a_kill_after_the_restarts_are_used_up_is_refused_and_kills_nothing(
        tmp_path: Path, victim: subprocess.Popen) -> None:
    record = _run(tmp_path, victim, recovery={"max_restarts": 1})
    _running_history(Path(record.run_dir), done=1, restarted=1)  # attempt 1 crashed and used the one restart
    with pytest.raises(UsageError) as refused:
        inject(record.run_dir, KILL, refresh=_same)
    said = str(refused.value)
    assert "has used 1 of its 1 restart(s)" in said and "raise recovery.max_restarts" in said, said
    assert "\n" not in said and _alive(victim)
    assert not (Path(record.run_dir) / "chaos.jsonl").exists()


def test_a_kill_with_a_restart_left_goes_ahead(tmp_path: Path, victim: subprocess.Popen) -> None:
    record = _run(tmp_path, victim, recovery={"max_restarts": 2})
    _running_history(Path(record.run_dir), done=1, restarted=1)
    said = inject(record.run_dir, KILL, refresh=_same)
    assert f"{record.run_id}: kill-rank rank 0 on" in said and "(attempt 2)" in said, said
    assert _killed(victim)


def _payload(tmp_path: Path, **recovery: Any) -> Payload:
    spec = {"name": "c", "entrypoint": "jobs.train:main", "runs_dir": str(tmp_path / "runs"), "nodes": 1,
            "cpu_ranks_per_node": 2, "recovery": recovery}
    return plan(spec_from_dict(spec), "local").payload


def test_the_budget_is_recoverys_own_decision(tmp_path: Path) -> None:
    history = History(tmp_path / "recovery.json", [Attempt(number=1, started=0.0)])
    hang = Injection("stop-rank", rank=0)
    assert budget_refusal("r", _payload(tmp_path, max_restarts=1).recovery, history, hang, True) is None
    narrow = _payload(tmp_path, max_restarts=1, on=["crash"]).recovery
    said = budget_refusal("r", narrow, history, hang, True) or ""
    assert "recovery.on (crash) does not list hang" in said and "add hang to recovery.on" in said, said
    assert budget_refusal("r", narrow, history, KILL, True) is None
    stuck = History(tmp_path / "recovery.json", [  # a checkpoint was seen: the next one may come
        Attempt(number=1, started=0.0, outcome="crash", progress=False, action="restart", checkpoint_at_start="ckpt-6"),
        Attempt(number=2, started=1.0, checkpoint_at_start="ckpt-6")])
    said = budget_refusal("r", _payload(tmp_path, max_restarts=5).recovery, stuck, KILL, False) or ""
    assert "recovery.stop_without_progress (2)" in said and "wait for its next checkpoint" in said, said
    assert budget_refusal("r", _payload(tmp_path, max_restarts=5).recovery, stuck, KILL, True) is None


# ---- 2. chaos.jsonl: never through a link, never anything but a regular file -------------------------
def test_a_chaos_log_that_is_a_link_is_refused_before_anything_is_killed(
        tmp_path: Path, victim: subprocess.Popen) -> None:
    record = _run(tmp_path, victim)
    elsewhere = tmp_path / "not-yours.txt"
    elsewhere.write_text("keep me\n")
    (Path(record.run_dir) / "chaos.jsonl").symlink_to(elsewhere)
    with pytest.raises(UsageError) as refused:
        inject(record.run_dir, KILL, refresh=_same)
    assert "is a symbolic link" in str(refused.value) and "rm " in str(refused.value), refused.value
    assert _alive(victim) and elsewhere.read_text() == "keep me\n"


@pytest.mark.parametrize("make", [os.mkfifo, os.mkdir], ids=["fifo", "folder"])
def test_a_chaos_log_that_is_no_regular_file_is_refused_before_anything_is_killed(
        tmp_path: Path, victim: subprocess.Popen, make: Any) -> None:
    record = _run(tmp_path, victim)
    make(Path(record.run_dir) / "chaos.jsonl")
    with pytest.raises(UsageError) as refused:
        inject(record.run_dir, KILL, refresh=_same)
    assert "not a regular file" in str(refused.value), refused.value
    assert _alive(victim)


# ---- 3. once injected, success ---------------------------------------------------------------------
def test_the_command_exits_0_once_it_killed(tmp_path: Path, victim: subprocess.Popen,
                                            monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import orchestrator.api
    from orchestrator.cli import main

    record = _run(tmp_path, victim)
    monkeypatch.setattr(orchestrator.api, "refresh_records", _same)
    assert main(["chaos", record.run_dir, "--kill-rank", "0"]) == 0
    assert _killed(victim)
    assert f"{record.run_id}: kill-rank rank 0 on" in capsys.readouterr().out
    (entry,) = [json.loads(line) for line in (Path(record.run_dir) / "chaos.jsonl").read_text().splitlines()]
    assert (entry["action"], entry["attempt"]) == ("kill-rank", 1)


def test_the_node_said_sent_so_a_failed_srun_afterwards_is_still_a_success(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's agent may end every step of the job (ours too) as it restarts the ranks: srun
    then fails, after the node sent the signal."""
    record = _run(tmp_path, None, executor="slurm", job_ids=["812"])
    target = Target(record, Path(record.run_dir))

    def aborted(argv: Any, *args: Any, **kwargs: Any) -> slurm_controller.Answer:
        return slurm_controller.Answer(tuple(argv), 143, stdout=f"{chaos_node.SENT} SIGKILL to rank 1\n",
                                       stderr="srun: error: node2: task 0: Terminated\nsrun: Job step aborted")

    monkeypatch.setattr(slurm_controller, "run", aborted)
    assert SlurmChaos().signal(target.folder, "812", sys.executable, "node2", 1, "KILL") is None

    def refused(argv: Any, *args: Any, **kwargs: Any) -> slurm_controller.Answer:
        return slurm_controller.Answer(tuple(argv), 1, stderr="rank 1 is not running (it ended)")

    monkeypatch.setattr(slurm_controller, "run", refused)
    assert SlurmChaos().signal(target.folder, "812", sys.executable, "node2", 1, "KILL") == "rank 1 is not running (it ended)"


def test_the_node_side_says_it_sent_the_signal(tmp_path: Path, victim: subprocess.Popen,
                                               capsys: pytest.CaptureFixture) -> None:
    _rank_record(tmp_path, victim, rank=3)
    assert chaos_node.main([str(tmp_path), "3", "KILL"]) == 0
    assert _killed(victim)
    assert capsys.readouterr().out.startswith(f"{chaos_node.SENT} SIGKILL to rank 3")
    assert chaos_node.main([str(tmp_path), "3", "KILL"]) == 1  # gone: nothing sent, nothing said
    assert chaos_node.SENT not in capsys.readouterr().out


def test_a_log_that_cannot_be_written_after_the_kill_is_said_not_raised(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "chaos.jsonl"
    path.write_text("")
    fd = os.open(path, os.O_RDONLY)  # every write fails (EBADF)
    try:
        chaos.record_entry(fd, path, {"action": "kill-rank"})
    finally:
        os.close(fd)
    assert "the injection happened, but" in capsys.readouterr().err


# ---- 4. sweeps: a point is a run of its own ----------------------------------------------------------
def test_a_point_is_named_as_its_folder() -> None:
    assert split_point("/runs/s-1/points/0003") == ("/runs/s-1", 3)
    assert split_point("s-1/points/3/") == ("s-1", 3)
    assert split_point("s-1") == ("s-1", None)
    assert split_point("/runs/points/s-1") == ("/runs/points/s-1", None)


def test_a_local_sweeps_running_point_is_broken_and_the_sweep_itself_names_it(
        tmp_path: Path, victim: subprocess.Popen, monkeypatch: pytest.MonkeyPatch) -> None:
    record = _run(tmp_path, victim, sweep=3, running_point=1)
    with pytest.raises(UsageError) as whole:
        inject(record.run_dir, KILL, refresh=_same)
    said = str(whole.value)
    assert "is a sweep of 3 points" in said and f"'orchestrator chaos {record.run_id}/points/0001 --kill-rank 0'" \
        in said and "point(s) 1 run now" in said, said
    with pytest.raises(UsageError) as over:
        inject(f"{record.run_dir}/points/0", KILL, refresh=_same)
    assert f"{record.run_id} point 0 is COMPLETED, not RUNNING" in str(over.value), over.value
    assert _alive(victim)
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(tmp_path / "home"))
    register(record)
    said = inject(f"{record.run_id}/points/1", KILL, refresh=_same)  # by run id, as the refusal said
    assert said.startswith(f"{record.run_id} point 1: kill-rank rank 0 on"), said
    assert _killed(victim)
    assert (RunFolder(Path(record.run_dir)).point(1).root / "chaos.jsonl").is_file()


def _fake_slurm(monkeypatch: pytest.MonkeyPatch, show: str, squeue: str = "") -> list[list[str]]:
    """SLURM's tools as a controller that knows one running array task; every argv is kept."""
    calls: list[list[str]] = []

    def run(argv: Any, *args: Any, **kwargs: Any) -> slurm_controller.Answer:
        calls.append(list(argv))
        if argv[0] == "scontrol" and argv[1] == "show":
            return slurm_controller.Answer(tuple(argv), 0, stdout=show)
        if argv[0] == "squeue":
            return slurm_controller.Answer(tuple(argv), 0, stdout=squeue)
        if argv[0] == "srun" and any(a.startswith("--jobid=") and a[8:].isdigit() for a in argv):
            return slurm_controller.Answer(tuple(argv), 0, stdout=f"{chaos_node.SENT} SIGKILL to rank 0\n")
        return slurm_controller.Answer(tuple(argv), 1, stderr="srun: error: Invalid numeric value \"700_1\"")

    monkeypatch.setattr(slurm_controller, "run", run)
    return calls


def test_a_slurm_sweep_point_is_reached_through_its_numeric_job_id(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = subprocess.Popen(["true"])  # rank 0, recorded on "node2": only srun reaches it
    elsewhere.wait()
    record = _run(tmp_path, elsewhere, executor="slurm", sweep=2, running_point=1, job_ids=["700_0", "700_1"],
                  host="node2")
    calls = _fake_slurm(monkeypatch, "JobId=702 ArrayJobId=700 ArrayTaskId=1 JobState=RUNNING NodeList=node2")
    said = inject(f"{record.run_dir}/points/0001", KILL, refresh=_same)
    assert said.startswith(f"{record.run_id} point 1: kill-rank rank 0 on node2"), said
    (srun,) = [c for c in calls if c[0] == "srun"]
    point = str(RunFolder(Path(record.run_dir)).point(1).root)
    assert "--jobid=702" in srun and "--nodelist=node2" in srun and point in srun, srun
    assert ["scontrol", "show", "job", "-o", "700_1"] in calls


def test_the_numeric_id_comes_from_squeue_when_scontrol_does_not_name_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.backends.slurm.chaos_slurm import SlurmChaos

    numeric_job_id = SlurmChaos().job_id
    calls = _fake_slurm(monkeypatch, "", squeue="703\n")
    assert numeric_job_id("700_1") == "703"
    assert ["squeue", "-h", "-o", "%A", "-j", "700_1"] in calls
    assert numeric_job_id("812") == "812"  # a plain job: no question asked
    _fake_slurm(monkeypatch, "", squeue="")
    with pytest.raises(UsageError, match="numeric job id of array task 700_1"):
        numeric_job_id("700_1")


def test_the_controllers_answers_name_the_tasks_own_job() -> None:
    assert job_id_from_show("700_1", {"JobId": "702", "ArrayJobId": "700", "ArrayTaskId": "1"}) == "702"
    assert job_id_from_show("700_1", {"JobId": "700", "ArrayJobId": "700", "ArrayTaskId": "1-3"}) is None
    assert job_id_from_show("700_1", {}) is None
    assert job_id_from_squeue("702\n") == "702"
    assert job_id_from_squeue("702\n703\n") is None and job_id_from_squeue("") is None


# ---- 5. an unreadable payload: one line ----------------------------------------------------------
def test_a_damaged_payload_is_one_line_and_kills_nothing(tmp_path: Path, victim: subprocess.Popen) -> None:
    record = _run(tmp_path, victim)
    (Path(record.run_dir) / "payload.json").write_text('{"version": 6, "job_na')
    with pytest.raises(UsageError) as refused:
        inject(record.run_dir, KILL, refresh=_same)
    said = str(refused.value)
    assert "payload.json is damaged (not JSON" in said and "nothing was broken" in said and "\n" not in said, said
    assert _alive(victim)


DRIVER = """
import sys
from pathlib import Path
from orchestrator.core.errors import OrchestratorError
from orchestrator.core.records import RunRecord
from orchestrator.front.chaos_target import Target, read_payload
try:
    read_payload(Target(RunRecord.load(sys.argv[1]), Path(sys.argv[1])))
    print("read")
except OrchestratorError as exc:
    print(exc)
"""


def test_a_payload_this_user_may_not_read_is_one_line(tmp_path: Path) -> None:
    """Root reads anything: as root the reader is the user nobody (setpriv), else this user."""
    as_nobody = os.geteuid() == 0
    if as_nobody and not shutil.which("setpriv"):
        pytest.skip("root without setpriv: no user to be refused")
    root = Path(tempfile.mkdtemp(prefix="orch-chaos-"))  # pytest's folders are private to root
    try:
        root.chmod(0o755)
        record = _run(root, None)
        for folder in (root / "runs", Path(record.run_dir)):
            folder.chmod(0o755)
        (Path(record.run_dir) / "record.json").chmod(0o644)
        (Path(record.run_dir) / "payload.json").chmod(0o600 if as_nobody else 0o000)
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if as_nobody else []
        out = subprocess.run([*prefix, sys.executable, "-c", DRIVER, record.run_dir], capture_output=True, text=True,
                             timeout=60, cwd="/",
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert out.stdout.startswith(f"chaos refused: no permission to read the job payload {record.run_dir}/payload.json"), \
        out.stdout
    assert out.stdout.count("\n") == 1


# ---- 6. --node-down: only a node the run's job has to itself -----------------------------------------
def test_a_node_that_runs_another_job_is_not_taken_down() -> None:
    assert node_down_refusal("node2", "812", "812\n") is None
    said = node_down_refusal("node2", "812", "812\n913\n914\n") or ""
    assert "node2 also runs 2 other job(s)" in said and "--kill-rank" in said, said
    assert "913" not in said and "914" not in said  # counted, never named
    assert "lists no job of the run on node2" in (node_down_refusal("node2", "812", "913\n") or "")


def test_node_down_asks_squeue_and_says_how_to_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = _run(tmp_path, None, executor="slurm", job_ids=["812"])
    _running_history(Path(record.run_dir), nodes=("node1", "node2"))
    calls = _fake_slurm(monkeypatch, "", squeue="812\n913\n")
    with pytest.raises(UsageError, match="node2 also runs 1 other job"):
        inject(record.run_dir, Injection("node-down", node="node2"), refresh=_same)
    assert ["squeue", "-h", "-w", "node2", "-o", "%A"] in calls
    assert not [c for c in calls if c[:2] == ["scontrol", "update"]]
    calls = _fake_slurm(monkeypatch, "", squeue="812\n")
    monkeypatch.setattr(slurm_controller, "run", lambda argv, *a, **k: (
        calls.append(list(argv)), slurm_controller.Answer(tuple(argv), 0, stdout="812\n"))[1])
    said = inject(record.run_dir, Injection("node-down", node="node2"), refresh=_same)
    assert "node-down node node2" in said and "scontrol update nodename=node2 state=resume" in said, said
    assert [c for c in calls if c[:2] == ["scontrol", "update"]]


@pytest.mark.parametrize("text", ['{"attempts": [{"numb', '[1, 2]', '{"attempts": [{"number": "one"}]}'],
                         ids=["torn", "a-list", "no-attempt-in-it"])
def test_a_damaged_recovery_history_is_one_line_and_kills_nothing(tmp_path: Path, victim: subprocess.Popen,
                                                                   text: str) -> None:
    """The restarts left are read from it: a history chaos cannot read is no history of none."""
    record = _run(tmp_path, victim)
    (Path(record.run_dir) / "recovery.json").write_text(text)
    with pytest.raises(UsageError) as refused:
        inject(record.run_dir, KILL, refresh=_same)
    assert "recovery.json is damaged" in str(refused.value) and "\n" not in str(refused.value), refused.value
    assert _alive(victim)
