from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def _test_tmp() -> Path:
    """Where the tests' folders (tmp_path) live: never under /tmp, /var/tmp ..., since a SLURM spec
    refuses a node-local runs_dir, as it must on a real cluster. Under the checkout, unless the
    checkout itself is on such a path (a clone in /tmp): then in the user's cache folder."""
    from orchestrator.validators import is_node_local

    checkout = Path(__file__).resolve().parents[1]
    if not is_node_local(str(checkout)):
        return checkout / ".pytest-tmp"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "ddp-orchestrator-tests"


TEST_TMP = _test_tmp()


def pytest_configure(config: pytest.Config) -> None:
    if not config.option.basetemp:
        TEST_TMP.mkdir(parents=True, exist_ok=True)
        config.option.basetemp = str(TEST_TMP / f"session-{os.getpid()}")


def pytest_unconfigure(config: pytest.Config) -> None:
    base = Path(str(config.option.basetemp))
    if base.parent == TEST_TMP:
        shutil.rmtree(base, ignore_errors=True)


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


# -- cluster tests are never skipped quietly ------------------------------------------------------
# The SLURM tests need root and apt-get (deploy/cluster.sh installs Debian's packages). Where they
# cannot run they skip, and the end of the session says so in one loud line; where they could run
# (root and apt-get present) but were skipped anyway, the session fails.

_CLUSTER: dict[str, dict[str, str]] = {}  # test id -> {phase: outcome}


def can_run_cluster_tests() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get") is not None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "cluster" in report.keywords:
        _CLUSTER.setdefault(report.nodeid, {})[report.when] = report.outcome


def cluster_counts() -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for phases in _CLUSTER.values():
        outcomes = set(phases.values())
        if "failed" in outcomes:
            counts["failed"] += 1
        elif "skipped" in outcomes:
            counts["skipped"] += 1
        elif phases.get("call") == "passed":
            counts["passed"] += 1
    return counts


def _skipped_but_runnable() -> bool:
    return cluster_counts()["skipped"] > 0 and can_run_cluster_tests()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skipped_but_runnable() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _CLUSTER:
        return  # no cluster test was selected (e.g. pytest tests/unit)
    c = cluster_counts()
    ran = c["passed"] + c["failed"]
    line = (f"cluster tests (real SLURM): {ran} ran ({c['passed']} passed, {c['failed']} failed), "
            f"{c['skipped']} skipped")
    if not c["skipped"]:
        terminalreporter.write_sep("=", line, green=not c["failed"], red=bool(c["failed"]))
    elif can_run_cluster_tests():
        terminalreporter.write_sep("!", line + ": this machine has root and apt-get, so skipping them "
                                   "FAILS the session", red=True, bold=True)
    else:
        terminalreporter.write_sep("!", line + ": SLURM was NOT tested (they need root and apt-get)",
                                   yellow=True, bold=True)
