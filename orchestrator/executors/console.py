"""Live output of local runs: follow each rank's log file and print it prefixed with the rank."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable


class LogTails:
    """Follows every rank's log file and hands new complete lines to ``echo(rank, line)``.

    A failing rank's traceback is not echoed: after its ``[launcher] rank N failed: ...`` line the
    rest of its output stays in its log, and the run's outcome shows the first failure's
    traceback once (peers that fail because of it would otherwise repeat it N times)."""

    def __init__(self, run_dir: Path, offsets: list[int], echo: Callable[[int, str], None]) -> None:
        from orchestrator.failures import FAILED_MARK

        self.paths = [run_dir / "logs" / f"rank-{r}.log" for r in range(len(offsets))]
        self.offsets = list(offsets)
        self.partial = [b""] * len(offsets)
        self.echo = echo
        self.marks = [FAILED_MARK.format(rank=r) for r in range(len(offsets))]
        self.silenced = [False] * len(offsets)

    def pump(self) -> None:
        for rank, path in enumerate(self.paths):
            try:
                with open(path, "rb") as fh:
                    fh.seek(self.offsets[rank])
                    chunk = fh.read()
            except FileNotFoundError:
                continue
            self.offsets[rank] += len(chunk)
            lines = (self.partial[rank] + chunk).split(b"\n")
            self.partial[rank] = lines.pop()
            for line in lines:
                if self.silenced[rank]:
                    break
                text = line.decode(errors="replace")
                if text.startswith(self.marks[rank]):
                    self.silenced[rank] = True
                    text += f"  (traceback in {path})"
                self.echo(rank, text)


_STEP = re.compile(r"step (\d+)/(\d+)")


class ConsoleEcho:
    """Prefixed live output plus a progress bar fed by rank 0's step lines."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("training"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
                                 TimeElapsedColumn(), transient=False)
        self.task = self.progress.add_task("train", total=None)
        self.progress.start()

    def close(self) -> None:
        self.progress.stop()

    def __call__(self, rank: int, line: str) -> None:
        self.progress.console.print(f"[rank {rank}] {line}", markup=False, highlight=False)
        m = _STEP.search(line) if rank == 0 else None
        if m:
            self.progress.update(self.task, completed=int(m.group(1)), total=int(m.group(2)))


class PlainEcho:
    """Prefixed lines without a progress bar, for logs and pipes (no rich import, no redraws)."""

    def __call__(self, rank: int, line: str) -> None:
        print(f"[rank {rank}] {line}", flush=True)
