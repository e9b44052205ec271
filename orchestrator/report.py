"""`orchestrator report RUN`: PNG plots of loss, accuracy and throughput per rank, and a summary."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from orchestrator.errors import OrchestratorError
from orchestrator.records import RunRecord, resolve_run


def read_metrics(run_dir: Path) -> list[dict]:
    out = []
    for path in sorted((run_dir / "metrics").glob("rank-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a crash
    return out


def write_report(ref: str) -> str:
    run_dir = resolve_run(ref)
    metrics = read_metrics(run_dir)
    if not metrics:
        raise OrchestratorError(f"no metrics in {run_dir / 'metrics'}: has the run trained yet?")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [m for m in metrics if m["kind"] == "train"]
    evals = [m for m in metrics if m["kind"] == "eval"]
    thr: dict[int, list[dict]] = defaultdict(list)
    for m in metrics:
        if m["kind"] == "throughput":
            thr[m["rank"]].append(m)
    out_dir = run_dir / "report"
    out_dir.mkdir(exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].plot([m["step"] for m in train], [m["loss"] for m in train], label="train (rank 0)")
    axes[0].plot([m["step"] for m in evals], [m["loss"] for m in evals], "o-", label="test")
    axes[0].set(title="loss", xlabel="step")
    axes[0].legend()
    axes[1].plot([m["epoch"] for m in evals], [m["accuracy"] for m in evals], "o-")
    axes[1].set(title="test accuracy", xlabel="epoch", ylim=(0, 1))
    for rank, rows in sorted(thr.items()):
        axes[2].plot([m["epoch"] for m in rows], [m["samples_per_s"] for m in rows], "o-", label=f"rank {rank}")
    axes[2].set(title="throughput (samples/s)", xlabel="epoch")
    axes[2].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out_dir / "metrics.png", dpi=90)
    plt.close(fig)
    lines = [f"run {run_dir.name}"]
    if (run_dir / "record.json").exists():
        rec = RunRecord.load(run_dir)
        lines.append(f"state {rec.state}, {rec.world_size} rank(s), attempt {rec.attempts}")
    if train:
        lines.append(f"steps {train[-1]['step']}, final train loss {train[-1]['loss']:.4f}")
    if evals:
        best = max(evals, key=lambda m: m["accuracy"])
        lines.append(f"final test accuracy {evals[-1]['accuracy']:.4f} (best {best['accuracy']:.4f} at epoch {best['epoch']})")
    for rank, rows in sorted(thr.items()):
        total = sum(r["samples"] for r in rows)
        secs = sum(r["seconds"] for r in rows)
        lines.append(f"rank {rank}: {total / secs if secs else 0:.0f} samples/s over {len(rows)} epoch(s)")
    lines.append(f"plots: {out_dir / 'metrics.png'}")
    summary = "\n".join(lines)
    (out_dir / "summary.txt").write_text(summary + "\n")
    return summary
