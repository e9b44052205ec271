"""The job's agent touches only what is its own, and the site's policy wins:

- the last resort against ranks that ignore SIGTERM signals the job's steps, never the job (a
  bare ``scancel --signal=KILL JOB`` is a cancel of the job, agent included: CANCELLED, no restart);
- every ``srun --jobid`` of a sweep point uses the allocation's number (22.05 refuses 'A_T');
- under a partition's PreemptMode=CANCEL the agent never requeues a preempted job.
"""

from __future__ import annotations

import signal
import subprocess
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.backends.slurm.node import agent_requeue, slurm_controller, slurm_job
from orchestrator.backends.slurm.node.agent_standby import Standbys
from orchestrator.backends.slurm.node.agent_state import AgentState, Phase
from orchestrator.backends.slurm.node.agent_stop import Stop, StopCause
from orchestrator.backends.slurm.node.slurm_controller import Answer


def _answers(monkeypatch: pytest.MonkeyPatch, replies: dict[str, Answer]) -> list[list[str]]:
    """Every SLURM command the code runs, answered by its tool's reply."""
    asked: list[list[str]] = []

    def fake(argv: list[str], timeout_s: float, *a: Any, **k: Any) -> Answer:
        asked.append(list(argv))
        return replies.get(argv[0], Answer(tuple(argv), 0, "", ""))

    monkeypatch.setattr(slurm_controller, "_once", lambda argv, timeout_s, *a, **k: fake(argv, timeout_s))
    return asked


def test_steps_are_the_numbered_steps_of_this_job_only() -> None:
    listing = "77.batch\n77.extern\n77.0\n77.3\n770.1\n78.0\n"
    assert slurm_controller.steps_of("77", listing) == ["77.0", "77.3"]
    assert slurm_controller.steps_of("77", "") == []


def test_an_array_task_is_resolved_to_its_number_and_a_number_is_not_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _answers(monkeypatch, {"scontrol": Answer(("scontrol",), 0, "JobId=125 ArrayJobId=123 ArrayTaskId=2", "")})
    assert slurm_controller.numeric_job_id("125") == "125" and asked == []
    assert slurm_controller.numeric_job_id("123_2") == "125"
    assert asked == [["scontrol", "show", "job", "-o", "123_2"]]


def test_a_sweep_points_stack_probe_names_the_allocation_number(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from orchestrator.backends.slurm.node import stacks_probe

    monkeypatch.setattr(stacks_probe.stack_requests, "rank_procs", lambda run_dir: {0: object()})
    monkeypatch.setattr(stacks_probe.stack_requests, "sizes", lambda run_dir, ranks: {0: 0})
    monkeypatch.setattr(stacks_probe.stack_requests, "wait_written", lambda *a, **k: {0: 0})
    monkeypatch.setattr(stacks_probe.stack_requests, "read_from", lambda *a: "")
    asked = _answers(monkeypatch, {"scontrol": Answer(("scontrol",), 0, "JobId=125 ArrayJobId=123", "")})
    stacks_probe.request_slurm(str(tmp_path), "123_2", 1, "python3")
    srun = next(a for a in asked if a[0] == "srun")
    assert "--jobid=125" in srun, srun


class _Srun:
    """srun that ignores SIGTERM until SIGKILL reaches its step (a node's slurmd gone)."""

    def __init__(self) -> None:
        self.signals: list[int] = []
        self.killed = False

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)

    def wait(self, timeout: float) -> int:
        raise subprocess.TimeoutExpired("srun", timeout)

    def kill(self) -> None:
        self.killed = True


def test_the_last_resort_kills_the_ranks_steps_never_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm_job, "END_GRACE_S", 0.01)
    asked = _answers(monkeypatch, {"squeue": Answer(("squeue",), 0, "125.batch\n125.extern\n125.2\n", "")})
    standbys = Standbys()
    standbys.by_host["node1"] = SimpleNamespace(proc=_Srun())  # type: ignore[assignment]
    agent = SimpleNamespace(srun=_Srun(), keep=None, standbys=standbys,
                            ctx=SimpleNamespace(job_id="123_2", slurm=SimpleNamespace(raw_job_id="125")))
    with pytest.raises(subprocess.TimeoutExpired):  # srun never ends here: the agent's own wait gives up
        slurm_job.JobAgent._end_ranks(agent)  # type: ignore[arg-type]
    cancels = [a for a in asked if a[0] == "scancel"]
    assert cancels == [["scancel", "--signal=KILL", "125.2"]], asked
    assert agent.srun.signals == [signal.SIGTERM]
    assert not standbys.by_host  # their steps went with the SIGKILL: the next attempt starts a new step


