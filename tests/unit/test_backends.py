"""One registry of backends (issue 34): what a backend does is asked of ``backends.backend(name)``,
not read off its name (tests/unit/test_backend_seam.py holds every module to it); the registry,
the executors and the spec's ``executor`` field agree."""

from __future__ import annotations

import pytest

from orchestrator import backends
from orchestrator.backends import kinds
from orchestrator.backends.factory import EXECUTORS, get_executor
from orchestrator.core.errors import OrchestratorError, SpecError
from orchestrator.spec.models import JobSpec


def test_the_registry_the_executors_and_the_spec_name_the_same_backends() -> None:
    assert set(backends.BACKENDS) == set(EXECUTORS) == set(kinds.KINDS)
    assert JobSpec.model_json_schema()["properties"]["executor"]["enum"] == list(kinds.KINDS)
    with pytest.raises(SpecError, match="unknown executor 'kubernetes': use local, slurm or debug"):
        JobSpec(name="x", entrypoint="jobs.train:main", executor="kubernetes")
    for name, b in backends.BACKENDS.items():
        assert b.name == name
        assert b.foreground != b.scheduled  # run runs it here, or submit queues it
    assert type(get_executor("debug")).__name__ == "DebugExecutor"


def test_an_unknown_executor_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(OrchestratorError, match="unknown executor 'kubernetes': use local, slurm or debug"):
        get_executor("kubernetes")
    with pytest.raises(OrchestratorError, match="unknown executor"):
        backends.planner("kubernetes")
