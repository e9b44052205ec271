"""Asking live ranks for their Python stacks: faulthandler on a real-time signal.

Standard library only (the ranks and the SLURM probe import it).

**Mechanism.** The launcher registers ``faulthandler`` on ``STACK_SIGNAL`` before the user's
entrypoint runs (``install``): on that signal the rank writes the stack of every thread, from a C
signal handler, into ``<run>/stacks/live/rank-N.txt`` (opened once, append mode). It needs no
ptrace permission (py-spy does: CAP_SYS_PTRACE or a permissive ptrace_scope, often denied on
clusters and in containers), nothing installed on the compute nodes, it answers while the rank
is blocked in C++ (a gloo or NCCL all_reduce, holding the GIL or not), and it costs nothing
until the signal comes. The rank keeps running.

The launcher also records ``<run>/ranks/rank-N.json`` (host, pid, start time in clock ticks), so
that the signal only ever goes to the process that still is that rank (``procs.signal_if_same``).
A reader notes each file's size, signals, waits until the file grew and stopped growing (a
bounded wait), and reads what was appended. On SLURM the ranks live on other nodes: the same
request runs there through ``srun --overlap`` (``orchestrator.stacks_probe``) and the files are
read from the shared run folder.

What a dump says is read by ``orchestrator.stacks``; the dumps saved at an abnormal end are
``orchestrator.stack_files``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from orchestrator import procs
from orchestrator.ownership import this_host
from orchestrator.run_folder import RunFolder

#: The signal a rank dumps its stacks on. A real-time signal: no library or user script uses it
#: by convention (NCCL may catch USR1, users own USR2 and TERM), and its default action is
#: never taken because the launcher registers it before the entrypoint runs.
STACK_SIGNAL = signal.SIGRTMIN + 4

#: How long a dump file must stay the same size to count as finished (faulthandler writes the
#: whole dump at once, from its signal handler), and how long a whole request may take.
SETTLE_S = 0.25
REQUEST_TIMEOUT_S = 4.0

_KEPT: list = []  # the open dump file of this rank (faulthandler holds only its descriptor)


# ---- paths ------------------------------------------------------------------------------------
def live_path(run_dir: str | Path, rank: int) -> Path:
    return RunFolder.of(run_dir).live_stack(rank)


def rank_record_path(run_dir: str | Path, rank: int) -> Path:
    return RunFolder.of(run_dir).rank_record(rank)


# ---- on the rank --------------------------------------------------------------------------------
def install(run_dir: str | Path, rank: int) -> None:
    """Register the stack dump and record who this rank is. Called by the launcher on the rank,
    before the entrypoint. A failure here never stops the rank: it is reported and skipped."""
    import faulthandler

    try:
        path = live_path(run_dir, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a", encoding="utf-8")
        faulthandler.register(STACK_SIGNAL, file=fh, all_threads=True, chain=False)
        _KEPT[:] = [fh]
        me = os.getpid()
        from orchestrator.records import write_json_atomic

        write_json_atomic(rank_record_path(run_dir, rank), {
            "rank": rank, "host": socket.gethostname(), "host_key": this_host(), "pid": me,
            "start_ticks": procs.start_time(me),
            "time": time.time()})
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"[launcher] rank {rank}: live stacks are not available ({exc})", flush=True)


# ---- asking ranks for their stacks ---------------------------------------------------------------
@dataclass(frozen=True)
class RankProc:
    rank: int
    host: str
    pid: int
    start_ticks: int | None
    host_key: str | None = None  # ownership.this_host() of the rank: where its PID means something

    def here(self) -> bool:
        """True only where this rank's PID names it: same host, boot and PID namespace (a rank
        recorded by an older version: same hostname)."""
        return self.host_key == this_host() if self.host_key else self.host == socket.gethostname()


def rank_procs(run_dir: str | Path) -> dict[int, RankProc]:
    """The ranks' own records (``<run>/ranks/rank-N.json``), by rank; unreadable ones are skipped."""
    out: dict[int, RankProc] = {}
    folder = RunFolder.of(run_dir).ranks
    for path in folder.glob("rank-*.json") if folder.is_dir() else []:
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            out[int(d["rank"])] = RankProc(int(d["rank"]), str(d["host"]), int(d["pid"]),
                                           None if d.get("start_ticks") is None else int(d["start_ticks"]),
                                           str(d["host_key"]) if d.get("host_key") else None)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def sizes(run_dir: str | Path, ranks: Iterable[int]) -> dict[int, int]:
    """Each rank's live dump file size now (0 where there is none yet)."""
    out = {}
    for rank in ranks:
        try:
            out[rank] = live_path(run_dir, rank).stat().st_size
        except OSError:
            out[rank] = 0
    return out


def signal_ranks(run_dir: str | Path, ranks: Iterable[int] | None = None) -> list[int]:
    """Send STACK_SIGNAL to each rank (all, or those given) that runs here (``RankProc.here``),
    is still that rank and still has the handler. Returns the ranks signalled."""
    wanted = None if ranks is None else set(ranks)
    sent = []
    for rank, rp in sorted(rank_procs(run_dir).items()):
        if (wanted is None or rank in wanted) and rp.here() and answers(rp) and \
                procs.signal_if_same(rp.pid, rp.start_ticks, STACK_SIGNAL):
            sent.append(rank)
    return sent


def answers(rp: RankProc) -> bool:
    """True while the rank's process still has the launcher's stack handler. A rank that exec'd
    another program (``exec numactl ...``) lost it, and the signal's default action would end
    it: it is never sent the signal."""
    return procs.same_process(rp.pid, rp.start_ticks) and procs.catches(rp.pid, STACK_SIGNAL)


def wait_written(run_dir: str | Path, before: Mapping[int, int], timeout_s: float = REQUEST_TIMEOUT_S) -> dict[int, int]:
    """Wait until each file grew past its size in ``before`` and then kept its size for SETTLE_S,
    or until ``timeout_s``. Returns each rank's final size."""
    deadline = time.monotonic() + timeout_s
    last = dict(before)
    stable_since = {r: None for r in before}  # type: dict[int, float | None]
    while True:
        now = time.monotonic()
        current = sizes(run_dir, before)
        for r, size in current.items():
            if size != last[r] or size <= before[r]:
                stable_since[r] = None if size <= before[r] else now
            elif stable_since[r] is None:
                stable_since[r] = now
            last[r] = size
        done = all(s is not None and now - s >= SETTLE_S for s in stable_since.values())
        if done or now >= deadline:
            return current
        time.sleep(0.05)


def read_from(run_dir: str | Path, rank: int, start: int, end: int | None = None) -> str:
    """What a rank's live dump file holds from ``start`` to ``end`` (its end: None); '' if unreadable."""
    try:
        with open(live_path(run_dir, rank), "rb") as fh:
            fh.seek(start)
            data = fh.read() if end is None else fh.read(max(0, end - start))
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


def request_local(run_dir: str | Path, ranks: Iterable[int] | None = None,
                  timeout_s: float = REQUEST_TIMEOUT_S) -> dict[int, str]:
    """Signal the ranks on this machine and return each one's fresh dump ('' for a rank that did
    not answer in time). Ranks that are gone (or not on this machine) are left out."""
    known = rank_procs(run_dir)
    chosen = sorted(known if ranks is None else [r for r in ranks if r in known])
    before = sizes(run_dir, chosen)
    sent = signal_ranks(run_dir, chosen)
    if not sent:
        return {}
    after = wait_written(run_dir, {r: before[r] for r in sent}, timeout_s)
    return {r: read_from(run_dir, r, before[r], after[r]) for r in sent}