def test_no_step_listed_means_no_scancel_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm_job, "END_GRACE_S", 0.01)
    asked = _answers(monkeypatch, {"squeue": Answer(("squeue",), 0, "125.batch\n", "")})
    agent = SimpleNamespace(srun=_Srun(), keep=None, standbys=Standbys(),
                            ctx=SimpleNamespace(job_id="125", slurm=SimpleNamespace(raw_job_id="125")))
    with pytest.raises(subprocess.TimeoutExpired):
        slurm_job.JobAgent._end_ranks(agent)  # type: ignore[arg-type]
    assert not [a for a in asked if a[0] == "scancel"]


@pytest.mark.parametrize("mode, ends", [("CANCEL", True), ("CANCEL,GANG", True), ("REQUEUE", False),
                                        ("SUSPEND,GANG", False), ("", False), ("OFF", False)])
def test_the_sites_preempt_mode_decides_whether_a_preempted_job_ends(mode: str, ends: bool) -> None:
    assert agent_requeue.site_ends_preempted(mode) is ends


def test_a_job_preempted_under_cancel_is_never_requeued_by_the_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _answers(monkeypatch, {})
    said: list[str] = []
    state = AgentState()
    state.update_stop(lambda _: Stop(StopCause.PREEMPTION, 0.0, notice_at=0.0, preempt_mode="CANCEL"))
    state.preemption_asked = True
    ctx = SimpleNamespace(state=state, say=said.append, job_id="125",
                          payload=SimpleNamespace(max_requeues=3), history=SimpleNamespace(requeues=lambda: 0,
                                                                                          restarts_by_requeue=lambda: 0),
                          slurm=SimpleNamespace(restart=0))
    rq = agent_requeue.Requeuer(ctx)  # type: ignore[arg-type]
    rq.requeue("the preemption's SIGTERM")
    assert state.phase is Phase.NOT_REQUEUED
    assert not [a for a in asked if a[:2] == ["scontrol", "requeue"]]
    assert "PreemptMode=CANCEL" in state.not_requeued and "not requeued" in said[-1]


def test_a_drained_node_still_runs_the_job_and_is_not_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """A drain stops new jobs, not the running one's steps: a draining node (drng, still holding our
    job) is not lost at a crash; a drained one (drain: no job on it) is not ours any more."""
    listing = "node1 drng\nnode2 down*\nnode3 alloc\nnode4 drain\nnode5 mix*\nnode6 fail\n"
    _answers(monkeypatch, {"sinfo": Answer(("sinfo",), 0, listing, "")})
    assert slurm_controller.nodes_gone(["node1", "node2", "node3", "node4", "node5", "node6"]) == \
        {"node2", "node4", "node5", "node6"}


def test_the_batch_host_is_read_from_slurm_not_assumed_first() -> None:
    from orchestrator.backends.slurm.node.agent_recovery import batch_host

    hosts = ("node1", "node2", "node3")
    assert batch_host(hosts, {"SLURMD_NODENAME": "node2"}) == "node2"
    assert batch_host(hosts, {}) == "node1"
    assert batch_host(hosts, {"SLURMD_NODENAME": "login"}) == "node1"  # not one of the job's: SLURM did not say


