"""Process-group setup from the environment, device choice, and guaranteed teardown.

``with jobs.process_group() as ctx:`` (this module's ``distributed``) joins the group (or runs
single-process when WORLD_SIZE is 1 and no master is set), pins the device, and always destroys
the group on the way out.

The store is created here rather than by ``init_process_group(init_method=url)`` so that the
rendezvous timeout (``init_timeout_s``) and the collective timeout (``collective_timeout_s``)
stay separate: a rank that never arrives fails the join quickly, while a long collective in
training is still allowed its own limit.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import sys
from dataclasses import dataclass
from typing import Iterator, Mapping
from urllib.parse import urlparse

import torch
import torch.distributed as dist

from jobs.runtime import RuntimeConfig
from orchestrator.core.rendezvous import rendezvous_path
from orchestrator.core.run_folder import RunFolder


@dataclass(frozen=True)
class DistContext:
    """This rank in its job: what ``jobs.process_group()`` yields."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str | None  # None when running as a single process without a group
    config: RuntimeConfig

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.backend is not None:
            dist.barrier()


def choose_device(local_rank: int, strategy: str = "ddp") -> torch.device:
    """The local rank's GPU out of the visible list, or the CPU when there is none."""
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return torch.device("cpu")
    count = torch.cuda.device_count()
    # The torchrun contract: every rank sees the node's GPUs and LOCAL_RANK picks one. A binding
    # SLURM made (--gpu-bind, --gpus-per-task) leaves one visible device: index 0.
    index = 0 if strategy == "dp" or count == 1 else local_rank % count
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def resolve_backend(requested: str, device: torch.device) -> str:
    if requested in ("auto", ""):
        return "nccl" if device.type == "cuda" else "gloo"
    if requested == "nccl" and device.type != "cuda":
        # Never switch this one rank to gloo: its peers would use nccl and the job would hang.
        raise RuntimeError(
            f"the job's backend is nccl but rank {os.environ.get('RANK', '?')} sees no GPU "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!r}); give every rank a GPU "
            "(local.devices, or gpus_per_node on SLURM), or set distributed.backend: gloo")
    return requested


SURVIVORS_ENV = "ORCH_SURVIVORS"  # rank_env.OrchVar.SURVIVORS: "keep" (recovery.survivors)
GENERATION_ENV = "ORCH_HEAL_GENERATION"  # rank_env.OrchVar.HEAL_GENERATION


def replacement_generation(environ: Mapping[str, str] | None = None) -> int | None:
    """On a rank forked to replace a lost one (``recovery.survivors: keep``): the generation of the
    group it joins, through that generation's store (``jobs.heal``), not the attempt's rendezvous."""
    e = os.environ if environ is None else environ
    if e.get(SURVIVORS_ENV) != "keep":
        return None
    try:
        generation = int(e.get(GENERATION_ENV, "0") or 0)
    except ValueError:
        return None
    return generation if generation > 0 else None


def _make_store(cfg: RuntimeConfig, rank: int, world: int, generation: int | None = None) -> dist.Store:
    timeout = dt.timedelta(seconds=cfg.init_timeout_s)
    # A FileStore: a generation's in the run folder (it outlives any one rank), or the file://
    # rendezvous (the same file the launcher removes).
    path = (str(RunFolder.of(cfg.run_dir).heal_store(generation)) if generation is not None
            else rendezvous_path(cfg.init_method))
    if path is not None:
        store = dist.FileStore(path, world)
        store.set_timeout(timeout)
        return store
    url = urlparse(cfg.init_method)
    if url.scheme == "tcp":
        host, port = url.hostname, url.port
        if host is None or port is None:
            raise ValueError(f"init_method {cfg.init_method!r} names no host and port (tcp://HOST:PORT)")
    else:  # env://
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    return dist.TCPStore(host, port, world, is_master=rank == 0, timeout=timeout, wait_for_workers=True)


def init_process_group(cfg: RuntimeConfig, device: torch.device, generation: int | None = None) -> str:
    """Join the job's group: through the attempt's rendezvous, or ``generation``'s store (a group
    rebuilt around survivors, ``jobs.heal``)."""
    backend = resolve_backend(cfg.backend, device)
    try:
        store = _make_store(cfg, cfg.rank, cfg.world_size, generation)
        dist.init_process_group(
            backend=backend, store=store, rank=cfg.rank, world_size=cfg.world_size,
            timeout=dt.timedelta(seconds=cfg.collective_timeout_s),
            device_id=device if device.type == "cuda" else None)
    except Exception as exc:  # torch raises several types (DistStoreError, RuntimeError...)
        raise RuntimeError(
            f"rank {cfg.rank}/{cfg.world_size} could not join the process group through "
            f"{cfg.init_method if generation is None else f'the survivors group of generation {generation}'} "
            f"within {cfg.init_timeout_s:.0f}s ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}). Check that all {cfg.world_size} "
            "ranks started with the same WORLD_SIZE, that MASTER_ADDR/MASTER_PORT are reachable "
            "from every node, and that the socket interface exists"
        ) from exc
    return backend


@contextlib.contextmanager
def distributed(config: RuntimeConfig | None = None) -> Iterator[DistContext]:
    cfg = config or RuntimeConfig.from_env()
    device = choose_device(cfg.local_rank, cfg.strategy)
    backend: str | None = None
    if cfg.world_size > 1 or "MASTER_ADDR" in os.environ:
        backend = init_process_group(cfg, device, replacement_generation())
    clean = False
    try:
        yield DistContext(cfg.rank, cfg.local_rank, cfg.world_size, device, backend, cfg)
        clean = True
    finally:
        if dist.is_available() and dist.is_initialized():
            if clean:
                remove_rendezvous_file(cfg)
            dist.destroy_process_group()


def remove_rendezvous_file(cfg: RuntimeConfig) -> None:
    """Remove the file:// rendezvous file when every rank leaves cleanly.

    FileStore deletes its file only when the store of every rank is destroyed, which does not
    happen when a rank exits while something (DDP's reducer, a reference cycle) still holds the
    group, so the files piled up, one per attempt. Here the ranks meet, rank 0 removes the file,
    and they meet again (a gloo/nccl barrier, not through the store) so that no rank touches the
    store afterwards: FileStore's destructor does nothing once the file is gone.
    """
    path = rendezvous_path(cfg.init_method)
    if path is None:
        return
    try:
        dist.barrier()
        if cfg.rank == 0:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        dist.barrier()
    except Exception as exc:  # a peer already gone: the launcher removes the file at the end
        print(f"[jobs] could not remove the rendezvous file {path} together: {exc}", file=sys.stderr)
