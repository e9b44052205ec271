"""One registry of backends (issue 34): what a backend does is asked of ``backends.backend(name)``,
not read off its name; the registry, the executors and the spec's ``executor`` field agree."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from orchestrator import backends
from orchestrator.backends.factory import EXECUTORS, get_executor
from orchestrator.core.errors import OrchestratorError
from orchestrator.spec.models import ExecutorName

ROOT = Path(__file__).resolve().parents[2]
#: Modules that choose by what a backend does (the registry's flags), never by its name.
BY_REGISTRY = ["api.py", "front/planning.py", "front/pipeline.py", "spec/after.py", "front/run_files.py",
               "plan/__init__.py", "plan/plan_model.py", "backends/local/local_plan.py", "executors/base.py",
               "executors/__init__.py", "backends/factory.py"]
_NAME_TEST = re.compile(r"""(==|!=)\s*["'](slurm|local|debug)["']|["'](slurm|local|debug)["']\s*(==|!=)|"""
                        r"""in\s*\(\s*["'](slurm|local|debug)["']""")


def test_the_registry_the_executors_and_the_spec_name_the_same_backends() -> None:
    assert set(backends.BACKENDS) == set(EXECUTORS) == set(typing.get_args(ExecutorName))
    for name, b in backends.BACKENDS.items():
        assert b.name == name
        assert b.foreground != b.scheduled  # run runs it here, or submit queues it
    assert type(get_executor("debug")).__name__ == "DebugExecutor"


def test_an_unknown_executor_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(OrchestratorError, match="unknown executor 'kubernetes': use local, slurm or debug"):
        get_executor("kubernetes")
    with pytest.raises(OrchestratorError, match="unknown executor"):
        backends.planner("kubernetes")


@pytest.mark.parametrize("module", BY_REGISTRY)
def test_no_backend_is_chosen_by_its_name(module: str) -> None:
    text = (ROOT / "orchestrator" / module).read_text()
    found = [m.group(0) for m in _NAME_TEST.finditer(text)]
    assert not found, f"orchestrator/{module} compares an executor's name: {found}; ask backends.backend(name)"
