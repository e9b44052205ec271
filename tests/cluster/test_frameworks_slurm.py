"""The frameworks' own scripts, unmodified, on the real SLURM cluster: 2 nodes x 2 ranks, one srun
task per rank, train as ONE world of 4. Lightning and Fabric detect SLURM themselves
(SLURMEnvironment: SLURM_PROCID, SLURM_NTASKS, and their check of devices against
SLURM_NTASKS_PER_NODE) and must agree with what ``framework:`` exports; accelerate goes
distributed on CPU only with ACCELERATE_USE_CPU. (transformers takes the same path as accelerate,
through its PartialState, and is run locally in tests/integration/test_frameworks.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_frameworks import assert_one_world, framework_spec

from .test_slurm import run, slurm_plan


@pytest.mark.parametrize("name", ["lightning", "fabric", "accelerate"])
def test_framework_scripts_train_as_one_world_on_slurm(cluster: dict[str, str], name: str) -> None:
    out = Path(cluster["runs_dir"]) / f"fw-{name}-out"
    out.mkdir()
    launch = slurm_plan(cluster, **framework_spec(name, out))
    record = run(launch, timeout=180)
    logs = "".join(p.read_text() for p in sorted((Path(launch.run_dir) / "slurm").glob("*_log.out")))
    assert record.state == "COMPLETED", (record.error, logs[-3000:])
    assert_one_world(name, out, Path(launch.run_dir), environment="SLURMEnvironment")
