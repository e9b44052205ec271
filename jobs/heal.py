"""Survivors keep their process and their state (``recovery.survivors: keep``, issue 50).

When a rank dies, its peers' next collective fails (gloo: "Connection reset by peer"), but they
still hold the exact model, optimizer and step in memory. Instead of every rank starting again
and reading the last checkpoint back, the launcher forks only a replacement for the dead rank, and
this module lets the survivors and the replacement meet again:

    healer = jobs.Healer(ctx)
    model, opt = Net(), torch.optim.SGD(...)          # on the unwrapped module
    step = 0
    got = healer.receive(model, opt)                  # a replacement: a survivor's state, else None
    if got is not None:
        step = got["step"]
    ddp = jobs.wrap_model(model, ctx)
    while step < total:
        try:
            ...one training step on ddp...
        except Exception as exc:
            if not healer.can_heal(exc):
                raise
            del ddp                                    # its reducer belongs to the broken group
            step = healer.heal(model, opt, {"step": step})["step"]
            ddp = jobs.wrap_model(model, ctx)

``heal``: leave the broken group, wait (bounded: ``init_timeout_s``) for the launcher's next
generation (``<run>/heal/generation.json``: which ranks were replaced), join a fresh group through
that generation's store (``<run>/heal/store-<G>``, a FileStore: it outlives any one rank, unlike
rank 0's TCPStore), and receive everything from one survivor (the lowest-numbered one): the model,
the optimizer, the ``extra`` you pass (step, epoch, sampler position) and the generators' states.
Every rank adopts the same survivor's state, so the group is consistent even when the failure hit
mid-step (one survivor may have finished the step, another not). No checkpoint is read; at most
the step in flight is done again. The replacement's generators take the survivor's states, which
is exact when every rank draws the same numbers (as ``jobs.train`` does: per-rank randomness
belongs in ``jobs.SeededDataset``).

Nothing here runs unless the launcher set ``ORCH_SURVIVORS=keep``: ``can_heal`` is False and the
exception goes on as before (every rank restarts from the checkpoint).
"""

from __future__ import annotations

import io
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from jobs.distributed import SURVIVORS_ENV, DistContext, init_process_group, replacement_generation
from jobs.rng import rng_state, set_rng_state
from orchestrator.core import progress
from orchestrator.core.run_folder import RunFolder
from orchestrator.core.safe_read import Unreadable, read_json

__all__ = ["Healer", "is_peer_loss"]

#: What a collective says when a peer's process is gone: gloo's transport errors, NCCL's abort.
PEER_LOSS_WORDS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Socket closed",
                   "NCCL communicator was aborted", "ncclRemoteError", "remote process exited")
POLL_S = 0.01


def is_peer_loss(exc: BaseException) -> bool:
    """Whether an exception is a collective failing because a peer's process is gone."""
    if not isinstance(exc, RuntimeError):  # DistBackendError and gloo's errors are RuntimeErrors
        return False
    text = str(exc)
    return any(word in text for word in PEER_LOSS_WORDS)


def read_generation(run_dir: str) -> dict[str, Any] | None:
    """The launcher's latest generation (``{"generation", "replaced", "source"}``), or None."""
    try:  # the run folder is shared: read as hostile input (no link, FIFO or oversized file)
        data = read_json(RunFolder.of(run_dir).heal_generation)
    except Unreadable:
        return None
    if not (isinstance(data, dict) and isinstance(data.get("generation"), int)
            and isinstance(data.get("source"), int) and isinstance(data.get("replaced"), list)):
        return None
    return data


