"""The health gate inside the ranks' own srun step: one srun step a start instead of two.

The gate (``orchestrator.node.health``) used to be an srun step of its own before the ranks' step:
at 64 nodes on this machine a step of interpreters cost 3-7 s before any rank started, and on a
real cluster every extra step is a launch across every node. Now, when the ranks' command is
ours and runs on the host (no container: a site's node_check and the interface are the host's),
and the job holds no spare nodes (the separate step checks the spares too, so that one is known
good before it replaces a node), the ranks' step runs it:

1. each node's first task (``SLURM_LOCALID`` 0) runs the node's checks and writes its verdict to
   ``<run>/health/attempt-<K>/<node>.json``, as the separate step's task does;
2. the job's agent reads the verdicts as they come (``orchestrator.backends.slurm.node.agent_gate``)
   and writes one decision, ``<run>/health/attempt-<K>/decision/verdict.json``: go, or stop with why;
3. every task waits for the decision before anything of the user's runs: go starts the
   entrypoint, stop ends the task (exit 1) and the agent goes on as after a failed gate. Only a
   node's first task waits on the shared folder; it copies the decision to the node's own memory
   (``/dev/shm``, where the rank API stages its heartbeats), where the node's other tasks look for
   it every 10 ms (falling back to the shared folder once a second, for a node whose tasks do not
   share that memory): the shared filesystem sees nodes, not ranks.

The decision's folder is listed, not the file looked up (on NFS a lookup of a missing name may be
answered from the client's cache; a listing revalidates it), first after 10 ms, then each wait
half again as long, up to a pause that grows with the job (``decision_pause_s``): 20 ms up to 20
nodes, a millisecond a node above that, 0.5 s from 500 nodes. The folder holds one name at most;
the pause is how late after the decision a node may start its entrypoints (with 0.2 s for every
job, a 2-node start waited 50-110 ms for its next look, and a 4,096-node one listed the folder
20,000 times a second), and the nodes' looks together stay at about 1,000 a second once every node
waits its longest (8,000 at 4,096 nodes, 2 a node). Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from orchestrator.node import health

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Mapping

    from orchestrator.core.payload import Payload

#: The agent decides at the latest this long after the ranks' step started (the token wait and
#: node_check fit in it; a node whose task never started counts as not reporting). A task waits a
#: little longer for the decision before it gives up on the agent.
DECIDE_WITHIN_S = 150.0
TASK_WAIT_S = DECIDE_WITHIN_S + 30.0

_POLL_FIRST_S, _POLL_GROWTH = 0.01, 1.5


def decision_pause_s(nodes: int) -> float:
    """The longest pause between a node's looks for the decision (the module's docstring says why)."""
    return min(0.5, max(0.02, nodes / 1000))


def gate_gpus(payload: Payload) -> int:
    """The GPUs a node must have been granted for this job: one a rank under nccl DDP (a job that
    shares GPUs, or none, is not held to a count)."""
    return payload.ranks_per_node if payload.backend == "nccl" and payload.strategy == "ddp" else 0


def runs_in_step(payload: Payload, spares_held: bool) -> bool:
    """Whether the ranks' step runs the gate (the module's docstring says when); otherwise the agent
    runs it as a step of its own first. The ranks' command must be this version's own
    (``slurm_rank``): a payload whose srun is anything else never reads ``--gate``."""
    return (payload.recovery.health_check and payload.container is None and not spares_held
            and any(a == "orchestrator.backends.slurm.node.slurm_rank" for a in payload.srun or ()))


def decision_dir(run_dir: str, attempt: int) -> Path:
    return health.health_dir(run_dir, attempt) / "decision"


def write_decision(run_dir: str, attempt: int, go: bool, why: str = "") -> None:
    """The agent's one decision for the attempt, replaced atomically (a task reads all of it or none)."""
    from orchestrator.core.atomic_files import write_json_atomic

    write_json_atomic(decision_dir(run_dir, attempt) / "verdict.json", {"go": go, "why": why})


def wait_for_decision(run_dir: str, attempt: int, wait_s: float = TASK_WAIT_S, nodes: int = 1) -> dict[str, Any] | None:
    """The decision once the agent wrote it; None when none came within ``wait_s`` (``nodes``: the
    job's, for the pace of the looks)."""
    folder = decision_dir(run_dir, attempt)
    longest = decision_pause_s(nodes)
    deadline = time.monotonic() + wait_s
    pause = _POLL_FIRST_S
    while True:
        try:
            present = "verdict.json" in os.listdir(folder)
        except OSError:
            present = False
        data = _read_decision(folder / "verdict.json") if present else None
        if data is not None:
            return data
        if time.monotonic() >= deadline:
            return None
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * _POLL_GROWTH, longest)


def check_this_node(payload: Payload, attempt: int, node: str, environ: Mapping[str, str]) -> bool:
    """A node's first task: the node's checks, its verdict written for the agent, its problems on
    stderr (the task's log). False when the verdict could not be written (the agent then hears
    nothing from this node, and says so)."""
    forget_node_signals(payload.run_dir, node)
    cleared = health.clear_staging_left(payload.run_dir)
    if cleared:
        print(f"health: {node}: removed {cleared} heartbeat staging folder(s) that killed ranks left in "
              "node-local memory", file=sys.stderr)
    result = health.check_node(node, payload.run_dir, payload.checkpoint.dir, attempt,
                               interface=payload.interface, gpus=gate_gpus(payload),
                               node_check=list(payload.recovery.node_check or ()) or None, environ=environ)
    for problem in result.problems:
        print(f"health: {node}: {problem}", file=sys.stderr)
    try:
        health.write_result(payload.run_dir, attempt, result)
    except OSError as exc:
        print(f"health: {node}: cannot write the result under {health.health_dir(payload.run_dir, attempt)}: "
              f"{exc}; the node will count as not reporting", file=sys.stderr)
        return False
    return True