def test_a_job_accounting_still_calls_pending_is_asked_of_squeue(monkeypatch: pytest.MonkeyPatch) -> None:
    """slurmdbd hears of a start after squeue: a job sacct calls PENDING while it runs is RUNNING
    (``chaos`` right after ``submit`` was refused as "PENDING" while the ranks trained)."""
    from orchestrator.backends.slurm import slurm_status

    asked: list[list[str]] = []

    def fake(argv: list[str], *a: Any, **k: Any) -> Answer:
        asked.append(list(argv))
        if argv[0] == "sacct":
            return Answer(tuple(argv), 0, "77|PENDING\n78|COMPLETED\n", "")
        return Answer(tuple(argv), 0, "77|RUNNING\n", "")

    monkeypatch.setattr(slurm_status, "run_slurm", fake)
    monkeypatch.setattr(slurm_status, "check_slurm_conf", lambda: None)
    monkeypatch.setattr(slurm_status, "accounting_off", lambda: None)
    states = slurm_status.sacct_states(["77", "78"])
    assert (states["77"], states["78"]) == ("RUNNING", "COMPLETED")
    assert [a[0] for a in asked] == ["sacct", "squeue"] and "77" in asked[1][-1] and "78" not in asked[1][-1]


def test_a_step_whose_creation_waits_does_not_run_the_gates_clock(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """srun says the controller delays the ranks' step (busy nodes): the gate's bound does not run
    meanwhile, so a step created 200 s late is not every node failing the gate."""
    import time as time_module

    from orchestrator.backends.slurm.node import agent_gate
    from orchestrator.backends.slurm.node.agent_srun_messages import note_step_creation
    from orchestrator.backends.slurm.node import gate_step

    state = AgentState()
    note_step_creation("srun: Job step creation temporarily disabled, retrying (Requested nodes are busy)\n", state)
    assert state.step_waiting_since is not None
    clock = [1000.0]
    monkeypatch.setattr(time_module, "monotonic", lambda: clock[0])
    gate = agent_gate.StepGate.__new__(agent_gate.StepGate)
    decided: list[bool] = []
    gate.ctx = SimpleNamespace(state=state)  # type: ignore[assignment]
    gate.folder, gate.names, gate.decided = tmp_path, {"node1.json"}, False
    gate.started = gate._last_look = gate._next = 1000.0
    gate._pause, gate._arrived = 0.01, 0
    monkeypatch.setattr(agent_gate.StepGate, "_decide", lambda self: decided.append(True))
    state.step_waiting_since = 1000.0
    for _ in range(40):  # 200 s of a delayed step, looked at every 5 s
        clock[0] += 5
        gate.look()
    assert not decided, "the gate decided while the step did not exist yet"
    note_step_creation("srun: Step created for StepId=125.0\n", state)
    assert state.step_waiting_since is None
    clock[0] += gate_step.DECIDE_WITHIN_S - 10
    gate.look()
    assert not decided
    clock[0] += 11
    gate.look()
    assert decided  # silence after the step existed for the whole bound is a verdict


def test_the_plans_rank_environment_escapes_control_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    """An inherited value (OMP_NUM_THREADS from the submitter's shell) with ESC reaches every rank's
    row in plan's output escaped, never raw: it must not rewrite the terminal."""
    import io

    from rich.console import Console

    from orchestrator.front.display import print_ranks, recovery_line
    from orchestrator.plan import plan
    from orchestrator.spec.loading import spec_from_dict

    monkeypatch.setenv("OMP_NUM_THREADS", "4\x1b[2J")
    launch = plan(spec_from_dict({"name": "esc", "entrypoint": "jobs.train:main", "nodes": 2,
                                  "cpu_ranks_per_node": 2}), "local")
    out = io.StringIO()
    print_ranks(launch, Console(file=out, width=200))
    print_ranks(launch, Console(file=out, width=200), rank=1)
    assert "\x1b[2J" not in out.getvalue()
    slurm = plan(spec_from_dict({"name": "esc", "entrypoint": "jobs.train:main", "executor": "slurm",
                                 "runs_dir": "/srv/runs", "recovery": {"max_restarts": 2}}), "slurm")
    assert "inside the allocation" in recovery_line(slurm)


def test_the_agent_of_a_job_the_site_preempts_leaves_once_slurm_ended_it() -> None:
    states = iter(["RUNNING", "RUNNING", "PREEMPTED", "should not be asked"])
    said: list[str] = []
    assert agent_requeue.wait_for_site_end(said.append, lambda: next(states), wait_s=5, pause_s=0.01) == "PREEMPTED"
    assert "SLURM ended the job: PREEMPTED" in said[-1]
    assert agent_requeue.wait_for_site_end(said.append, lambda: "RUNNING", wait_s=0.05, pause_s=0.01) == "RUNNING"
