"""Asking live ranks for their Python stacks: faulthandler on a signal of their own.

Standard library only (the ranks and the SLURM probe import it).

**Mechanism.** The launcher registers ``faulthandler`` on ``STACK_SIGNAL`` before the user's
entrypoint runs (``install``): on that signal the rank writes the stack of every thread, from a C
signal handler, into ``<run>/stacks/live/rank-N.txt`` (opened once, append mode). It needs no
ptrace permission (py-spy does: CAP_SYS_PTRACE or a permissive ptrace_scope, often denied on
clusters and in containers), nothing installed on the compute nodes, it answers while the rank
is blocked in C++ (a gloo or NCCL all_reduce, holding the GIL or not), and it costs nothing
until the signal comes. The rank keeps running.

The signal is SIGRTMIN+4 on Linux and SIGURG where there are no real-time signals (macOS): see
``platform_caps.stack_signal`` for why. The launcher also records ``<run>/ranks/rank-N.json``
(host, pid, start time, the signal it listens on), so that the signal only ever goes to the
process that still is that rank (``procs.signal_if_same``). Where that cannot be confirmed (no
/proc and no psutil), or where the rank may have lost its handler and the signal's default
action would end it, the rank is not signalled and the caller is told why
(``request_local_explained``): never an empty answer that looks like "no rank is running".
A reader notes each file's size, signals, waits until the file grew and stopped growing (a
bounded wait), and reads what was appended. On SLURM the ranks live on other nodes: the same
request runs there through ``srun --overlap`` (``orchestrator.backends.slurm.node.stacks_probe``) and the files are
read from the shared run folder.

What a dump says is read by ``orchestrator.core.stacks``; the dumps saved at an abnormal end are
``orchestrator.core.stack_files``.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from orchestrator.core import platform_caps, procs
from orchestrator.core.ownership import this_host
from orchestrator.core.run_folder import RunFolder

#: The signal a rank dumps its stacks on (``platform_caps.stack_signal``): SIGRTMIN+4 on Linux, where
#: no library or user script uses it by convention (NCCL may catch USR1, users own USR2 and TERM);
#: SIGURG where there are no real-time signals (macOS), whose default action is to ignore it.
STACK_SIGNAL = platform_caps.stack_signal().number

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
        from orchestrator.core.atomic_files import write_json_atomic

        write_json_atomic(rank_record_path(run_dir, rank), {
            "rank": rank, "host": socket.gethostname(), "host_key": this_host(), "pid": me,
            "start_ticks": procs.start_time(me), "stack_signal": STACK_SIGNAL,
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
    stack_signal: int | None = None  # the signal its handler listens on (None: recorded by an older version)

    @property
    def signal(self) -> int:
        return self.stack_signal if self.stack_signal is not None else STACK_SIGNAL

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
                                           str(d["host_key"]) if d.get("host_key") else None,
                                           None if d.get("stack_signal") is None else int(d["stack_signal"]))
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
    """Send each rank's stack signal to each rank (all, or those given) that runs here
    (``RankProc.here``), is still that rank and may be signalled (``why_not_signalled``).
    Returns the ranks signalled."""
    return signal_explained(run_dir, ranks)[0]


def signal_explained(run_dir: str | Path, ranks: Iterable[int] | None) -> tuple[list[int], dict[int, str]]:
    """The ranks signalled, and why each other rank of this host (of those asked) was not."""
    wanted = None if ranks is None else set(ranks)
    sent: list[int] = []
    refused: dict[int, str] = {}
    for rank, rp in sorted(rank_procs(run_dir).items()):
        if (wanted is not None and rank not in wanted) or not rp.here():
            continue
        why = why_not_signalled(rp)
        if why is not None:
            refused[rank] = why
        elif procs.signal_if_same(rp.pid, rp.start_ticks, rp.signal):
            sent.append(rank)
        else:
            refused[rank] = ENDED
    return sent, refused


#: Why a rank was not asked, when its process has ended (or never recorded a start time).
ENDED = "not running (ended, or not started yet)"

#: Why a rank was not asked, when its process is stopped (SIGSTOP, a terminal's ^Z, a debugger):
#: it would answer only once continued, so a caller waited its whole timeout for nothing (4 s of
#: every ``chaos --stop-rank`` hang's verdict on the site cluster).
STOPPED = "stopped (SIGSTOP, ^Z or a debugger): it answers nothing until it is continued (kill -CONT)"
STOPPED_STATES = ("T", "t")

#: Why no rank is asked where no process table can be read: a PID alone may name anything.
UNCONFIRMED = ("this system cannot confirm that a rank's recorded PID still names that rank (no /proc, and "
               "psutil is not installed or cannot read processes here: pip install psutil), so no rank is sent "
               "the stack signal")


def why_not_signalled(rp: RankProc) -> str | None:
    """None when the rank's process may be sent its stack signal now; else why not, as a clause a
    user can act on. A rank that exec'd another program (``exec numactl ...``) lost its handler,
    and a signal whose default action ends a process would end it: such a rank is never sent
    one; where the platform cannot tell (macOS), only a signal whose default action is to ignore
    it is sent (``platform_caps.stack_signal``)."""
    if not procs.can_identify():
        return UNCONFIRMED
    if not procs.same_process(rp.pid, rp.start_ticks):
        return ENDED
    if (stat := procs.stat(rp.pid)) is not None and stat.state in STOPPED_STATES:
        return STOPPED  # its handler runs only once it is continued: no answer to wait for
    handled = procs.catches(rp.pid, rp.signal)
    if handled is False:
        return ("its process no longer has the launcher's stack handler (it exec'd another program?): not "
                "signalled; try --native")
    if handled is None and not _harmless(rp.signal):
        return (f"this system cannot tell whether it still has the launcher's stack handler, and "
                f"{procs.signal_name(rp.signal)} would end a process without it: not signalled; try --native")
    return None


def _harmless(sig: int) -> bool:
    """True for a signal whose default action is to ignore it (SIGURG, the choice where handlers
    cannot be seen): sending it to a process without our handler does nothing."""
    chosen = platform_caps.stack_signal()
    return chosen.harmless and sig == chosen.number


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


def read_from(run_dir: str | Path, rank: int, start: int, end: int) -> str:
    """What a rank's live dump file holds from ``start`` to ``end``; '' if unreadable."""
    try:
        with open(live_path(run_dir, rank), "rb") as fh:
            fh.seek(start)
            data = fh.read(max(0, end - start))
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


def request_local(run_dir: str | Path, ranks: Iterable[int] | None = None,
                  timeout_s: float = REQUEST_TIMEOUT_S) -> dict[int, str]:
    """Signal the ranks on this machine and return each one's fresh dump ('' for a rank that did
    not answer in time). Ranks that are gone (or not on this machine) are left out."""
    return request_local_explained(run_dir, ranks, timeout_s)[0]


def request_local_explained(run_dir: str | Path, ranks: Iterable[int] | None = None,
                            timeout_s: float = REQUEST_TIMEOUT_S) -> tuple[dict[int, str], dict[int, str]]:
    """``request_local``, and why each rank of this machine that was not signalled was not
    (``why_not_signalled``; ``ENDED`` for one that is gone): a caller says that rather than
    "no rank is running" where the platform could not confirm who runs."""
    known = rank_procs(run_dir)
    chosen = sorted(known if ranks is None else [r for r in ranks if r in known])
    before = sizes(run_dir, chosen)
    sent, refused = signal_explained(run_dir, chosen)
    if not sent:
        return {}, refused
    after = wait_written(run_dir, {r: before[r] for r in sent}, timeout_s)
    return {r: read_from(run_dir, r, before[r], after[r]) for r in sent}, refused
