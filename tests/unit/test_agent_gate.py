"""The agent's side of the health gate inside the ranks' step (agent_gate.StepGate): when it decides,
what it decides, and the one decision every task reads (gate_step.wait_for_decision)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from orchestrator.backends.slurm.node.agent_state import AgentState
from orchestrator.backends.slurm.node.agent_gate import StepGate
from orchestrator.node import gate_step, health
from orchestrator.node.health import NodeHealth


def _ctx(tmp: Path, said: list[str]) -> Any:
    run = tmp / "run"
    run.mkdir(exist_ok=True)
    attempt = SimpleNamespace(number=3, health={}, times={})
    payload = SimpleNamespace(run_dir=str(run), checkpoint=SimpleNamespace(dir=str(run / "ckpt")))
    return SimpleNamespace(attempt=attempt, run_dir=str(run), payload=payload, say=said.append, state=AgentState())


def _report(ctx: Any, node: str, ok: bool = True) -> None:
    health.write_result(ctx.run_dir, 3, NodeHealth(node, ok, () if ok else (f"{node} is broken",), 0.01))


def _look_until_decided(gate: StepGate, limit_s: float = 5.0) -> None:
    deadline = time.monotonic() + limit_s
    while not gate.look():
        assert time.monotonic() < deadline, "the gate never decided"
        time.sleep(gate.wait_s())


def test_every_node_healthy_lets_every_task_go(tmp_path: Path) -> None:
    said: list[str] = []
    ctx = _ctx(tmp_path, said)
    gate = StepGate(ctx, ("a", "b"))
    assert gate.argv() == ["--gate", "3"]
    answers: list[Any] = []
    task = threading.Thread(target=lambda: answers.append(gate_step.wait_for_decision(ctx.run_dir, 3, wait_s=5)))
    task.start()
    _report(ctx, "a")
    assert not gate.look() and not gate.decided  # b has not reported yet
    _report(ctx, "b")
    _look_until_decided(gate)
    task.join(5)
    assert gate.failure is None and answers == [{"go": True, "why": ""}]
    assert ctx.attempt.health == {} and ctx.attempt.times["gate_s"] < 5
    assert "2 node(s) healthy" in said[-1]


def test_a_failing_node_stops_every_task_and_is_blamed(tmp_path: Path) -> None:
    said: list[str] = []
    ctx = _ctx(tmp_path, said)
    gate = StepGate(ctx, ("a", "b"))
    _report(ctx, "a")
    _report(ctx, "b", ok=False)
    _look_until_decided(gate)
    assert gate.failure is not None and gate.failure.blamed == ("b",), gate.failure
    decision = gate_step.wait_for_decision(ctx.run_dir, 3, wait_s=1)
    assert decision == {"go": False, "why": "node(s) b failed it; the job's batch log says why"}
    assert ctx.attempt.health == {"b": "b is broken"}


def test_a_node_silent_when_the_step_ends_failed_the_gate_but_a_step_that_never_ran_blames_none(tmp_path: Path) -> None:
    said: list[str] = []
    ctx = _ctx(tmp_path, said)
    gate = StepGate(ctx, ("a", "b"))
    _report(ctx, "a")
    assert gate.look(step_ended=True)
    assert gate.failure is not None and gate.failure.blamed == ("b",)
    assert "did not report from b" in ctx.attempt.health["b"]
    other = tmp_path / "other"
    other.mkdir()
    quiet = StepGate(_ctx(other, said), ("a", "b"))
    assert quiet.look(step_ended=True) and quiet.failure is None
    assert said[-1] == "health gate: the ranks' step ended before any node reported"


def test_a_task_gives_up_on_an_agent_that_never_decides(tmp_path: Path) -> None:
    started = time.monotonic()
    assert gate_step.wait_for_decision(str(tmp_path), 1, wait_s=0.3) is None
    assert 0.3 <= time.monotonic() - started < 2


def test_the_decision_is_looked_for_at_a_pace_that_grows_with_the_job(tmp_path: Path, monkeypatch: Any) -> None:
    """A node's looks for the decision: at most 20 ms apart at 2 nodes (the entrypoints start soon
    after it), 0.5 s at thousands (the nodes' looks together stay near 1,000 a second)."""
    assert [gate_step.decision_pause_s(n) for n in (1, 2, 20, 64, 500, 4096)] == [0.02, 0.02, 0.02, 0.064, 0.5, 0.5]
    for nodes, at_least, at_most in ((2, 40, 60), (4096, 6, 12)):
        listings: list[float] = []
        real = gate_step.os.listdir

        def counting(path: Any) -> list[str]:
            listings.append(time.monotonic())
            return real(path)

        monkeypatch.setattr(gate_step.os, "listdir", counting)
        assert gate_step.wait_for_decision(str(tmp_path), 1, wait_s=1.0, nodes=nodes) is None
        monkeypatch.undo()
        assert at_least <= len(listings) <= at_most, (nodes, len(listings))


def test_a_resubmissions_leftover_decision_is_never_this_attempts(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, [])
    gate_step.write_decision(ctx.run_dir, 3, True)
    StepGate(ctx, ("a",))  # the attempt's folder starts empty
    assert gate_step.wait_for_decision(ctx.run_dir, 3, wait_s=0.05) is None


def test_a_nodes_other_tasks_read_its_first_tasks_copy_and_fall_back_to_the_shared_folder(tmp_path: Path) -> None:
    """Only a node's first task lists the shared decision folder; the others wait on its copy in the
    node's own memory (the last of them to read it removes it), and read the shared one once a
    second in case that memory is not shared."""
    import shutil

    run, env = str(tmp_path / "run"), {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "2"}
    local = gate_step.node_signal(run, 1, "n1", env)
    try:
        gate_step._leave_copy(local, {"go": True, "why": ""})
        started = time.monotonic()
        assert gate_step._wait_on_node(run, 1, local, local_id=1, readers=2, wait_s=5) == {"go": True, "why": ""}
        assert time.monotonic() - started < 0.5  # not the shared folder's once a second
        assert local.is_dir()  # one of the two readers left
        assert gate_step._wait_on_node(run, 1, local, local_id=2, readers=2, wait_s=5) == {"go": True, "why": ""}
        assert not local.exists()  # the last reader removed it
        assert gate_step.node_signal(run, 1, "n1", {**env, "SLURM_STEP_ID": "3"}) != local  # another step's copy
        gate_step._leave_copy(local, {"go": True, "why": ""})
        gate_step.forget_node_signals(run, "n1")
        assert not local.exists()
    finally:
        shutil.rmtree(local, ignore_errors=True)
    gate_step.write_decision(run, 1, False, "n2 failed it")
    started = time.monotonic()
    assert gate_step._wait_on_node(run, 1, local, wait_s=5) == {"go": False, "why": "n2 failed it"}
    assert 0.9 < time.monotonic() - started < 3
