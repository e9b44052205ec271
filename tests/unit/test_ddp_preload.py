"""Which jobs the zygote imports torch._dynamo for before forking (backends/local/forked.builds_ddp):
those whose every rank builds DistributedDataParallel, and no other (for them it only delays)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.backends.local.forked import builds_ddp


@pytest.mark.parametrize("framework", ["lightning", "fabric", "accelerate", "transformers"])
def test_a_framework_run_builds_ddp(framework: str) -> None:
    assert builds_ddp("train.py", framework)  # whatever the script's text: the framework wraps the model


@pytest.mark.parametrize(("entrypoint", "expected"), [
    ("jobs.train:main", True),
    ("jobs.examples.rank_api_example:main", True),
    ("jobs.allreduce:main", False),
    ("mypkg.train:main", False),  # a user's module is never imported to find out
])
def test_module_entrypoints(entrypoint: str, expected: bool) -> None:
    assert builds_ddp(entrypoint, None) is expected


@pytest.mark.parametrize(("text", "expected"), [
    ("from torch.nn.parallel import DistributedDataParallel as DDP\nmodel = DDP(net)\n", True),
    ("import jobs\nmodel = jobs.wrap_model(net, ctx)\n", True),
    ("import torch.distributed as dist\ndist.init_process_group('gloo')\ndist.all_reduce(t)\n", False),
    ("", False),
])
def test_scripts_are_read_not_run(tmp_path: Path, text: str, expected: bool) -> None:
    script = tmp_path / "train.py"
    script.write_text(text)
    assert builds_ddp(str(script), None) is expected


def test_a_missing_or_unreadable_script_is_not_preloaded(tmp_path: Path) -> None:
    assert builds_ddp(str(tmp_path / "gone.py"), None) is False
    assert builds_ddp(str(tmp_path), None) is False  # a folder: the rank reports it
