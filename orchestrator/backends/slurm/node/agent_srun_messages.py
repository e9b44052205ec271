"""srun's own messages, as the job's agent reads them on their way to the batch log: the nodes
the ranks' step lost, every task that ended badly (with ``recovery.survivors: keep`` the others
run on), whether the controller still delays the step's creation, and the rank a signal killed.
Standard library only.
"""

from __future__ import annotations

import sys
import time
from typing import IO

from orchestrator.backends.slurm.node.agent_decisions import NODE_FAILURE, SRUN_TASK_ENDED, ended_tasks, srun_signal_death
from orchestrator.backends.slurm.node.agent_state import AgentContext, AgentState, say
from orchestrator.core.run_folder import RunFolder
from orchestrator.core.states import EndReason


def relay_srun_messages(stream: IO[bytes] | None, state: AgentState) -> None:
    """srun's messages to the batch log, read on the way: the nodes the step lost, and the first
    task that ended badly (only it is the suspect: srun kills the rest after it)."""
    if stream is None:
        return
    out = getattr(sys.stderr, "buffer", None)
    for line in stream:
        try:
            if out is not None:
                out.write(line)
                out.flush()
        except (OSError, ValueError):
            pass  # the batch log is gone: keep draining, or srun would block
        note_srun_line(line.decode(errors="replace"), state)


def note_srun_line(text: str, state: AgentState) -> None:
    """What one of srun's lines says (or the same words for ranks forked from warm standbys,
    ``agent_warm_start``): a lost node, the tasks that ended badly, the first of them."""
    note_step_creation(text, state)
    lost = NODE_FAILURE.search(text)
    if lost:
        state.lost_nodes.add(lost.group(1))
    state.task_ends.update(ended_tasks(text))
    if state.first_end is None and SRUN_TASK_ENDED.search(text):
        state.first_end = text
        state.killed = srun_signal_death(text)


#: srun's words while the controller delays the step ("Job step creation temporarily disabled,
#: retrying (Requested nodes are busy)"), and once it made it ("Step created for StepId=...").
_STEP_DELAYED = "step creation temporarily disabled"
_STEP_CREATED = "step created for"


def note_step_creation(text: str, state: AgentState) -> None:
    """Whether srun still waits for the controller to create the ranks' step: the health gate's
    clock (``agent_gate.StepGate``) does not run while it does (no task can report before its step
    exists: a step delayed past the gate's bound blamed every node)."""
    lowered = text.lower()
    if _STEP_DELAYED in lowered and state.step_waiting_since is None:
        state.step_waiting_since = time.monotonic()
    elif _STEP_CREATED in lowered:
        state.step_waiting_since = None


def name_killed_rank(ctx: AgentContext) -> None:
    """A rank ended by a signal leaves no traceback, and its peers then fail for want of it: name
    it (from srun's message) as the job's failure, unless it recorded an error itself."""
    if ctx.state.killed is None:
        return
    host, rank, what = ctx.state.killed
    if host in ctx.state.lost_nodes or RunFolder.of(ctx.run_dir).error(rank).exists():
        return  # a lost node's ranks die with it: the node failure is the story
    from orchestrator.node import forensics

    message = (f"rank {rank} on {host} was killed by a signal ({what}), with no traceback: the kernel's OOM "
               "killer, a segfault in native code, or someone's kill; its peers failed after it")
    say(message)
    forensics.write_end(ctx.run_dir, reason=EndReason.RANK_KILLED, failed_rank=rank, error=message)
