"""``orchestrator chaos RUN``: break one's own running job on purpose, to see the recovery its spec
asks for before a real failure does: end a rank (``--kill-rank N``, SIGKILL: a crash with no
traceback), freeze one (``--stop-rank N``, SIGSTOP: a hang the watchdog must find), or take a node
away (``--node-down NAME``, SLURM, where the caller may: ``scontrol update State=DOWN``). Each
injection is recorded in ``<run>/chaos.jsonl`` (when, what, which attempt), and the recovery that
follows is measured like any other (``orchestrator.core.attempt_times``: ``status`` shows it).

It refuses what would prove nothing or hurt someone else: a run that is not running, one that is
not the caller's (another user's folder, another host's processes), one whose spec has no restart
to recover with (``recovery.max_restarts: 0``), a freeze the watchdog would never see
(no ``watchdog.stall_s``), a rank or node that is not the run's.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from orchestrator.core import ownership
from orchestrator.backends.slurm.node import slurm_controller
from orchestrator.core.errors import UsageError
from orchestrator.core.payload import Payload
from orchestrator.core.records import RunRecord, resolve_run
from orchestrator.core.run_folder import RunFolder
from orchestrator.core.states import State

CHAOS_FILE = "chaos.jsonl"
#: srun --overlap has to create a step in the allocation; a busy controller takes its time.
SRUN_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Injection:
    """One failure to inject: what, and on which rank or node."""

    action: str  # kill-rank, stop-rank, node-down
    rank: Optional[int] = None
    node: Optional[str] = None


def refusal(record: RunRecord, payload: Payload, injection: Injection, uid: int) -> Optional[str]:
    """Why this injection must not happen (None: it may). Pure but for the folder's owner."""
    if record.state != State.RUNNING:
        return f"{record.run_id} is {record.state}, not RUNNING: chaos breaks a running job"
    try:
        owner = os.stat(record.run_dir).st_uid
    except OSError as exc:
        return f"cannot read {record.run_dir} ({exc.strerror})"
    if uid != 0 and owner != uid:
        return f"{record.run_id} belongs to another user (uid {owner}): chaos breaks only your own jobs"
    if payload.recovery.max_restarts == 0:
        return (f"{record.run_id} has recovery.max_restarts: 0, so nothing would recover from the failure; set "
                "recovery.max_restarts (e.g. 2) and run it again")
    if injection.action == "stop-rank" and payload.watchdog.stall_s is None:
        return ("a stopped rank is a hang, and this spec has no watchdog.stall_s to find it: its peers would wait "
                "forever; set watchdog.stall_s (e.g. 60)")
    if injection.rank is not None and not 0 <= injection.rank < max(1, record.world_size):
        return f"rank {injection.rank} is not in {record.run_id} (ranks 0-{max(1, record.world_size) - 1})"
    if injection.action == "node-down" and record.executor != "slurm":
        return "--node-down takes a SLURM node away; a local run has none: use --kill-rank or --stop-rank"
    if record.executor != "slurm":
        return ownership.foreign_reason(record.host, record.folder_id, record.run_dir)
    return None


def inject(ref: str, injection: Injection) -> str:
    """Inject the failure into the run and record it; the line to print. UsageError when refused."""
    from orchestrator.api import refresh_records

    # the scheduler asked (SLURM): the record says what the job is now
    record = refresh_records([RunRecord.load(resolve_run(ref))])[0]
    folder = RunFolder.of(record.run_dir)
    payload = Payload.load(folder.payload)
    why = refusal(record, payload, injection, os.geteuid())
    if why is not None:
        raise UsageError(f"chaos refused: {why}")
    if injection.action == "node-down":
        target = _node_down(record, injection.node or "")
    else:
        target = _signal_rank(record, injection.rank or 0, "KILL" if injection.action == "kill-rank" else "STOP")
    from orchestrator.core.recovery import History

    attempt = max(record.attempts, len(History.load(record.run_dir).attempts))  # SLURM: the history counts
    entry = {"time": time.time(), "action": injection.action, "target": target, "attempt": attempt}
    with open(Path(record.run_dir) / CHAOS_FILE, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")
    return (f"{record.run_id}: {injection.action} {target} (attempt {attempt}); follow the recovery with "
            f"'orchestrator status {record.run_id}'")


def _signal_rank(record: RunRecord, rank: int, name: str) -> str:
    from orchestrator.backends.slurm.node.chaos_node import signal_rank
    from orchestrator.node.stack_requests import rank_procs

    rp = rank_procs(record.run_dir).get(rank)
    if rp is None:
        raise UsageError(f"chaos refused: rank {rank} has not recorded itself yet (the job is starting): try again")
    where = f"rank {rank} on {rp.host}"
    if record.executor != "slurm":
        why = signal_rank(record.run_dir, rank, name)
    else:
        why = _on_node(record, rp.host, rank, name)
    if why:
        raise UsageError(f"chaos: {where} was not signalled: {why}")
    return where


def _on_node(record: RunRecord, host: str, rank: int, name: str) -> Optional[str]:
    """``orchestrator.backends.slurm.node.chaos_node`` on the rank's node, through ``srun --overlap`` in the run's job."""
    from orchestrator.core.interpreter import module_argv

    if not record.job_ids:
        return "the run has no SLURM job yet"
    payload = Payload.load(RunFolder.of(record.run_dir).payload)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_")) or k == "SLURM_CONF"}
    env["SLURM_EXPORT_ENV"] = "ALL"
    argv = ["srun", "--overlap", f"--jobid={record.job_ids[-1]}", f"--nodelist={host}", "--nodes=1", "--ntasks=1",
            "--quiet", *module_argv(payload.python, "orchestrator.backends.slurm.node.chaos_node", record.run_dir, str(rank), name,
                                    unbuffered=False)]
    answer = slurm_controller.run(argv, SRUN_TIMEOUT_S, env=env, quiet_stdin=True)
    return None if answer.ok else answer.complaint


def _node_down(record: RunRecord, node: str) -> str:
    from orchestrator.core.recovery import History

    nodes = History.load(record.run_dir).attempts[-1].nodes if History.load(record.run_dir).attempts else []
    if node not in nodes:
        raise UsageError(f"chaos refused: {node} is not one of the run's nodes now ({', '.join(nodes) or 'none yet'})")
    answer = slurm_controller.run(["scontrol", "update", f"NodeName={node}", "State=DOWN",
                                   f"Reason=orchestrator chaos on {record.run_id}"], SRUN_TIMEOUT_S)
    if not answer.ok:
        raise UsageError(f"chaos: could not take {node} down ({answer.complaint}); setting a node DOWN needs the "
                         "SLURM administrator's rights: use --kill-rank or --stop-rank instead")
    print(f"[orchestrator] {node} is DOWN; bring it back with: scontrol update NodeName={node} State=RESUME",
          file=sys.stderr)
    return f"node {node}"
