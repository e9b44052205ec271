"""The C heap defaults (orchestrator.node.malloc) reach an unmodified script's ranks, whether forked
from the zygote or started fresh, and the user's own settings win.

Measured, not read back: the rank allocates, touches and frees 96 MiB a few times and counts its
page faults (``env_dump.heap_faults_per_cycle``): ~0 when freed memory is kept for the next
cycle, ~24,600 per cycle when it goes back to the kernel (glibc's own behaviour).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator import JobSpec, run
from orchestrator.plan import plan

SCRIPT = Path(__file__).parent / "scripts" / "env_dump.py"
GLIBC_OWN = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}


def _faults(tmp_path: Path, **fields: object) -> list[float]:
    out = tmp_path / "out"
    out.mkdir()
    spec = JobSpec(name="heap", entrypoint=str(SCRIPT), nodes=1, cpu_ranks_per_node=2, args={"out": str(out)},
                   runs_dir=str(tmp_path / "runs"), **fields)
    handle = run(spec)
    assert handle.state == "COMPLETED", handle.error
    return [json.loads((out / f"env-{r}.json").read_text())["heap_faults_per_cycle"] for r in range(2)]


def test_fresh_interpreters_get_the_heap_defaults(tmp_path: Path) -> None:
    assert all(f < 1000 for f in _faults(tmp_path, local={"preload_torch": False}))


@pytest.mark.parametrize("preload", [True, False], ids=["forked", "fresh"])
def test_the_users_heap_settings_win(tmp_path: Path, preload: bool) -> None:
    spec_env = {**GLIBC_OWN}
    assert plan(JobSpec(name="heap", entrypoint=str(SCRIPT), env=spec_env)).ranks[0].env["MALLOC_TRIM_THRESHOLD_"] == "131072"
    faults = _faults(tmp_path, env=spec_env, local={"preload_torch": preload})
    assert all(f > 10_000 for f in faults), faults  # freed memory went back to the kernel every cycle
