"""The generic planner imports no backend (issue 34): what is SLURM's (sbatch parameters, srun argv,
submitit, MaxArraySize) is in ``slurm_plan``, asked through ``backends``; ``plan --executor slurm``
splits a sweep into arrays as submit does, by the cluster's MaxArraySize when one answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.core.errors import SubmissionError
from orchestrator.backends.slurm import executor as slurm_executor
from tests.unit.test_boundaries import _imports

ROOT = Path(__file__).resolve().parents[2]
SLURM_SPECIFIC = ("slurm", "submitit", "sbatch", "srun")


@pytest.mark.parametrize("module", ["plan/__init__.py", "plan/plan_model.py", "backends/local/local_plan.py"])
def test_the_generic_planner_imports_nothing_slurm_specific(module: str) -> None:
    """Anywhere in the file, a function-level import too."""
    found = sorted(n for n in _imports(ROOT / "orchestrator" / module) if any(w in n.lower() for w in SLURM_SPECIFIC))
    assert not found, f"orchestrator/{module} imports {found}"


def _sweep(tmp_path: Path, points: int) -> dict:
    return {"name": "arrays", "entrypoint": "jobs.train:main", "executor": "slurm", "runs_dir": str(tmp_path / "runs"),
            "code": {"snapshot": False}, "sweep": {"seed": list(range(points))}}


def test_plan_splits_a_sweep_by_the_clusters_max_array_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm_executor, "max_array_size", lambda: 4)  # what submit asks too
    launch = api.plan_for(_sweep(tmp_path, 7))
    assert launch.array_chunks == [[0, 1, 2], [3, 4, 5], [6]] and len(launch.sbatch_scripts) == 3
    assert any("this cluster's MaxArraySize=4" in n and "3 job array(s)" in n for n in launch.notes), launch.notes


def test_plan_says_it_assumed_the_default_when_no_cluster_answers(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def no_cluster() -> int:
        raise SubmissionError("cannot ask the cluster for its MaxArraySize (scontrol not found)")

    monkeypatch.setattr(slurm_executor, "max_array_size", no_cluster)
    launch = api.plan_for(_sweep(tmp_path, 3))
    assert launch.array_chunks == [[0, 1, 2]]
    assert any("SLURM's default MaxArraySize=1001, assumed: cannot ask the cluster" in n for n in launch.notes), \
        launch.notes


def test_a_plan_without_a_sweep_asks_no_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm_executor, "max_array_size", lambda: pytest.fail("asked the cluster"))
    spec = {**_sweep(tmp_path, 1), "sweep": {}}
    assert api.plan_for(spec).array_chunks == [] and api.plan_for(spec, executor="local").sweep == []
