"""What the local supervisor and the SLURM job's agent both do with a run folder while ranks
run: look at the ranks' progress for the watchdog, capture and save their stacks, and record
the verdict of an abnormal end. Standard library only (the agent runs on a compute node).

Run folder, per attempt (cleared when an attempt starts)::

    <run>/ranks/rank-N.json       who each rank is (host, pid, start time): written by the rank
    <run>/joined/rank-N           the rank's init_process_group returned
    <run>/progress/node-G.json    the heartbeats of node G's ranks (orchestrator.progress)
    <run>/stacks/live/rank-N.txt  its stack dumps on request (orchestrator stacks)
    <run>/stacks/rank-N.txt       the stacks saved at an abnormal end (kept until the next end)
    <run>/end.json                the agent's verdict (SLURM): reason, failed rank, message, waits
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from orchestrator import join_hook, stack_files, stack_requests, stacks
from orchestrator.progress import read_progress
from orchestrator.watchdog import Watch
from orchestrator.run_folder import RunFolder


def look(watch: Watch, run_dir: str | Path, log_paths: Mapping[int, Path], now: Optional[float] = None) -> None:
    """Feed the watch one observation: heartbeats (one listing of ``progress/`` and a read per
    node), the joins until every rank has joined (one listing), and the log size only of ranks
    that send no heartbeat (the watch judges a rank by its heartbeat once it has one): a look
    at a job of rank-API scripts costs a few operations per node, not per rank."""
    beats = {p.rank: p.time for p in read_progress(run_dir, watch.world_size) if p is not None}
    sizes = {}
    for rank, path in log_paths.items():
        if rank in watch.heartbeat:  # a heartbeat of this attempt: its log says nothing more
            continue
        try:
            sizes[rank] = path.stat().st_size
        except OSError:
            sizes[rank] = 0
    joined = [] if len(watch.joined) >= watch.world_size else join_hook.joined_ranks(run_dir, watch.world_size)
    watch.observe(time.time() if now is None else now, sizes, beats, joined)


def waits_of(dumps: Mapping[int, str]) -> dict[str, str]:
    """Rank -> where it was (user-code line, collective), for the record."""
    return {str(r): stacks.where(text).text() for r, text in sorted(dumps.items())}


def capture_local(run_dir: str | Path, reason: str, ranks: Optional[list[int]] = None) -> dict[int, str]:
    """Ask the ranks on this machine for their stacks and save them in <run>/stacks/. A rank that
    could not be asked on this platform (``stack_requests.why_not_signalled``) gets a file saying
    why, so the saved stacks never look like ranks that had ended; only real dumps are returned."""
    dumps, refused = stack_requests.request_local_explained(run_dir, ranks)
    unasked = {rank: f"(not asked: {why})\n" for rank, why in refused.items() if why != stack_requests.ENDED}
    if dumps or unasked:
        stack_files.save(run_dir, {**unasked, **dumps}, reason)
    return dumps


def write_end(run_dir: str | Path, **verdict: Any) -> None:
    from orchestrator.records import write_json_atomic

    write_json_atomic(RunFolder.of(run_dir).end, {"time": time.time(), **verdict})


def read_end(run_dir: str | Path) -> Optional[dict[str, Any]]:
    try:
        data = json.loads(RunFolder.of(run_dir).end.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
