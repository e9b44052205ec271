"""The stacks saved at an abnormal end: ``<run>/stacks/rank-N.txt``, written and read back.

Standard library only (the SLURM job's agent saves them on a compute node). Each file starts with
a header (rank, time, why it was captured, where the rank was) and holds the rank's dump as
``orchestrator.node.stack_requests`` got it; an earlier end's files are replaced.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Mapping

from orchestrator.core.run_folder import RunFolder
from orchestrator.core.stacks import describe


def saved_path(run_dir: str | Path, rank: int) -> Path:
    return RunFolder.of(run_dir).saved_stack(rank)


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


def saved_files(run_dir: str | Path, rank: int | None = None) -> list[Path]:
    """The saved files, by rank (only ``rank``'s when given); none when nothing was saved."""
    folder = RunFolder.of(run_dir).stacks
    files = sorted(folder.glob("rank-*.txt"), key=lambda p: int(p.stem.split("-")[1])) if folder.is_dir() else []
    return [p for p in files if rank is None or p.stem == f"rank-{rank}"]
