"""The live progress line, fed by the ranks' heartbeats: ``run`` (plain lines when the output is
not a terminal) and ``Run.wait(follow=True)`` (what ``submit --follow`` uses) show step / total,
samples/s, ETA and the slowest rank."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from orchestrator import JobSpec, run

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "heartbeat_steps.py"
LINE = re.compile(r"\[progress\] step (\d+)/80 .*samples/s.*ETA.*slowest rank \d")


def test_run_prints_the_progress_line(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "beat", "entrypoint": str(SCRIPT), "extra_args": ["80"], "nodes": 1,
                                    "cpu_ranks_per_node": 2, "runs_dir": str(tmp_path / "runs")}))
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(spec)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert LINE.search(proc.stdout), proc.stdout[-2000:]


def test_wait_follow_prints_the_progress_line(tmp_path: Path, capsys) -> None:
    spec = JobSpec(name="beatf", entrypoint=str(SCRIPT), extra_args=["80"], nodes=1, cpu_ranks_per_node=2,
                   runs_dir=str(tmp_path / "runs"))
    handle = run(spec, wait=False)
    assert handle.wait(timeout=120, follow=True) == "COMPLETED", handle.error
    out = capsys.readouterr().out
    assert LINE.search(out), out[-2000:]