class Healer:
    """A rank's part in keeping survivors: see the module's text."""

    def __init__(self, ctx: DistContext) -> None:
        self.ctx = ctx
        self.enabled = os.environ.get(SURVIVORS_ENV) == "keep" and ctx.backend is not None
        joined = replacement_generation()  # a replacement joined this generation (jobs.process_group)
        self.replacement = self.enabled and joined is not None
        self.generation = joined or 0
        if self.enabled:  # the launcher replaces a lost peer beside this rank only once it says it can rejoin
            ready = RunFolder.of(ctx.config.run_dir).heal_ready(ctx.rank)
            ready.parent.mkdir(parents=True, exist_ok=True)
            ready.touch()

    def can_heal(self, exc: BaseException) -> bool:
        return self.enabled and is_peer_loss(exc)

    # -- the two sides ----------------------------------------------------------------------
    def receive(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any] | None:
        """On a replacement: the model, optimizer and generators from the generation's source,
        loaded here; returns the ``extra`` the survivors passed to ``heal``. None on any other rank."""
        if not self.replacement:
            return None
        generation = read_generation(self.ctx.config.run_dir)
        if generation is None or generation["generation"] != self.generation:
            raise RuntimeError(f"rank {self.ctx.rank} was started to replace a rank in generation {self.generation}, "
                               f"but {RunFolder.of(self.ctx.config.run_dir).heal_generation} says otherwise")
        return self._exchange(generation["source"], model, optimizer, None)

    def heal(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
             extra: dict[str, Any]) -> dict[str, Any]:
        """On a survivor, after ``can_heal``: rejoin with the replacements and take the source's
        state (this rank's own if it is the source). Returns the source's ``extra``."""
        began = time.time()
        try:
            dist.destroy_process_group()
        except Exception:  # a broken group may not tear down cleanly: a new one is made all the same
            pass
        generation = self._next_generation()
        self.generation = generation["generation"]
        init_process_group(self.ctx.config, self.ctx.device, self.generation)  # its FileStore in the run folder
        got = self._exchange(generation["source"], model, optimizer, extra)
        progress.rejoined()  # the next report marks where this rank resumed, in the new attempt
        print(f"[jobs] rank {self.ctx.rank}: rejoined in generation {self.generation} with rank(s) "
              f"{', '.join(map(str, generation['replaced']))} in {time.time() - began:.2f}s; state from rank "
              f"{generation['source']}", file=sys.stderr, flush=True)
        return got

    # -- the pieces -------------------------------------------------------------------------
    def _next_generation(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.ctx.config.init_timeout_s
        while time.monotonic() < deadline:
            generation = read_generation(self.ctx.config.run_dir)
            if generation is not None and generation["generation"] > self.generation:
                return generation
            time.sleep(POLL_S)
        raise RuntimeError(f"rank {self.ctx.rank} lost a peer, and no replacement was announced within "
                           f"{self.ctx.config.init_timeout_s:.0f}s (distributed.init_timeout_s)")

    def _exchange(self, source: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                  extra: dict[str, Any] | None) -> dict[str, Any]:
        """The source's state to every rank (one broadcast of its serialised bytes), loaded on every
        rank but the source."""
        device = self.ctx.device if self.ctx.backend == "nccl" else torch.device("cpu")
        if self.ctx.rank == source:
            buffer = io.BytesIO()
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict() if optimizer else None,
                        "extra": extra or {}, "rng": rng_state()}, buffer)
            payload = torch.frombuffer(bytearray(buffer.getbuffer()), dtype=torch.uint8).to(device)
            size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
        else:
            size = torch.zeros(1, dtype=torch.int64, device=device)
        dist.broadcast(size, src=source)
        if self.ctx.rank != source:
            payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
        dist.broadcast(payload, src=source)
        if self.ctx.rank == source:
            self._rejoined()
            return dict(extra or {})
        state = torch.load(io.BytesIO(payload.cpu().numpy().tobytes()), map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        if optimizer is not None and state["optimizer"] is not None:
            optimizer.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"])
        self._rejoined()
        return dict(state["extra"])

    def _rejoined(self) -> None:
        """Tell the launcher this rank holds the generation's state (a rejoin every rank completed
        may be followed by another; one that never completed restarts every rank)."""
        done = RunFolder.of(self.ctx.config.run_dir).heal_rejoined(self.generation, self.ctx.rank)
        done.parent.mkdir(parents=True, exist_ok=True)
        done.touch()
