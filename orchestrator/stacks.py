"""Every rank's Python stacks, on demand, while it runs: faulthandler on a real-time signal.

Standard library only (the ranks, the zygote and the SLURM probe import it).

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

The second half of this module reads faulthandler's text: threads, frames, the innermost frame
of the user's own code, and whether a thread waits inside a torch.distributed collective.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from orchestrator import procs
from orchestrator.ownership import this_host
from orchestrator.run_folder import RunFolder

#: The signal a rank dumps its stacks on. A real-time signal: no library or user script uses it
#: by convention (NCCL may catch USR1, users own USR2 and TERM), and its default action is
#: never taken because the launcher registers it before the entrypoint runs.
STACK_SIGNAL = signal.SIGRTMIN + 4

#: A dump of a few hundred frames is written in well under a millisecond; this is how long a
#: file must stay the same size to count as finished, and how long a whole request may take.
SETTLE_S = 0.25
REQUEST_TIMEOUT_S = 4.0

_KEPT: list = []  # the open dump file of this rank (faulthandler holds only its descriptor)


# ---- paths ------------------------------------------------------------------------------------
def live_path(run_dir: str | Path, rank: int) -> Path:
    return RunFolder.of(run_dir).live_stack(rank)


def saved_path(run_dir: str | Path, rank: int) -> Path:
    return RunFolder.of(run_dir).saved_stack(rank)


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
    folder = Path(run_dir) / "ranks"
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


def save(run_dir: str | Path, dumps: Mapping[int, str], reason: str) -> list[Path]:
    """Write ``<run>/stacks/rank-N.txt`` for each dump (an earlier end's files are replaced)."""
    folder = RunFolder.of(run_dir).stacks
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("rank-*.txt"):
        old.unlink(missing_ok=True)
    written = []
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    for rank, text in sorted(dumps.items()):
        path = saved_path(run_dir, rank)
        head = f"# rank {rank}, {stamp}, captured because: {reason}\n"
        summary = describe(text)
        path.write_text(head + (f"# {summary}\n" if summary else "") + (text or "(no answer within the time allowed)\n"),
                        encoding="utf-8")
        written.append(path)
    return written


# ---- reading faulthandler's output ---------------------------------------------------------------
@dataclass(frozen=True)
class Frame:
    filename: str
    line: int
    function: str

    def where(self) -> str:
        return f"{os.path.basename(self.filename)}:{self.line} in {self.function}"


@dataclass
class Thread:
    ident: str
    current: bool = False
    frames: list[Frame] = field(default_factory=list)  # innermost first, as faulthandler prints


_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+|\S+)(?: \(most recent call first\))?:?\s*$")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.*?)\s*$')


def parse(text: str) -> list[Thread]:
    """faulthandler's dump (one or several) -> threads, each with its frames innermost first.
    Lines that are neither a thread header nor a frame (a truncation marker, our own header)
    are skipped. When the text holds several dumps, only the last one is kept."""
    threads: list[Thread] = []
    seen: set[str] = set()
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            ident = m.group(2)
            if ident in seen:  # the same thread again: a newer dump starts
                threads, seen = [], set()
            seen.add(ident)
            threads.append(Thread(ident=ident, current=m.group(1) == "Current thread"))
            continue
        m = _FRAME.match(line)
        if m and threads:
            threads[-1].frames.append(Frame(m.group(1), int(m.group(2)) if m.group(2).isascii() and m.group(2).isdigit() else 0, m.group(3)))
    return threads


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The standard library's folders and site-packages' (read when stacks are first parsed, not
    on every rank at import)."""
    import sysconfig

    paths = sysconfig.get_paths()
    return (tuple(sorted({os.path.realpath(p) + os.sep for p in (paths.get("stdlib"), paths.get("platstdlib")) if p})),
            tuple(sorted({os.path.realpath(p) + os.sep for p in (paths.get("purelib"), paths.get("platlib")) if p})))


_OURS = os.path.dirname(os.path.realpath(__file__)) + os.sep
_TORCH = re.compile(r"/(site|dist)-packages/(torch|orchestrator)/")


def _is_stdlib(filename: str) -> bool:
    path = os.path.realpath(filename)
    stdlib, site = _library_dirs()
    return path.startswith(stdlib) and not path.startswith(site) and "site-packages" not in path


def is_framework(filename: str) -> bool:
    """torch's, the orchestrator's, the standard library's frames, and frozen/builtin pseudo-files:
    never where the user's code waits."""
    norm = filename.replace("\\", "/")
    if norm.startswith("<"):
        return True
    real = os.path.realpath(filename)
    return bool(_TORCH.search(norm)) or real.startswith(_OURS) or _is_stdlib(filename)


