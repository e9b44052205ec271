"""A failure is told once, in the user's terms: the first failing rank's traceback, trimmed of the
orchestrator's and runpy's frames, shown once by ``run`` (not once per rank); the full traceback
stays in ``<run>/errors/rank-N.json`` and the rank's log keeps the trimmed one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "user_crash.py"


@pytest.mark.parametrize("abort_at_exit", [False, True])
def test_run_shows_the_first_failure_once_without_our_frames(tmp_path: Path, abort_at_exit: bool) -> None:
    """abort_at_exit: the failing rank dies of SIGABRT after raising; its traceback is still the
    report (not "killed by signal SIGABRT")."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "crash", "entrypoint": str(SCRIPT), "nodes": 2, "cpu_ranks_per_node": 2,
                                    "extra_args": ["--abort-at-exit"] if abort_at_exit else [],
                                    "runs_dir": str(tmp_path / "runs")}))
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(spec)], capture_output=True, text=True,
                          timeout=180, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    shown = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "FAILED" in shown, shown[-3000:]
    assert shown.count("Traceback (most recent call last)") == 1, shown[-5000:]
    assert "rank 1 raised ValueError: shard 1 is corrupt" in shown
    assert "in load_shard" in shown and "user_crash.py" in shown
    for ours in ("orchestrator/node/launcher.py", "runpy", "zygote.py"):
        assert ours not in shown, f"{ours} in the output:\n{shown[-3000:]}"
    run_dir = next(p for p in (tmp_path / "runs").iterdir() if not p.name.startswith("."))  # .code: the snapshots
    full = json.loads((run_dir / "errors" / "rank-1.json").read_text())
    assert "orchestrator/node/launcher.py" in full["traceback"] and "launcher.py" not in full["user_traceback"]
    log = (run_dir / "logs" / "rank-1.log").read_text()
    assert "[launcher] rank 1 failed: ValueError: shard 1 is corrupt" in log and "in load_shard" in log


def test_a_gpu_script_on_a_local_dry_run_is_told_to_list_local_devices(tmp_path: Path) -> None:
    """A torchrun-style GPU script run locally without local.devices finds no GPU (the local default
    is a CPU dry run, here or on a GPU workstation): the failure says why and what to set."""
    script = tmp_path / "gpu_script.py"
    script.write_text("import os, torch\ntorch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "gpu-dry", "entrypoint": str(script), "gpus_per_node": 1,
                                    "runs_dir": str(tmp_path / "runs")}))
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(spec)], capture_output=True, text=True,
                          timeout=180, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    shown = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "FAILED" in shown, shown[-3000:]
    assert "hides every GPU" in shown and "local.devices" in shown, shown[-3000:]
