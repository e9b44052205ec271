"""pyflakes' checks over the code (ruff --select F): no undefined name, no unused import or
variable, no import shadowed, in orchestrator/, jobs/, tests/ and deploy/. A name that is only
re-exported says so (``# noqa: F401``, with why)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_pyflakes_finds_nothing() -> None:
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists():
        pytest.skip("ruff is not installed beside this Python (pip install -e '.[test]' installs it)")
    done = subprocess.run([str(ruff), "check", "--select", "F", "--no-cache", "--output-format", "concise",
                           "orchestrator", "jobs", "tests", "deploy"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"ruff check --select F:\n{done.stdout}{done.stderr}"