def in_collective(frames: list[Frame]) -> str | None:
    """The torch.distributed function a thread waits in (e.g. 'all_reduce'), or None.

    Collectives that C++ starts have no torch.distributed frame: DDP's gradient all-reduce is
    waited for inside autograd's engine, at the end of ``loss.backward()``, and its forward
    syncs buffers from torch/nn/parallel. A thread whose innermost frame is there (no user code
    inside it, such as a custom autograd Function) counts as waiting in that collective."""
    found = None
    for f in frames:  # innermost first: keep the outermost torch/distributed frame, the API call
        norm = f.filename.replace("\\", "/")
        if "/torch/distributed/" in norm and f.function not in ("wrapper", "_fn", "inner"):
            found = f.function
    if found is None and frames:
        innermost = frames[0].filename.replace("\\", "/")
        if "/torch/autograd/" in innermost and _TORCH.search(innermost):
            return "backward (DDP's gradient all-reduce)"
        if innermost.endswith("/torch/nn/parallel/distributed.py") and _TORCH.search(innermost):
            return f"DistributedDataParallel.{frames[0].function}"
    return found


def main_thread(threads: list[Thread]) -> Thread | None:
    """The thread that runs the entrypoint: the one not started by threading (its outermost frame
    is not threading's bootstrap); else the one faulthandler marked current; else the first."""
    for t in threads:
        if t.frames and not (t.frames[-1].function.startswith("_bootstrap")
                             and os.path.basename(t.frames[-1].filename) == "threading.py"):
            return t
    return next((t for t in threads if t.current), threads[0] if threads else None)


def user_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame of the user's own code (not torch, the orchestrator or the stdlib)."""
    return next((f for f in frames if not is_framework(f.filename)), None)


@dataclass(frozen=True)
class Where:
    """Where one rank was: its user-code line and the collective it waited in, if any."""
    user: str | None
    collective: str | None
    answered: bool

    def text(self) -> str:
        if not self.answered:
            return "no stack (the rank did not answer)"
        place = self.user or "no frame of your own code"
        return f"{place}, waiting in {self.collective}" if self.collective else f"{place} (not in a collective)"


def where(text: str) -> Where:
    """A rank's dump -> where its main thread was."""
    thread = main_thread(parse(text))
    if thread is None:
        return Where(None, None, False)
    frame = user_frame(thread.frames)
    return Where(frame.where() if frame else None, in_collective(thread.frames), True)


def describe(text: str) -> str:
    return where(text).text() if text else ""


def wait_lines(waits: Mapping[str, str]) -> list[str]:
    """The lines `run`, `submit --wait` and `status` print for the ranks' saved stacks: ranks
    that were at the same place share a line ("ranks 0-2, 5: train.py:87 in step, waiting in
    all_reduce"), so a large job stays readable; the straggler stands alone."""
    groups: dict[str, list[int]] = {}
    for rank, text in waits.items():
        groups.setdefault(text, []).append(int(rank))
    ordered = sorted(groups.items(), key=lambda kv: min(kv[1]))
    return [f"{'rank' if len(ranks) == 1 else 'ranks'} {_ranges(sorted(ranks))}: {text}" for text, ranks in ordered]


def _ranges(ranks: list[int]) -> str:
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ", ".join(parts)
