"""A forked rank of a job that builds DDP finds torch._dynamo already imported by the zygote (its
constructor imports it: once for the run, not once a rank); one that does not build DDP does not
(for it the import would only delay the start). Each script reports what its rank found."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SCRIPT = """\
import json, os, sys
found = "torch._dynamo" in sys.modules
{body}
with open(os.path.join(os.environ["OUT"], "rank-%s.json" % os.environ["RANK"]), "w") as fh:
    json.dump({{"dynamo_at_start": found, "dynamo_at_end": "torch._dynamo" in sys.modules}}, fh)
"""
DDP = """\
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("gloo")
DistributedDataParallel(torch.nn.Linear(2, 2))
dist.destroy_process_group()
"""
PLAIN = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("ddp", [True, False], ids=["ddp", "all-reduce-only"])
def test_the_zygote_imports_what_ddp_needs_only_for_ddp_jobs(tmp_path: Path, ddp: bool) -> None:
    from orchestrator import JobSpec, run

    script = tmp_path / "job.py"
    script.write_text(SCRIPT.format(body=DDP if ddp else PLAIN))
    out = tmp_path / "out"
    out.mkdir()
    spec = JobSpec(name="preload", entrypoint=str(script), nodes=1, cpu_ranks_per_node=2, env={"OUT": str(out)},
                   runs_dir=str(tmp_path / "runs"))
    handle = run(spec)
    assert handle.state == "COMPLETED", handle.error
    seen = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]
    assert [s["dynamo_at_start"] for s in seen] == [ddp, ddp]
    assert [s["dynamo_at_end"] for s in seen] == [ddp, ddp]  # DDP imports it; an all-reduce never does
