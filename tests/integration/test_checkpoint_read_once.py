"""A resume reads the checkpoint from the shared filesystem once, however many ranks resume (issue
36): rank 0 reads the file and broadcasts its bytes, and every rank ends with exactly the weights,
optimizer state and its own RNG state that were saved. Two real gloo ranks in processes."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from types import SimpleNamespace

WORLD = 2


def _rank(rank: int, folder: str) -> None:
    import torch
    import torch.distributed as dist

    from jobs import checkpoint
    from jobs.checkpoint import Checkpointer
    from jobs.distributed import DistContext

    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=WORLD)
    config = SimpleNamespace(checkpoint_dir=f"{folder}/ckpt", checkpoint_keep=2, checkpoint_interval=0, resume=True)
    ctx = DistContext(rank=rank, local_rank=rank, world_size=WORLD, device=torch.device("cpu"), backend="gloo",
                      config=config)  # type: ignore[arg-type]
    torch.manual_seed(rank)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    saved = {k: v.clone() for k, v in model.state_dict().items()} if rank == 0 else None
    Checkpointer(ctx).save(5, model, optimizer)
    rng_after_save = torch.get_rng_state()
    torch.manual_seed(1000 + rank)  # everything the resume must restore, changed
    fresh = torch.nn.Linear(4, 3)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    reads = []
    real_read_bytes, real_load = Path.read_bytes, checkpoint.load_checkpoint
    Path.read_bytes = lambda self: reads.append(str(self)) or real_read_bytes(self)  # type: ignore[method-assign]
    checkpoint.load_checkpoint = lambda path, device="cpu": reads.append(str(path)) or real_load(path, device)
    resumed = Checkpointer(ctx).load_latest(fresh, fresh_opt)
    weights = [None] * WORLD
    dist.all_gather_object(weights, {k: v.tolist() for k, v in fresh.state_dict().items()})
    out = {"reads": reads, "step": resumed.step if resumed else None, "weights": weights,
           "momentum": [s["momentum_buffer"].tolist() for s in fresh_opt.state_dict()["state"].values()],
           "rng_restored": bool(torch.equal(torch.get_rng_state(), rng_after_save))}
    if saved is not None:
        out["saved"] = {k: v.tolist() for k, v in saved.items()}
    Path(folder, f"rank-{rank}.json").write_text(json.dumps(out))
    dist.barrier()  # nothing of the other rank's still in flight: gloo's teardown once aborted (SIGABRT) under load
    dist.destroy_process_group()


def test_a_resume_reads_the_checkpoint_once_and_every_rank_gets_it_exactly(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, str(tmp_path))) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    assert [p.exitcode for p in procs] == [0] * WORLD, [p.exitcode for p in procs]
    results = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(WORLD)]
    checkpoint_reads = [[r for r in res["reads"] if "/ckpt/" in r] for res in results]
    assert [len(r) for r in checkpoint_reads] == [1, 0], checkpoint_reads  # rank 0 alone read the file
    assert all(res["step"] == 5 for res in results)
    saved = results[0]["saved"]
    assert all(w == saved for w in results[0]["weights"])  # every rank holds exactly the saved weights
    assert results[1]["momentum"] == results[0]["momentum"]
    assert all(res["rng_restored"] for res in results)  # each rank its own RNG state, as saved

