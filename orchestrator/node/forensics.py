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

import os
import time
from pathlib import Path
from typing import Collection, Iterable, Mapping, Optional

from orchestrator.node import join_hook, stack_requests
from orchestrator.core import progress, stack_files, stacks
from orchestrator.node.watchdog import Dumps, Watch
from orchestrator.core.run_folder import RunFolder
from orchestrator.core.end_verdict import EndVerdict


def look(watch: Watch, run_dir: str | Path, log_paths: Mapping[int, Path], now: Optional[float] = None) -> None:
    """Feed the watch one observation: heartbeats (``progress.HeartbeatReader``: one listing of
    ``progress/``, then the node files, or at a large job a share of them a look in turn), the
    joins until every rank has joined (one listing), and the log size only of ranks that send no
    heartbeat (the watch judges a rank by its heartbeat once it has one), at a large job a share
    of those logs a look in turn too (``LogShare``). Before the watch would call a stall, all of
    both are read again. A look costs a few operations per node at most, not per rank, whether
    the ranks' scripts use the rank API or not."""
    now = time.time() if now is None else now
    reader, logs = _readers(watch, run_dir)
    beats = reader.look()
    silent = log_paths.keys() - watch.heartbeat.keys()  # a heartbeat of this attempt: its log says nothing more
    joined = [] if len(watch.joined) >= watch.world_size else join_hook.joined_ranks(run_dir, watch.world_size)
    watch.observe(now, logs.look(log_paths, silent), beats, joined)
    if reader.cover_looks > 1 and watch.stalled(now):  # a verdict is near: the whole picture first
        watch.observe(now, log_sizes(log_paths, sorted(log_paths.keys() - watch.heartbeat.keys())),
                      reader.everything(), [])


def log_sizes(log_paths: Mapping[int, Path], ranks: Iterable[int]) -> dict[int, int]:
    """The sizes of these ranks' logs (0: not there yet, or unreadable): a stat each."""
    sizes = {}
    for rank in ranks:
        try:
            sizes[rank] = os.stat(log_paths[rank]).st_size
        except OSError:
            sizes[rank] = 0
    return sizes


