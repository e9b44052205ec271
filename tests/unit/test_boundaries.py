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


def _run_cli(argv: list[str]) -> tuple[int, set[str], str]:
    """Run orchestrator.cli.main(argv) in a fresh interpreter: its exit code, the modules it
    imported, and what it printed."""
    code = (
        "import sys, io, contextlib\n"
        "from orchestrator.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    try:\n"
        f"        rc = main({argv!r})\n"
        "    except SystemExit as exc:\n"
        "        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)\n"
        "print('RC', rc)\n"
        "print('MODULES', ' '.join(sys.modules))\n"
        "print('OUT', out.getvalue().replace('\\n', ' '))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] if " " in line else "" for line in proc.stdout.splitlines()}
    return int(lines["RC"]), set(lines["MODULES"].split()), lines.get("OUT", "")


def test_help_and_validate_never_import_torch() -> None:
    example = ROOT / "orchestrator" / "examples" / "tcp-2x8.yaml"
    demo = ROOT / "orchestrator" / "examples" / "demo.yaml"
    cases = [(["--help"], "usage"), (["validate", str(example)], "ok: resnet50-2x8"), (["plan", str(example)], "#SBATCH"),
             (["plan", str(demo), "--json"], '"ranks"')]
    for argv, expected in cases:
        rc, mods, out = _run_cli(argv)
        # The command must have done its work: an early failure imports nothing either.
        assert rc == 0, f"orchestrator {' '.join(argv)} exited {rc}"
        assert expected in out, f"orchestrator {' '.join(argv)} printed {out[:300]!r}"
        assert "torch" not in mods, f"orchestrator {' '.join(argv)} imported torch"
        if argv[0] != "plan":
            assert "submitit" not in mods, f"orchestrator {' '.join(argv)} imported submitit"


def test_a_failing_validate_is_seen_as_failing(tmp_path: Path) -> None:
    """The check above would notice a validate that fails early (it is not blind to exit codes)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nentrypoint: jobs.train:main\nnodes: 0\n")
    rc, mods, _ = _run_cli(["validate", str(bad)])
    assert rc == 2 and "torch" not in mods


def test_validate_loads_the_spec_without_the_rest_of_the_api() -> None:
    rc, mods, _ = _run_cli(["validate", str(ROOT / "orchestrator" / "examples" / "tcp-2x8.yaml")])
    assert rc == 0
    extra = {"orchestrator.api", "orchestrator.records", "orchestrator.plan", "rich", "submitit"} & mods
    assert not extra, f"validate imported {sorted(extra)}"


def test_a_slurm_rank_runs_only_light_standard_library_code_before_the_entrypoint(tmp_path: Path) -> None:
    """What a srun task imports before the user's script runs (every rank of every job pays it):
    no pydantic, submitit, yaml, rich or torch, and no subprocess (the interface is asked of the
    kernel, no ``ip`` process) or tempfile."""
    import json
    import os

    from orchestrator.plan import plan
    from orchestrator.spec import JobSpec

    script = tmp_path / "modules.py"
    script.write_text("import json, sys\njson.dump(sorted(sys.modules), open(sys.argv[1], 'w'))\n")
    seen = tmp_path / "modules.json"
    launch = plan(JobSpec(name="light", entrypoint=str(script), executor="slurm", extra_args=[str(seen)],
                          runs_dir=str(tmp_path / "runs")))
    payload = tmp_path / "payload.json"
    payload.write_text(json.dumps(launch.payload))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="localhost", SLURM_NTASKS="1", SLURM_JOB_NUM_NODES="1",
               SLURM_LOCALID="0", SLURM_PROCID="0", SLURM_NODEID="0")
    proc = subprocess.run([sys.executable, "-m", "orchestrator.launcher", "--slurm", str(payload)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    mods = set(json.loads(seen.read_text()))
    heavy = {"pydantic", "submitit", "yaml", "rich", "torch", "subprocess", "tempfile", "importlib.abc"} & mods
    assert not heavy, f"a rank imported {sorted(heavy)} before its entrypoint"
    assert "orchestrator.launcher" in mods or "__main__" in mods  # it did run through the launcher
