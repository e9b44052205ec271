"""Rank-0 atomic checkpoints that every rank can load.

Writing: rank 0 saves to a temporary file in the same directory, fsyncs it, and renames it
over the final name (``os.replace`` is atomic on POSIX), then prunes to the last ``keep``.
A crash or ``kill -9`` mid-write leaves only a ``.tmp`` file, which loading ignores, so the
previous checkpoint stays loadable; the next writer (or a resume) removes such orphans. All
ranks meet at a barrier after the write.

``Checkpointer`` is the rank API's face of it: ``save(step, model, optimizer, **extra)`` on every
rank (model without the ``module.`` prefix, optimizer, every rank's RNG state, your extras) and
``load_latest(model, optimizer)``, which restores all of that onto this rank's device: rank 0 reads
the file and broadcasts its bytes, so a resume reads the shared filesystem once, not once per rank.
"""

from __future__ import annotations

import io
import os
import re
import socket
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch
import torch.distributed as dist

from jobs.rng import rng_state, set_rng_state

if TYPE_CHECKING:
    from jobs.distributed import DistContext

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


#: The keys a Checkpointer file always holds; a caller's extras may not reuse them.
RESERVED = ("model", "optimizer", "step", "rng", "world_size")


@dataclass(frozen=True)
class Resumed:
    """What ``Checkpointer.load_latest`` restored: the file, its step and the caller's extras."""

    path: Path
    step: int
    extra: dict[str, Any] = field(default_factory=dict)


class Checkpointer:
    """Collective checkpoints of one job: every rank calls ``save`` and ``load_latest`` together.

    Directory, how many to keep and the save interval come from the spec's ``checkpoint`` section
    (ORCH_CHECKPOINT_DIR / _KEEP / _INTERVAL), unless given here. Rank 0 writes atomically, then all
    ranks meet, so no rank reads a checkpoint that is not complete.
    """

    def __init__(self, ctx: DistContext, directory: str | Path | None = None, keep: int | None = None,
                 interval: int | None = None) -> None:
        self.ctx = ctx
        self.directory = Path(directory if directory is not None else ctx.config.checkpoint_dir)
        self.keep = ctx.config.checkpoint_keep if keep is None else keep
        self.interval = ctx.config.checkpoint_interval if interval is None else interval

    def due(self, step: int) -> bool:
        """Whether ``step`` is one the spec asks to checkpoint at (``checkpoint.interval_steps``; 0: never)."""
        return self.interval > 0 and step % self.interval == 0

    def latest(self) -> Path | None:
        return latest_checkpoint(self.directory)

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
             **extra: Any) -> Path:
        """Collective: every rank calls it at the same step. Returns the file, complete on every rank."""
        clash = sorted(set(extra) & set(RESERVED))
        if clash:
            raise ValueError(f"Checkpointer.save: {', '.join(clash)} is reserved; give your value another name")
        state = {"model": unwrapped_state(model), "optimizer": optimizer.state_dict() if optimizer else None,
                 "step": step, "rng": self._gather_rng(), "world_size": self.ctx.world_size, **extra}
        return save_checkpoint(state, self.directory, step, self.keep, self.ctx.is_main, self.ctx.barrier)

    def load_latest(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> Resumed | None:
        """Restore the latest checkpoint (model, optimizer, this rank's RNG state) onto this rank's device.

        None when there is none, or the spec says ``checkpoint.resume: false``. Loads files saved with
        or without the ``module.`` prefix, from any device. Rank 0 first removes what a killed write left.
        """
        path = self._agreed_latest()
        if path is None:
            return None
        state = self._read_once(path)
        load_model_state(model, state["model"])
        if optimizer is not None and state.get("optimizer") is not None:
            optimizer.load_state_dict(state["optimizer"])
        rngs = state.get("rng") or []
        if len(rngs) == self.ctx.world_size:  # another world size resumes, but not bit-exactly
            set_rng_state(rngs[self.ctx.rank])
        elif self.ctx.is_main:
            print(f"[jobs] {path} was saved by {len(rngs)} rank(s), this job has {self.ctx.world_size}: "
                  "RNG states not restored", file=sys.stderr, flush=True)
        extra = {k: v for k, v in state.items() if k not in RESERVED}
        return Resumed(path=path, step=int(state.get("step", state.get("global_step", 0))), extra=extra)

    def _read_once(self, path: Path) -> dict[str, Any]:
        """The checkpoint, read from the shared filesystem by rank 0 alone and sent to the others as
        its bytes (a broadcast): one read however many ranks resume, not a read storm of ranks x its
        size. Each rank loads the same bytes onto its own device, so the resume stays bit-exact."""
        if self.ctx.backend is None or self.ctx.world_size <= 1:
            return load_checkpoint(path, self.ctx.device)
        box: list[Any] = [path.read_bytes() if self.ctx.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return torch.load(io.BytesIO(box[0]), map_location=self.ctx.device, weights_only=False)

    def _agreed_latest(self) -> Path | None:
        """The checkpoint every rank resumes from: rank 0 chooses it (after removing what a killed
        write left) and tells the others, so no rank resumes from another step than its peers, and
        every rank proves it can read the checkpoint folder (a token rank 0 writes there), so a
        folder that is not shared between the nodes fails the job here, naming the ranks, instead
        of letting them train apart and overwrite each other's checkpoints."""
        choice: Path | None = None
        token = self.directory / f".shared-{os.getpid()}-{time.time_ns()}"
        if self.ctx.is_main:
            for orphan in prune_orphans(self.directory):
                print(f"[jobs] removed {orphan.name}, left by a checkpoint write that was killed", flush=True)
            choice = self.latest() if self.ctx.config.resume else None
            if self.ctx.backend is not None:
                self.directory.mkdir(parents=True, exist_ok=True)
                token.write_text("written by rank 0 to check that every rank sees this folder\n")
        if self.ctx.backend is None:
            return choice
        box: list[Any] = [None if choice is None else str(choice), str(token)]
        dist.broadcast_object_list(box, src=0)
        chosen, token = (None if box[0] is None else Path(box[0])), Path(box[1])
        sees = token.is_file() and (chosen is None or os.access(chosen, os.R_OK))
        everyone: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(everyone, (sees, socket.gethostname()))
        if self.ctx.is_main:
            token.unlink(missing_ok=True)
        blind = [(r, host) for r, (ok, host) in enumerate(everyone) if not ok]
        if blind:
            hosts = sorted({host for _, host in blind})
            raise RuntimeError(
                f"rank(s) {', '.join(str(r) for r, _ in blind)} (on {', '.join(hosts)}) cannot see the checkpoint folder "
                f"{self.directory} as rank 0 does" + (f" (rank 0 chose {chosen} to resume from)" if chosen else "")
                + ": checkpoint.dir (by default under runs_dir) must be a folder every node shares; set it to a path on "
                "a shared filesystem")
        return chosen

    def _gather_rng(self) -> list[dict[str, Any]]:
        mine = rng_state()
        if self.ctx.backend is None:
            return [mine]
        out: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(out, mine)
        return out
