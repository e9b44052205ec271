"""The modules' names before the package move (issue 34) stay importable and runnable: a batch
script queued before an upgrade runs ``python -m orchestrator.slurm_job``, a running agent
imports ``orchestrator.health`` lazily after it (``orchestrator.core.moved``). The real job of
the old layout runs on SLURM in tests/cluster/test_old_layout_slurm.py."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.core.moved import MOVED

ROOT = Path(__file__).resolve().parents[2]


def test_every_old_name_is_gone_as_a_file_and_its_new_module_exists() -> None:
    for old, new in MOVED.items():
        assert not (ROOT / (old.replace(".", "/") + ".py")).exists(), f"{old} is still a file: the alias would hide"
        assert (ROOT / (new.replace(".", "/") + ".py")).is_file(), f"{old} -> {new}, which does not exist"


@pytest.mark.parametrize("old", ["orchestrator.records", "orchestrator.health", "orchestrator.executors.slurm",
                                 "orchestrator.slurm_job", "orchestrator.snapshot"])
def test_an_old_name_is_the_new_module_itself(old: str) -> None:
    assert importlib.import_module(old) is importlib.import_module(MOVED[old])
    assert sys.modules[MOVED[old]].__spec__.name == MOVED[old]  # the module keeps its own spec
    parent, _, name = old.rpartition(".")
    assert getattr(importlib.import_module(parent), name) is sys.modules[MOVED[old]]  # from orchestrator import health


def test_old_names_in_a_fresh_interpreter_and_with_python_m(tmp_path: Path) -> None:
    code = ("from orchestrator import stacks_probe, slurm_rank\nfrom orchestrator.executors.zygote import main\n"
            "import orchestrator.core.stacks, orchestrator.stacks\nprint(orchestrator.stacks is orchestrator.core.stacks)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr
    for old, usage in (("orchestrator.slurm_job", "PAYLOAD.json"), ("orchestrator.slurm_rank", "PAYLOAD.json"),
                       ("orchestrator.stacks_probe", "RUN_DIR")):
        run = subprocess.run([sys.executable, "-m", old], capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert run.returncode == 2 and usage in run.stderr, (old, run.returncode, run.stderr[-500:])


def test_an_unknown_name_is_still_refused() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("orchestrator.no_such_module")
