"""Reading faulthandler's stack dumps: threads, frames, the innermost frame of the user's own
code, and whether a thread waits inside a torch.distributed collective. Text in, answers out:
it signals no process and reads or writes no file. Standard library only (the watchdog, the
zygote and the SLURM job's agent use it).

Asking live ranks for a dump is ``orchestrator.node.stack_requests``; the dumps saved in the run
folder at an abnormal end are ``orchestrator.core.stack_files``.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from typing import Mapping


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


_OURS = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep  # the package
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
    """A rank's dump summed up in a line ('' for none, and for a rank not asked: its text says why)."""
    return where(text).text() if text and not text.startswith("(not asked") else ""


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
