"""The architecture's "never" rules, as tests that fail when they break."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    """Every module a file imports, anywhere in it (``from m import n`` gives ``m`` and ``m.n``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_jobs_never_import_submitit_or_executors() -> None:
    files = sorted((ROOT / "jobs").rglob("*.py"))
    assert files
    for path in files:
        for name in _imports(path):
            assert not name.startswith("submitit"), f"{path} imports {name}"
            assert not name.startswith(("orchestrator.executors", "orchestrator.backends")), f"{path} imports {name}"


def test_spec_and_plan_never_import_subprocess() -> None:
    for module in ("spec/models.py", "plan/__init__.py", "spec/validators.py", "node/rank_env.py"):
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
    # runs_dir named: a SLURM plan refuses the default 'runs' resolved under a checkout in /tmp
    cases = [(["--help"], "usage"), (["validate", str(example)], "ok: resnet50-2x8"),
             (["plan", str(example), "--set", "runs_dir=/shared/runs"], "#SBATCH"),
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
    extra = {"orchestrator.api", "orchestrator.core.records", "orchestrator.plan", "rich", "submitit"} & mods
    assert not extra, f"validate imported {sorted(extra)}"


def test_a_slurm_rank_runs_only_light_standard_library_code_before_the_entrypoint(tmp_path: Path) -> None:
    """What a srun task imports before the user's script runs (every rank of every job pays it):
    no pydantic, submitit, yaml, rich or torch, and no subprocess (the interface is asked of the
    kernel, no ``ip`` process) or tempfile."""
    import json
    import os

    from orchestrator.plan import plan
    from orchestrator.spec.models import JobSpec

    script = tmp_path / "modules.py"
    script.write_text("import json, sys\njson.dump(sorted(sys.modules), open(sys.argv[1], 'w'))\n")
    seen = tmp_path / "modules.json"
    launch = plan(JobSpec(name="light", entrypoint=str(script), executor="slurm", extra_args=[str(seen)],
                          runs_dir=str(tmp_path / "runs")))
    payload = tmp_path / "payload.json"
    payload.write_text(launch.payload.to_json())
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="localhost", SLURM_NTASKS="1", SLURM_JOB_NUM_NODES="1",
               SLURM_LOCALID="0", SLURM_PROCID="0", SLURM_NODEID="0")
    proc = subprocess.run([sys.executable, "-m", "orchestrator.backends.slurm.node.slurm_rank", str(payload)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    mods = set(json.loads(seen.read_text()))
    heavy = {"pydantic", "submitit", "yaml", "rich", "torch", "subprocess", "tempfile", "importlib.abc"} & mods
    assert not heavy, f"a rank imported {sorted(heavy)} before its entrypoint"
    assert "orchestrator.node.launcher" in mods or "__main__" in mods  # it did run through the launcher


def _module_graph() -> dict[str, set[str]]:
    """Every orchestrator and jobs module -> the project modules it imports, wherever in the file
    (a function-level import is as much a dependency as a top-level one)."""
    modules = {}
    for package in ("orchestrator", "jobs"):
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules)
                if node.module in modules and not any(f"{node.module}.{a.name}" in modules for a in node.names):
                    deps.add(node.module)
        graph[name] = deps - {name}
    return graph


def test_the_package_has_no_import_cycle() -> None:
    """One direction from the spec to a rank: no module imports one that imports it back (package
    ``__init__`` re-exports aside)."""
    graph = {k: {d for d in v if d not in ("orchestrator", "jobs")} for k, v in _module_graph().items()
             if k not in ("orchestrator", "jobs")}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycle = path[path.index(dep):] + [dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        path.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_executors_never_import_each_other() -> None:
    """An executor (local, debug, slurm) is reached through the executor interface only: what two
    share lives in a module of its own (base, supervisor, rendezvous, rank_env)."""
    graph = _module_graph()
    executors = {"orchestrator.backends.local.executor", "orchestrator.backends.local.debug",
                 "orchestrator.backends.slurm.executor"}
    for name in executors:
        assert not graph[name] & (executors - {name}), f"{name} imports {sorted(graph[name] & executors)}"


def test_lower_layers_never_import_the_executors_or_the_interfaces() -> None:
    """The rank side (launcher, SLURM rank and agent, rank_env, payload, rendezvous) and jobs/ never
    import an executor, the CLI or the Python API: an upward import."""
    graph = _module_graph()
    upper = {m for m in graph if m.startswith(("orchestrator.executors", "orchestrator.backends.local", "orchestrator.cli"))
             or (m.startswith("orchestrator.backends.slurm.") and not m.startswith("orchestrator.backends.slurm.node"))}
    upper |= {"orchestrator.cli", "orchestrator.api"}
    lower = ["orchestrator.node.launcher", "orchestrator.backends.slurm.node.slurm_rank", "orchestrator.backends.slurm.node.slurm_job", "orchestrator.node.rank_env",
             "orchestrator.core.payload", "orchestrator.core.rendezvous", "orchestrator.backends.slurm.node.slurm_task", "orchestrator.plan",
             "orchestrator.spec", "orchestrator.spec.models"] + [m for m in graph if m.startswith("jobs")]
    for name in lower:
        assert not graph[name] & upper, f"{name} imports {sorted(graph[name] & upper)}"