def check_part(payload: Payload, attempt: int, local_id: int, environ: Mapping[str, str]) -> str | None:
    """A task's first part in the gate: the node's checks on its first task (the others have none).
    None to go on to ``decision_part``, else why this task must end without its entrypoint."""
    if local_id != 0:
        return None
    node = health.this_node(environ)
    try:
        written = check_this_node(payload, attempt, node, environ)
    except Exception as exc:  # a bug or an odd node: the agent must still hear from this node
        written = False
        problem = f"the health gate failed on {node}: {type(exc).__name__}: {exc}; report this with the run folder"
        print(f"health: {node}: {problem}", file=sys.stderr)
        try:
            health.write_result(payload.run_dir, attempt, health.NodeHealth(node, False, (problem,), 0.0))
            written = True
        except OSError:
            pass
    return None if written else "the health gate's verdict for this node could not be written"


def node_signal(run_dir: str, attempt: int, node: str, environ: Mapping[str, str]) -> Path | None:
    """The folder where a node's first task leaves the decision for the node's other tasks (in this
    user's private folder on the node's own memory: ``orchestrator.core.node_local``), named by the
    SLURM step too: another submission's never passes for this one's. None where the user has no
    private folder on the node (the tasks then read the shared decision)."""
    from orchestrator.core.progress import node_local_file

    step = f"{environ.get('SLURM_JOB_ID', '0')}.{environ.get('SLURM_STEP_ID', '0')}".replace("/", "_")
    try:
        return node_local_file(run_dir, f"gate-a{int(attempt)}-{step}-{health.node_file_name(node)}")
    except OSError:
        return None


def forget_node_signals(run_dir: str, node: str) -> None:
    """Remove this run's decision copies on this node (a node's first task does, before its gate
    and once its rank ended): what tasks killed before they all read one leave behind."""
    import shutil

    from orchestrator.core.progress import node_local_file

    try:
        here = node_local_file(run_dir, "gate-")
    except OSError:
        return
    for path in here.parent.glob(f"{here.name}a*-*-{health.node_file_name(node)}"):
        shutil.rmtree(path, ignore_errors=True)


def _read_decision(path: Path) -> dict[str, Any] | None:
    try:
        return _valid_decision(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def _valid_decision(data: Any) -> dict[str, Any] | None:
    return data if isinstance(data, dict) and isinstance(data.get("go"), bool) else None


def _leave_copy(folder: Path, decision: dict[str, Any]) -> None:
    """The node's first task: the decision for the node's other tasks."""
    from orchestrator.core import node_local

    try:
        node_local.ensure_private(folder)
        node_local.write_private(folder / "decision.json", json.dumps(decision).encode())
    except OSError:
        pass  # the node's other tasks read the shared one


def _take_copy(folder: Path, local_id: int, readers: int) -> dict[str, Any] | None:
    """A node's other task: the copy, if there, in a folder of ours (never one another user made),
    trusted only as a regular file of this user's (what the node's first task wrote:
    ``node_local.read_private``; a link, a FIFO or a stranger's file is never read); the last of the
    ``readers`` to read it removes it (so a job's end leaves nothing in the node's memory, however
    its ranks end)."""
    from orchestrator.core import node_local

    try:
        node_local.check_private(folder)
        decision = _valid_decision(json.loads(node_local.read_private(folder / "decision.json")))
    except (OSError, ValueError):
        return None
    if decision is None:
        return None
    try:
        node_local.touch_private(folder / f"read-{local_id}")
        done = sum(name.startswith("read-") for name in os.listdir(folder)) >= readers
    except OSError:
        done = False
    if done:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    return decision


def _wait_on_node(run_dir: str, attempt: int, local: Path | None, local_id: int = 1, readers: int = 1,
                  wait_s: float = TASK_WAIT_S) -> dict[str, Any] | None:
    """A node's other task: the first task's copy on the node (``_take_copy``), else (once a second)
    the shared one."""
    deadline = time.monotonic() + wait_s
    shared_at = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        decision = _take_copy(local, local_id, readers) if local is not None else None
        if decision is None and time.monotonic() >= shared_at:
            shared_at = time.monotonic() + 1.0
            decision = wait_for_decision(run_dir, attempt, wait_s=0.0)
        if decision is not None:
            return decision
        time.sleep(0.01)
    return None


def decision_part(payload: Payload, attempt: int, local_id: int, environ: Mapping[str, str]) -> str | None:
    """Every task's last part: the agent's decision. None to start the entrypoint, else why not."""
    node = health.this_node(environ)
    local = node_signal(payload.run_dir, attempt, node, environ)
    if local_id == 0:
        decision = wait_for_decision(payload.run_dir, attempt, nodes=payload.nodes)
        if decision is not None and payload.ranks_per_node > 1 and local is not None:
            _leave_copy(local, decision)
    else:
        decision = _wait_on_node(payload.run_dir, attempt, local, local_id, payload.ranks_per_node - 1)
    if decision is None:
        return (f"no decision from the job's agent within {TASK_WAIT_S:g}s of the health gate "
                f"(under {decision_dir(payload.run_dir, attempt)})")
    if decision["go"]:
        return None
    return f"the health gate stopped the attempt: {decision.get('why') or 'a node failed it'}"
