from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_registry(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test gets its own run registry, never the user's."""
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(tmp_path_factory.mktemp("orch-home")))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        if "integration" in parts:
            item.add_marker(pytest.mark.integration)
        if "cluster" in parts:
            item.add_marker(pytest.mark.cluster)
