"""A rank-API script that logs every step with jobs.MetricsWriter (so to TensorBoard and W&B) and whose
last rank raises once at ``--fail-at``, after the checkpoint the spec's interval wrote: recovery
restarts it, it resumes from that checkpoint and logs the steps after it again. A loss is logged at the
step its update brings the model to (1 to --steps), as jobs.MetricsWriter counts: a checkpoint at ``s``
keeps the record of ``s`` and resumes logging at ``s + 1``. With ``--mlflow`` rank 0 also logs one
MLflow metric per attempt."""

import argparse
import os
from pathlib import Path

import torch
from torch import nn

import jobs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--fail-at", type=int, default=7)
    p.add_argument("--mlflow", action="store_true")
    a = p.parse_args()
    with jobs.process_group() as ctx:
        torch.manual_seed(0)
        model = jobs.wrap_model(nn.Linear(4, 1), ctx)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        ckpt = jobs.Checkpointer(ctx)
        resumed = ckpt.load_latest(model, opt)
        step = resumed.step if resumed else 0
        marker = Path(ckpt.directory) / "crashed-once"
        if a.mlflow and ctx.rank == 0:
            import mlflow

            mlflow.log_metric("resumed_at", step, step=step)
            mlflow.end_run()
        with jobs.MetricsWriter(start_step=step) as metrics:
            while step < a.steps:
                loss = model(torch.randn(4, 4)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                metrics.train(step, loss.item())
                jobs.heartbeat(step, a.steps)
                if ckpt.due(step):
                    ckpt.save(step, model, opt)
                if step == a.fail_at and ctx.rank == ctx.world_size - 1 and not marker.exists():
                    marker.write_text(os.environ.get("ORCH_ATTEMPT", ""))
                    raise RuntimeError(f"injected crash at step {step}")
        print(f"rank {ctx.rank}: finished at step {step}", flush=True)


if __name__ == "__main__":
    main()
