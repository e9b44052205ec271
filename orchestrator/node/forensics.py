"""What the local supervisor and the SLURM job's agent both do with a run folder while ranks
run: look at the ranks' progress for the watchdog, capture and save their stacks, and record
the verdict of an abnormal end. Standard library only (the agent runs on a compute node).

Run folder, per attempt (cleared when an attempt starts)::

    <run>/ranks/rank-N.json       who each rank is (host, pid, start time): written by the rank
    <run>/joined/rank-N           the rank's init_process_group returned
    <run>/progress/node-G.json    the heartbeats of node G's ranks (orchestrator.core.progress)
    <run>/stacks/live/rank-N.txt  its stack dumps on request (orchestrator stacks)
    <run>/stacks/rank-N.txt       the stacks saved at an abnormal end (kept until the next end)
    <run>/end.json                the agent's verdict (SLURM): reason, failed rank, message, waits
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from orchestrator.node import join_hook, stack_requests
from orchestrator.core import progress, stack_files, stacks
from orchestrator.node.watchdog import Watch
from orchestrator.core.run_folder import RunFolder


def look(watch: Watch, run_dir: str | Path, log_paths: Mapping[int, Path], now: Optional[float] = None) -> None:
    """Feed the watch one observation: heartbeats (``progress.HeartbeatReader``: one listing of
    ``progress/``, then the node files, or at a large job a share of them a look in turn, all of
    them again before the watch would call a stall), the joins until every rank has joined (one
    listing), and the log size only of ranks that send no heartbeat (the watch judges a rank by
    its heartbeat once it has one). A look at a job of rank-API scripts costs a few operations
    per node at most, not per rank."""
    now = time.time() if now is None else now
    reader = _reader(watch, run_dir)
    beats = reader.look()
    sizes = {}
    for rank in log_paths.keys() - watch.heartbeat.keys():  # a heartbeat of this attempt: its log says nothing more
        try:
            sizes[rank] = log_paths[rank].stat().st_size
        except OSError:
            sizes[rank] = 0
    joined = [] if len(watch.joined) >= watch.world_size else join_hook.joined_ranks(run_dir, watch.world_size)
    watch.observe(now, sizes, beats, joined)
    if reader.cover_looks > 1 and watch.stalled(now):
        watch.observe(now, {}, reader.everything(), [])  # a verdict is near: the whole picture first


#: Files a look reads at most in steady state, spread over looks: at 1,024 nodes the node files
#: are read a share a look, each at least every COVER_S seconds (and every stall_s / 6).
SHARE_ABOVE = 64
COVER_S = 10.0
_READERS: dict[int, tuple[Watch, progress.HeartbeatReader]] = {}


def cover_looks(stall_s: Optional[float]) -> int:
    """In how many looks the watchdog reads every node file once (one a second, the share rule)."""
    return max(1, int(min(COVER_S, stall_s / 6))) if stall_s else 1


def files_per_look(files: int, stall_s: Optional[float]) -> int:
    """How many of ``files`` heartbeat files one look reads (``progress.HeartbeatReader``'s rule)."""
    return files if files <= SHARE_ABOVE else min(files, -(-files // cover_looks(stall_s)))


def _reader(watch: Watch, run_dir: str | Path) -> progress.HeartbeatReader:
    """The heartbeat reader of this watch (one per attempt's watch, kept while it is in use)."""
    held = _READERS.get(id(watch))
    if held is not None and held[0] is watch:
        return held[1]
    reader = progress.HeartbeatReader(run_dir, watch.world_size, cover_looks(watch.stall_s), share_above=SHARE_ABOVE)
    if len(_READERS) > 32:
        _READERS.clear()  # watches of attempts long over
    _READERS[id(watch)] = (watch, reader)
    return reader


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
    from orchestrator.core.atomic_files import write_json_atomic

    write_json_atomic(RunFolder.of(run_dir).end, {"time": time.time(), **verdict})


def read_end(run_dir: str | Path) -> Optional[dict[str, Any]]:
    try:
        data = json.loads(RunFolder.of(run_dir).end.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