class LogShare:
    """Which logs of the ranks that send no heartbeat (a script without the rank API) a look
    reads: all of them up to ``SHARE_ABOVE``, else a share a look in turn, so that each is read at
    least once every ``cover_looks`` looks, as ``progress.HeartbeatReader`` reads the node files.
    A log not read this look keeps its last size in the watch: its growth is seen at its next
    turn, later than it happened, never a growth that did not happen (so the share only ever
    delays a stall verdict, by at most ``cover_looks`` looks, and ``look`` reads them all before
    one). At 8,192 ranks and stall_s of a minute or more that is 820 stats a second, not 8,192."""

    def __init__(self, cover_looks: int) -> None:
        self.cover_looks = max(1, cover_looks)
        self._cursor = 0

    def look(self, log_paths: Mapping[int, Path], silent: Collection[int]) -> dict[int, int]:
        ranks = sorted(silent)
        share = -(-len(ranks) // self.cover_looks)  # ceil
        if share >= len(ranks) or len(ranks) <= SHARE_ABOVE:
            return log_sizes(log_paths, ranks)
        start = self._cursor % len(ranks)
        self._cursor = start + share
        return log_sizes(log_paths, (ranks + ranks)[start:start + share])


#: Files a look reads at most in steady state, spread over looks: at 1,024 nodes the node files
#: are read a share a look, each at least every COVER_S seconds (and every stall_s / 6).
SHARE_ABOVE = 64
COVER_S = 10.0
_READERS: dict[int, tuple[Watch, progress.HeartbeatReader, LogShare]] = {}


def cover_looks(stall_s: Optional[float]) -> int:
    """In how many looks the watchdog reads every node file once (one a second, the share rule)."""
    return max(1, int(min(COVER_S, stall_s / 6))) if stall_s else 1


def files_per_look(files: int, stall_s: Optional[float]) -> int:
    """How many of ``files`` heartbeat files (or logs) one look reads (``progress.HeartbeatReader``'s
    rule, and ``LogShare``'s)."""
    return files if files <= SHARE_ABOVE else min(files, -(-files // cover_looks(stall_s)))


def _readers(watch: Watch, run_dir: str | Path) -> tuple[progress.HeartbeatReader, LogShare]:
    """The heartbeat reader and the log share of this watch (one each per attempt's watch, kept
    while it is in use)."""
    held = _READERS.get(id(watch))
    if held is not None and held[0] is watch:
        return held[1], held[2]
    looks = cover_looks(watch.stall_s)
    reader = progress.HeartbeatReader(run_dir, watch.world_size, looks, share_above=SHARE_ABOVE)
    if len(_READERS) > 32:
        _READERS.clear()  # watches of attempts long over
    _READERS[id(watch)] = (watch, reader, LogShare(looks))
    return reader, _READERS[id(watch)][2]


def waits_of(dumps: Mapping[int, str]) -> dict[str, str]:
    """Rank -> where it was (user-code line, collective), for the record; a stopped rank of a
    ``Dumps`` is said to be stopped."""
    waits = {r: stacks.where(text).text() for r, text in dumps.items()}
    if isinstance(dumps, Dumps):
        waits.update({r: STOPPED_WAIT for r in dumps.stopped})
    return {str(r): text for r, text in sorted(waits.items())}


#: Where a stopped rank was, in the record's waits.
STOPPED_WAIT = "stopped (SIGSTOP, ^Z or a debugger), not asked for its stacks"


def capture_local(run_dir: str | Path, reason: str, ranks: Optional[list[int]] = None) -> Dumps:
    """Ask the ranks on this machine for their stacks and save them in <run>/stacks/. A rank that
    could not be asked on this platform (``stack_requests.why_not_signalled``) gets a file saying
    why, so the saved stacks never look like ranks that had ended; only real dumps are returned,
    with the ranks not asked because they are stopped (``Dumps.stopped``: the watchdog names
    such a rank as stopped, not as one that did not answer)."""
    dumps, refused = stack_requests.request_local_explained(run_dir, ranks)
    unasked = {rank: f"(not asked: {why})\n" for rank, why in refused.items() if why != stack_requests.ENDED}
    if dumps or unasked:
        stack_files.save(run_dir, {**unasked, **dumps}, reason)
    return Dumps(dumps, stopped=[rank for rank, why in refused.items() if why == stack_requests.STOPPED])


def write_end(run_dir: str | Path, reason: str, *, error: str = "", failed_rank: Optional[int] = None,
              waits: Optional[Mapping[str, str]] = None, warning: str = "",
              unhealthy: Optional[Mapping[str, str]] = None) -> None:
    """The agent's verdict (``core.end_verdict.EndVerdict``), written whole to <run>/end.json: the
    one writer of that file."""
    from orchestrator.core.atomic_files import write_json_atomic

    verdict = EndVerdict(reason=str(reason), time=time.time(), error=error or "", failed_rank=failed_rank,
                         waits=dict(waits or {}), warning=warning or "", unhealthy=dict(unhealthy or {}))
    write_json_atomic(RunFolder.of(run_dir).end, verdict.to_json())


def read_end(run_dir: str | Path) -> Optional[EndVerdict]:
    """end.json, read as hostile input (``orchestrator.core.safe_read``: a FIFO there once hung a
    SLURM status refresh; ``EndVerdict.from_json``: each field of its type, or absent); None when
    missing, unreadable or no verdict of ours. The one reader of that file."""
    from orchestrator.core import safe_read

    try:
        data = safe_read.read_json(RunFolder.of(run_dir).end)
    except (safe_read.Unreadable, OSError):
        return None
    return EndVerdict.from_json(data)
