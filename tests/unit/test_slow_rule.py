"""A test not marked slow that takes over the limit fails itself (tests/conftest.py), so the suite's
runner re-times it alone like any test that failed side by side, instead of failing the session
with no test to retry."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_test_over_the_limit_is_reported_failed_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_runtest_makereport  # noqa: F401\n")
    (tmp_path / "test_times.py").write_text(
        "import sys, time\n"
        "def test_slow():\n"
        "    sys.modules['tests.conftest'].SLOW_LIMIT_S = 0.2\n"
        "    time.sleep(0.5)\n"
        "def test_quick():\n"
        "    pass\n")
    report = tmp_path / "junit.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           f"--junitxml={report}", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1, done.stdout + done.stderr
    cases = ET.parse(report).getroot().iter("testcase")
    assert [case.get("name") for case in cases if case.find("failure") is not None] == ["test_slow"], done.stdout
    assert "mark it slow in tests/conftest.py's SLOW" in done.stdout, done.stdout
