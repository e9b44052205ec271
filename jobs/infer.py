"""Inference from a checkpoint: on one chosen device, or spread over ranks.

Entrypoint ``jobs.infer:main --checkpoint PATH``. With several ranks each one predicts its
shard of the test set and rank 0 gathers every prediction into ``predictions.jsonl`` (in
dataset order). Checkpoints saved with or without the ``module.`` prefix both load.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence, Sized, cast

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset

from jobs import checkpoint as ckpt
from jobs import data, models
from jobs.distributed import distributed
from jobs.argtypes import positive_int
from jobs.sampling import shard_indices
from orchestrator.core.run_folder import RunFolder


def main(argv: Sequence[str] = ()) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="jobs.infer")
    p.add_argument("--checkpoint", required=True, help="a checkpoint file, or a directory (its latest)")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--no-verify", action="store_true")
    p.add_argument("--image-size", type=positive_int, default=None)
    p.add_argument("--model", default="smallcnn")
    p.add_argument("--device", default=None, help="e.g. cpu or cuda:1 (single-process inference)")
    p.add_argument("--batch-size", type=positive_int, default=256)
    p.add_argument("--output", default=None, help="default: <run folder>/predictions.jsonl")
    args = p.parse_args(list(argv))
    with distributed() as ctx:
        device = torch.device(args.device) if args.device else ctx.device
        path = Path(args.checkpoint)
        if path.is_dir():
            latest = ckpt.latest_checkpoint(path)
            if latest is None:
                raise FileNotFoundError(f"no checkpoint in {path}")
            path = latest
        test_set = data.build(args.dataset, False, args.data_dir, False, not args.no_verify, args.image_size, 512)
        model = models.build(args.model, data.in_channels(args.dataset), data.num_classes(args.dataset, test_set))
        ckpt.load_model_state(model, ckpt.load_checkpoint(path, device)["model"])
        model.to(device).eval()
        indices = shard_indices(len(cast(Sized, test_set)), ctx.rank, ctx.world_size)
        preds: list[tuple[int, int, int]] = []
        with torch.no_grad():
            offset = 0
            for x, y in DataLoader(Subset(test_set, indices), batch_size=args.batch_size):
                out = model(x.to(device)).argmax(1).cpu().tolist()
                for j, (pred, label) in enumerate(zip(out, y.tolist())):
                    preds.append((indices[offset + j], pred, label))
                offset += len(out)
        gathered: list[Any] = [preds]
        if ctx.backend is not None:
            gathered = [None] * ctx.world_size
            dist.all_gather_object(gathered, preds)
        rows = sorted(r for part in gathered for r in part)
        accuracy = sum(p == l for _, p, l in rows) / max(1, len(rows))
        if ctx.is_main:
            out_path = Path(args.output or RunFolder.of(ctx.config.run_dir).predictions)
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text("".join(json.dumps({"index": i, "prediction": p, "label": l}) + "\n" for i, p, l in rows))
            print(f"[infer] {len(rows)} predictions, accuracy {accuracy:.4f} -> {out_path}", flush=True)
        return {"predictions": len(rows), "accuracy": accuracy, "checkpoint": str(path)}
