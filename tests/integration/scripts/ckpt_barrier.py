"""Every rank saves a checkpoint together (rank 0 writes), then every rank must find it complete
the moment save_checkpoint returns: that is what the barrier after the write is for."""
from __future__ import annotations

import sys


def main(argv: list[str]) -> dict:
    import torch

    from jobs import checkpoint as ckpt
    from jobs.distributed import distributed

    directory = argv[argv.index("--dir") + 1]
    with distributed() as ctx:
        state = {"step": 1, "w": torch.arange(12_000_000, dtype=torch.float32)}  # ~48 MB: a write takes a while
        path = ckpt.save_checkpoint(state if ctx.is_main else {}, directory, 1, 2, ctx.is_main, ctx.barrier)
        if not path.exists():
            print(f"rank {ctx.rank}: {path} missing right after save_checkpoint returned", file=sys.stderr)
            raise RuntimeError(f"rank {ctx.rank} returned from save_checkpoint before the checkpoint existed")
        loaded = ckpt.load_checkpoint(path)
        assert loaded["step"] == 1 and loaded["w"].numel() == 12_000_000
        return {"rank": ctx.rank, "ok": True}
