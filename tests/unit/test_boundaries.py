"""The architecture's "never" rules, as tests that fail when they break."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_jobs_never_import_submitit_or_executors() -> None:
    files = sorted((ROOT / "jobs").rglob("*.py"))
    assert files
    for path in files:
        for name in _imports(path):
            assert not name.startswith("submitit"), f"{path} imports {name}"
            assert not name.startswith("orchestrator.executors"), f"{path} imports {name}"


def test_spec_and_plan_never_import_subprocess() -> None:
    for module in ("spec.py", "plan.py", "validators.py", "rank_env.py"):
        names = _imports(ROOT / "orchestrator" / module)
        assert "subprocess" not in names, f"orchestrator/{module} imports subprocess"


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, check=True, cwd=ROOT, timeout=60)
    return set(out.stdout.split())


def test_help_and_validate_never_import_torch() -> None:
    example = ROOT / "orchestrator" / "examples" / "tcp-2x8.yaml"
    for argv in (["--help"], ["validate", str(example)], ["plan", str(example)],
                 ["plan", str(ROOT / "orchestrator" / "examples" / "demo.yaml"), "--json"]):
        code = (f"import sys\nfrom orchestrator.cli import main\n"
                f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass")
        mods = _modules_after(code)
        assert "torch" not in mods, f"orchestrator {' '.join(argv)} imported torch"
        if argv[0] != "plan":
            assert "submitit" not in mods, f"orchestrator {' '.join(argv)} imported submitit"
