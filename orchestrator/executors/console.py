"""Live output of local runs: follow each rank's log file and print it prefixed with the rank."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Callable

from orchestrator.core.progress import read_progress
from orchestrator.core.progress_line import Summary, summarize
from orchestrator.core.run_folder import RunFolder

PROGRESS_EVERY_S = 1.0


class ProgressTick:
    """The live progress summary of a run, read from its ranks' progress reports at most once every
    ``PROGRESS_EVERY_S``: what ``run`` and ``--follow`` show, one rule for both."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._next = 0.0
        self._since = time.time()  # reports of an earlier attempt in this run folder do not count

    def due(self, run_dir: Path) -> Summary | None:
        """The summary when one is due and the ranks have reported (None otherwise)."""
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + PROGRESS_EVERY_S
        return summarize(read_progress(run_dir, self.world_size), self._since)


class LogTails:
    """Follows every rank's log file and hands new complete lines to ``echo(rank, line)`` (and, at
    the end, ``pump(final=True)``, a last line without a newline).

    A failing rank's traceback is not echoed: after its ``[launcher] rank N failed: ...`` line the
    rest of its output stays in its log, and the run's outcome shows the first failure's
    traceback once (peers that fail because of it would otherwise repeat it N times)."""

    def __init__(self, run_dir: Path, offsets: list[int], echo: Callable[[int, str], None]) -> None:
        from orchestrator.core.failures import FAILED_MARK

        self.paths = [RunFolder(run_dir).log(r) for r in range(len(offsets))]
        self.offsets = list(offsets)
        self.partial = [b""] * len(offsets)
        self.echo = echo
        self.marks = [FAILED_MARK.format(rank=r) for r in range(len(offsets))]
        self.silenced = [False] * len(offsets)
        self.run_dir = run_dir
        self._tick = ProgressTick(len(offsets))

    def progress(self) -> None:
        """Once a second: hand the live progress line (from the ranks' progress reports) to the
        echo, if it shows one."""
        show = getattr(self.echo, "progress", None)
        summary = self._tick.due(self.run_dir) if show is not None else None
        if show is not None and summary is not None:
            try:
                show(summary)
            except OSError as exc:
                self._lost(exc)

    def pump(self, final: bool = False) -> None:
        """Echo what each rank's log gained since the last pump, whole lines only: a line still
        being written waits for its newline, so no line is cut in two. ``final`` (the ranks have
        ended, so their output is complete) echoes a last line that has no newline too."""
        self.progress()
        for rank, path in enumerate(self.paths):
            lines = (self.partial[rank] + self._gained(rank, path)).split(b"\n")
            self.partial[rank] = lines.pop()
            if final and self.partial[rank]:
                lines.append(self.partial[rank])
                self.partial[rank] = b""
            for line in lines:
                if self.silenced[rank]:
                    break
                text = line.decode(errors="replace")
                if text.startswith(self.marks[rank]):
                    self.silenced[rank] = True
                    text += f"  (traceback in {path})"
                try:
                    self.echo(rank, text)
                except OSError as exc:
                    self._lost(exc)
                    return

    def _gained(self, rank: int, path: Path) -> bytes:
        """What rank ``rank``'s log gained since the last read (nothing while it does not exist)."""
        try:
            with open(path, "rb") as fh:
                fh.seek(self.offsets[rank])
                chunk = fh.read()
        except FileNotFoundError:
            return b""
        self.offsets[rank] += len(chunk)
        return chunk

    def _lost(self, exc: OSError) -> None:
        """The echo's reader is gone (``| head``, a closed terminal, a full disk under a redirected
        stdout): stop echoing, never the training. The logs keep everything."""
        self.echo = _silent
        self.silenced = [True] * len(self.paths)
        try:
            print(f"[orchestrator] stopped echoing the ranks' output ({exc.strerror or exc}); they go on, and "
                  f"their logs are in {RunFolder(self.run_dir).logs}", file=sys.stderr, flush=True)
        except OSError:
            pass


def _silent(rank: int, line: str) -> None:
    return None


_STEP = re.compile(r"step (\d+)/(\d+)")
PLAIN_PROGRESS_EVERY_S = 30.0
PLAIN_RETRY_S = 3.0


class ConsoleEcho:
    """On a terminal: prefixed live output under one live progress line (rich): step / total,
    samples/s, ETA and the slowest rank from the ranks' progress reports (jobs.heartbeat), or,
    for a script that sends none, rank 0's "step N/M" lines."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress_bar = Progress(TextColumn("training"), BarColumn(), TextColumn("{task.description}"),
                                     TimeElapsedColumn(), transient=False)
        self.task = self.progress_bar.add_task("", total=None)
        self.progress_bar.start()
        self.reported = False

    def close(self) -> None:
        self.progress_bar.stop()

    def __call__(self, rank: int, line: str) -> None:
        self.progress_bar.console.print(f"[rank {rank}] {line}", markup=False, highlight=False)
        m = _STEP.search(line) if rank == 0 and not self.reported else None
        if m:
            self.progress_bar.update(self.task, completed=int(m.group(1)), total=int(m.group(2)),
                                     description=f"step {m.group(1)}/{m.group(2)}")

    def progress(self, summary: Summary) -> None:
        self.reported = True
        self.progress_bar.update(self.task, completed=summary.step, total=summary.total,
                                 description=summary.line())


class PlainEcho:
    """Prefixed lines for logs and pipes (no rich import, no redraws), and the progress line as a
    plain line every 30 s."""

    def __init__(self) -> None:
        self._next = 0.0

    def __call__(self, rank: int, line: str) -> None:
        print(f"[rank {rank}] {line}", flush=True)

    def progress(self, summary: Summary) -> None:
        now = time.monotonic()
        if now >= self._next:
            # a line without a rate yet (the first report) is followed by a complete one soon
            self._next = now + (PLAIN_PROGRESS_EVERY_S if summary.samples_per_s is not None else PLAIN_RETRY_S)
            print(f"[progress] {summary.line()}", flush=True)


class Follower:
    """``submit --follow`` / ``Run.wait(follow=True)``: rank 0's log as it grows, and the live
    progress line from every rank's progress reports (rich on a terminal, a plain line every 30 s
    otherwise), the same line ``run`` shows."""

    def __init__(self, world_size: int, tty: bool | None = None) -> None:
        self.world_size = world_size
        self.tty = sys.stdout.isatty() if tty is None else tty
        self.echo: ConsoleEcho | PlainEcho = ConsoleEcho() if self.tty else PlainEcho()
        self._tick = ProgressTick(world_size)

    def write(self, text: str) -> None:
        if isinstance(self.echo, ConsoleEcho):
            self.echo.progress_bar.console.print(text, end="", markup=False, highlight=False)
        else:
            sys.stdout.write(text)
            sys.stdout.flush()

    def progress(self, run_dir: Path) -> None:
        summary = self._tick.due(run_dir)
        if summary is not None:
            self.echo.progress(summary)

    def close(self) -> None:
        if isinstance(self.echo, ConsoleEcho):
            self.echo.close()
