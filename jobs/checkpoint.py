"""Rank-0 atomic checkpoints that every rank can load.

Writing: rank 0 saves to a temporary file in the same directory, fsyncs it, and renames it
over the final name (``os.replace`` is atomic on POSIX), then prunes to the last ``keep``.
A crash or ``kill -9`` mid-write leaves only a ``.tmp`` file, which loading ignores, so the
previous checkpoint stays loadable; the next writer (or a resume) removes such orphans. All
ranks meet at a barrier after the write.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

_NAME = re.compile(r"^ckpt-(\d{10})\.pt$")
_TMP = re.compile(r"^\.ckpt-\d{10}\.pt\.\d+\.tmp$")


def checkpoint_path(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"ckpt-{step:010d}.pt"


def list_checkpoints(directory: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary files are never listed)."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), d / name) for name in os.listdir(d) if (m := _NAME.match(name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: str | Path) -> Path | None:
    found = list_checkpoints(directory)
    return found[-1] if found else None


def save_atomic(state: Mapping[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            torch.save(dict(state), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        if tmp.exists():
            tmp.unlink()


def orphaned_temporaries(directory: str | Path) -> list[Path]:
    """Temporary files that a killed writer left behind (``.ckpt-<step>.pt.<pid>.tmp``)."""
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted(d / name for name in os.listdir(d) if _TMP.match(name))


def prune_orphans(directory: str | Path) -> list[Path]:
    """Remove every orphaned temporary file; only rank 0 writes, so none belongs to a live write.

    Call it only from the job's single writer (rank 0), before it writes or when it resumes.
    """
    removed = []
    for tmp in orphaned_temporaries(directory):
        try:
            tmp.unlink()
            removed.append(tmp)
        except FileNotFoundError:
            pass
    return removed


def prune(directory: str | Path, keep: int) -> None:
    for old in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)


def save_checkpoint(state: Mapping[str, Any], directory: str | Path, step: int, keep: int,
                    is_main: bool, barrier: Callable[[], None]) -> Path:
    """Rank 0 writes; everyone waits so no rank reads a checkpoint that is not there yet."""
    path = checkpoint_path(directory, step)
    if is_main:
        prune_orphans(directory)  # a write killed in an earlier attempt
        save_atomic(state, path)
        prune(directory, keep)
    barrier()
    return path


def load_checkpoint(path: str | Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    """Load onto this rank's device, whatever device rank 0 saved from."""
    return torch.load(path, map_location=device, weights_only=False)


def strip_module_prefix(state_dict: Mapping[str, Any]) -> "OrderedDict[str, Any]":
    """Accept state dicts saved from a DDP/DataParallel-wrapped model ('module.' prefix)."""
    if state_dict and all(k.startswith("module.") for k in state_dict):
        return OrderedDict((k[len("module."):], v) for k, v in state_dict.items())
    return OrderedDict(state_dict)


def load_model_state(model: torch.nn.Module, state_dict: Mapping[str, Any]) -> None:
    """Load into a bare or wrapped model, with or without the 'module.' prefix in the file."""
    target = model.module if isinstance(model, (torch.nn.parallel.DistributedDataParallel,
                                                 torch.nn.DataParallel)) else model
    target.load_state_dict(strip_module_prefix(state_dict))


def unwrapped_state(model: torch.nn.Module) -> "OrderedDict[str, Any]":
    """Always save without the prefix, so a checkpoint loads into any wrapping."""
    return strip_module_prefix(model.state_dict())
