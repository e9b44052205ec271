"""The job agent's side of the health gate inside the ranks' step (``orchestrator.backends.slurm.node.gate_step``):
it reads the nodes' verdicts as they come, and writes the one decision every task waits for.

Its looks come 10-20 ms apart, each one listing of the attempt's health folder (a name a node): one
process listing one folder, and every task's entrypoint waits on what it sees (with looks up to
0.1 s apart, a 2-node gate took 0.31 s every time, the decision waiting for the next look). Over
the longest wait (a node that never reports) that is 7,500 listings. The verdicts are read once, when every
node's is there, when the step ended, or ``DECIDE_WITHIN_S`` after the step started (a node that
never reported failed the gate: silence is what a dead node, a task that never started, or a hung
filesystem look like). Standard library only.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Sequence

from orchestrator.backends.slurm.node.agent_state import AgentContext
from orchestrator.backends.slurm.node.slurm_task import GATE_OPTION
from orchestrator.core.recovery import Failure
from orchestrator.core.states import FailureKind
from orchestrator.backends.slurm.node import gate_step
from orchestrator.node import health, shared_folders

_POLL_FIRST_S, _POLL_GROWTH, _POLL_MAX_S = 0.01, 1.5, 0.02


class StepGate:
    """One attempt's gate inside the ranks' step: ``argv`` for the ranks' srun, then ``look`` from
    the agent's loop until ``decided``; ``failure`` says what a failed gate blames."""

    def __init__(self, ctx: AgentContext, nodes: tuple[str, ...]) -> None:
        assert ctx.attempt is not None
        self.ctx = ctx
        self.nodes = nodes
        self.number = ctx.attempt.number
        self.folder = health.health_dir(ctx.run_dir, self.number)
        shutil.rmtree(self.folder, ignore_errors=True)  # a resubmission's leftovers: never this attempt's
        for line in shared_folders.write_agent_token(ctx.run_dir, ctx.payload.checkpoint.dir, self.number,
                                             health.this_node()):
            ctx.say(f"health gate: {line}")
        self.names = {health.result_name(n) for n in nodes}
        self.started = time.monotonic()
        self.decided = False
        self.failure: Failure | None = None
        self._next = self.started + _POLL_FIRST_S
        self._pause = _POLL_FIRST_S
        self._arrived = 0  # the verdicts seen at the last look
        self._last_look = self.started

    def argv(self) -> list[str]:
        return [GATE_OPTION, str(self.number)]

    def wait_s(self) -> float:
        """How long the agent's loop may sleep before the next look is due."""
        return max(0.0, self._next - time.monotonic())

    def look(self, step_ended: bool = False) -> bool:
        """One look when due (or at once once the step ended): True when it decided now."""
        now = time.monotonic()
        if self.decided or (now < self._next and not step_ended):
            return False
        try:
            seen = set(os.listdir(self.folder))
        except OSError:
            seen = set()
        arrived = len(self.names & seen)
        self._pause = _POLL_FIRST_S if arrived > self._arrived else min(self._pause * _POLL_GROWTH, _POLL_MAX_S)
        self._arrived = arrived
        self._next = now + self._pause
        if step_ended and not self.names & seen:  # no task of the step ran: srun's own message is the story
            self.decided = True
            self.ctx.say("health gate: the ranks' step ended before any node reported")
            return True
        waiting = self.ctx.state.step_waiting_since
        if waiting is not None:  # srun still waits for its step: no task can have reported; the clock stops
            self.started += now - max(waiting, self._last_look)
        self._last_look = now
        if self.names <= seen or step_ended or now - self.started >= gate_step.DECIDE_WITHIN_S:
            self._decide()
            return True
        return False

    def _decide(self) -> None:
        self.decided = True
        self.failure = gate_verdict(self.ctx, self.number, self.nodes, time.monotonic() - self.started,
                                    " (inside the ranks' step)")
        why = "" if self.failure is None else \
            f"node(s) {', '.join(self.failure.blamed)} failed it; the job's batch log says why"
        try:
            gate_step.write_decision(self.ctx.run_dir, self.number, self.failure is None, why)
        except OSError as exc:  # the tasks give up waiting (gate_step.TASK_WAIT_S) and end
            self.ctx.say(f"health gate: cannot write the decision under {self.folder}: {exc}")


def gate_verdict(ctx: AgentContext, number: int, nodes: Sequence[str], seconds: float, where: str = "") -> Failure | None:
    """The gate's verdict once it ran, however it ran (inside the ranks' step, or a step of its own:
    ``AgentRecovery.health_gate``): every node's result read (a node without one failed), the
    checkpoint folder's tokens removed, the attempt's record of it, the batch log's line; the
    failure (unhealthy, blamed on the nodes that failed) or None."""
    assert ctx.attempt is not None
    folders = {f: named for f, _, named in shared_folders.token_folders(ctx.run_dir, ctx.payload.checkpoint.dir, number)}
    bad = health.unhealthy(health.read_results(ctx.run_dir, number, nodes), health.this_node(), folders)
    shutil.rmtree(health.checkpoint_tokens(ctx.payload.checkpoint.dir, number).parent, ignore_errors=True)
    ctx.attempt.health = bad
    ctx.attempt.times["gate_s"] = round(seconds, 3)
    if not bad:
        ctx.say(f"health gate: {len(nodes)} node(s) healthy in {seconds:.1f}s{where}")
        return None
    why = "; ".join(f"{node}: {problem}" for node, problem in sorted(bad.items()))
    ctx.say(f"health gate: {why}")
    return Failure(FailureKind.UNHEALTHY, f"the health gate failed: {why}", tuple(sorted(bad)))
