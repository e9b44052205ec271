"""recovery.on: [straggler] (issue 51, item 3), the decisions: the job's agent names the persistent
straggler from the ranks' progress files, ends the attempt blaming its node, and recovery restarts
the ranks without that node (a spare takes its place); never when recovery.on does not list it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from orchestrator.backends.slurm.node.agent_recovery import AgentRecovery
from orchestrator.backends.slurm.node.agent_requeue import Requeuer
from orchestrator.backends.slurm.node.agent_state import AgentContext
from orchestrator.backends.slurm.node.agent_watch import AgentWatch
from orchestrator.core.progress import ProgressWriter
from orchestrator.core.recovery import decide
from orchestrator.core.states import Phase

from .test_survivors_slurm import agent_ctx


def _ctx(tmp: Path, on: list[str]) -> AgentContext:
    ctx = agent_ctx(tmp, cpu_ranks_per_node=1, watchdog={"straggler_window_s": 0.3},
                    recovery={"max_restarts": 2, "spares": 1, "on": on})
    ctx.state.started = time.time() - 1
    return ctx


def _report(ctx: AgentContext, busy: dict[int, float]) -> None:
    from orchestrator.core.progress import BUSY_WARMUP

    for rank, value in busy.items():
        writer = ProgressWriter(ctx.run_dir, rank)
        for step in range(BUSY_WARMUP + 1):  # the first steps' figures are left out (a first step's set-up)
            writer.report(step, force=True, busy_s=value)


def test_a_straggler_named_for_the_window_ends_the_attempt_blaming_its_node(tmp_path: Path,
                                                                              monkeypatch: Any) -> None:
    from orchestrator.backends.slurm.node import agent_recovery
    from orchestrator.node import forensics

    ctx = _ctx(tmp_path, ["crash", "straggler"])
    watch = AgentWatch(ctx, {})
    _report(ctx, {0: 0.010, 1: 0.011})
    assert watch.straggler() is None  # alike
    _report(ctx, {0: 0.010, 1: 0.040})
    assert watch.straggler() is None  # named now, not yet for the window
    time.sleep(0.35)
    assert watch.straggler() == "straggler"
    assert ctx.state.straggler_node == "node2"
    end = forensics.read_end(ctx.run_dir)
    assert end is not None and end.reason == "straggler" and end.failed_rank == 1
    assert "straggler: rank 1 on node2 spends 40 ms a step outside collectives" in end.error
    ctx.state.enter(Phase.ENDING)
    monkeypatch.setattr(agent_recovery.slurm_controller, "nodes_gone", lambda hosts: set())
    failure = AgentRecovery(ctx, Requeuer(ctx)).classify()
    assert (failure.kind, failure.blamed) == ("straggler", ("node2",))
    decision = decide(ctx.payload.recovery, ctx.history, failure, True, 2, None)
    assert decision.restart and decision.exclude == ("node2",), decision


def test_no_straggler_ends_anything_unless_recovery_on_lists_it(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, ["crash", "hang"])
    watch = AgentWatch(ctx, {})
    _report(ctx, {0: 0.010, 1: 0.040})
    watch.straggler()
    time.sleep(0.35)
    assert watch.straggler() is None and ctx.state.straggler_node is None


def test_an_earlier_attempts_reports_name_no_straggler(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, ["crash", "straggler"])
    _report(ctx, {0: 0.010, 1: 0.040})
    ctx.state.started = time.time() + 1  # this attempt began after those reports
    watch = AgentWatch(ctx, {})
    watch.straggler()
    time.sleep(0.35)
    assert watch.straggler() is None
