"""orchestrator.backends.slurm.submitit_adapter, the one module that touches submitit's internals: its rendering
against golden text (a submitit release that renders differently fails here first), the script
it submits against the one it renders (a fake sbatch; no cluster), the version check, and the
rule that no other module reaches into submitit.

After an intended change of submitit's rendering (a new supported version), rewrite GOLDEN_*
below from ``render_sbatch(PARAMS, FOLDER, COMMAND[, n_points=3])`` and review the diff, with the
files in tests/golden/ (``python tests/update_golden.py``).
"""

from __future__ import annotations

import ast
import os
import shlex
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.backends.slurm import submitit_adapter
from orchestrator.core.errors import OrchestratorError, SubmissionError
from orchestrator.backends.slurm.submitit_adapter import SUPPORTED, UnsupportedSubmititError, check_version, render_sbatch, submit

ROOT = Path(__file__).resolve().parents[2]

#: What plan.submitit_parameters gives a 2-node GPU job, with hostile quoting in a free field.
PARAMS = {
    "job_name": "golden", "nodes": 2, "ntasks_per_node": 2, "cpus_per_task": 4, "time": 1560, "signal_delay_s": 120,
    "use_srun": False, "stderr_to_stdout": True, "gpus_per_node": 2, "partition": "gpu",
    "setup": ["module load cuda", "source /opt/venv/bin/activate"],
    "additional_parameters": {"mail-type": "END", "comment": "it's; $(id)", "signal": "B:USR2@120", "requeue": True,
                              "mem": "32G"},
}
FOLDER = "/shared/runs/golden/slurm"
COMMAND = "exec /opt/venv/bin/python -u -m orchestrator.backends.slurm.node.slurm_job /shared/runs/golden/payload.json"

GOLDEN_SINGLE = """\
#!/bin/bash

# Parameters
#SBATCH --comment='it'"'"'s; $(id)'
#SBATCH --cpus-per-task=4
#SBATCH --gpus-per-node=2
#SBATCH --job-name=golden
#SBATCH --mail-type=END
#SBATCH --mem=32G
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --open-mode=append
#SBATCH --output=/shared/runs/golden/slurm/%j_0_log.out
#SBATCH --partition=gpu
#SBATCH --requeue
#SBATCH --signal=B:USR2@120
#SBATCH --time=1560

# setup
module load cuda
source /opt/venv/bin/activate

# command
export SUBMITIT_EXECUTOR=slurm
exec /opt/venv/bin/python -u -m orchestrator.backends.slurm.node.slurm_job /shared/runs/golden/payload.json
"""

GOLDEN_ARRAY = GOLDEN_SINGLE.replace("# Parameters\n", "# Parameters\n#SBATCH --array=0-2%3\n").replace(
    "/slurm/%j_0_log.out", "/slurm/%A_%a_0_log.out")


# ---- rendering -------------------------------------------------------------------------------
def test_rendering_matches_golden() -> None:
    assert render_sbatch(PARAMS, FOLDER, COMMAND) == GOLDEN_SINGLE, (
        "submitit renders this job differently: check the new script, then update GOLDEN_SINGLE and SUPPORTED")


def test_array_rendering_matches_golden() -> None:
    assert render_sbatch(PARAMS, FOLDER, COMMAND, n_points=3) == GOLDEN_ARRAY, (
        "submitit renders this job array differently: check the new script, then update GOLDEN_ARRAY and SUPPORTED")


def test_rendering_keeps_the_launch_contract() -> None:
    """What we rely on whatever submitit's version: our command is the batch script's last line
    as given (no srun, no submitit._submit, no pickle), and the batch shell gets the signal."""
    script = render_sbatch(PARAMS, FOLDER, COMMAND)
    assert script.rstrip().splitlines()[-1] == COMMAND
    assert "submitit.core._submit" not in script and ".pkl" not in script and "\nsrun " not in script
    assert "#SBATCH --signal=B:USR2@120" in script.splitlines()


# ---- submitting ------------------------------------------------------------------------------
@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """sbatch and srun on PATH that only record: sbatch copies the script it is given to
    ``<tmp>/submitted-N.sh`` and answers as sbatch does. Returns the folder of the copies."""
    bin_dir, seen = tmp_path / "bin", tmp_path / "seen"
    bin_dir.mkdir()
    seen.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text("#!/bin/sh\n"
                      f"n=$(ls {shlex.quote(str(seen))} | wc -l)\n"
                      f"cp \"$1\" {shlex.quote(str(seen))}/submitted-$n.sh\n"
                      "echo \"Submitted batch job $((4242 + n))\"\n")
    srun = bin_dir / "srun"
    srun.write_text("#!/bin/sh\nexit 0\n")
    for tool in (sbatch, srun):
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return seen


def test_submit_sends_the_script_it_renders(tmp_path: Path, fake_slurm: Path) -> None:
    folder = tmp_path / "run" / "slurm"
    folder.mkdir(parents=True)
    assert submit(folder, PARAMS, COMMAND) == "4242"
    assert submit(folder, PARAMS, COMMAND, n_points=3) == "4243"
    sent = [(fake_slurm / f"submitted-{i}.sh").read_text() for i in range(2)]
    assert sent[0] == render_sbatch(PARAMS, str(folder), COMMAND)
    assert sent[1] == render_sbatch(PARAMS, str(folder), COMMAND, n_points=3)
    assert "#SBATCH --array=0-2%3" in sent[1]
    # submitit's own default, --wckey=submitit, never reaches sbatch: no wckey unless one is named
    assert not any("--wckey" in script for script in sent)
    assert submit(folder, {**PARAMS, "wckey": "proj-42"}, COMMAND) == "4244"
    named = (fake_slurm / "submitted-2.sh").read_text()
    assert named == render_sbatch({**PARAMS, "wckey": "proj-42"}, str(folder), COMMAND)
    assert "#SBATCH --wckey=proj-42" in named.splitlines()
    # submitit keeps each submitted script in the job's folder (where `orchestrator plan` says logs go)
    assert (folder / "4242_submission.sh").read_text() == sent[0]


def test_sbatch_errors_come_back_as_exceptions(tmp_path: Path, fake_slurm: Path) -> None:
    (fake_slurm.parent / "bin" / "sbatch").write_text(
        "#!/bin/sh\necho 'sbatch: error: invalid partition specified: gpu' >&2\nexit 1\n")
    folder = tmp_path / "slurm"
    folder.mkdir()
    with pytest.raises(Exception, match="invalid partition specified"):
        submit(folder, PARAMS, COMMAND)


# ---- the version check -----------------------------------------------------------------------
def test_the_installed_submitit_is_supported() -> None:
    import submitit

    assert check_version() == submitit.__version__


@pytest.mark.parametrize("version", ["1.5.0", "1.5.4", "1.5", "1.5.9.post1"])
def test_versions_inside_the_range_pass(version: str) -> None:
    assert SUPPORTED == ">=1.5,<1.6"  # the range the golden text above was checked with
    assert check_version(version) == version


@pytest.mark.parametrize("version", ["1.4.9", "1.6.0", "1.6.0rc1", "2.0", "0.1", "not-a-version"])
def test_versions_outside_the_range_are_named_with_the_fix(version: str) -> None:
    with pytest.raises(UnsupportedSubmititError) as caught:
        check_version(version)
    text = str(caught.value)
    assert f"submitit {version} is installed" in text and SUPPORTED in text and "pip install" in text
    assert isinstance(caught.value, SubmissionError) and isinstance(caught.value, OrchestratorError)


def test_a_missing_submitit_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(submitit_adapter, "installed_version", lambda: None)
    with pytest.raises(UnsupportedSubmititError, match=r"submitit is not installed.*pip install 'submitit>=1\.5,<1\.6'"):
        check_version()


def test_an_unsupported_submitit_is_refused_before_any_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither rendering, nor submitting, nor the executor (before it makes a run folder) goes on."""
    from orchestrator.backends.slurm.executor import SlurmExecutor

    monkeypatch.setattr(submitit_adapter, "installed_version", lambda: "1.7.0")
    with pytest.raises(UnsupportedSubmititError, match="submitit 1.7.0 is installed"):
        render_sbatch(PARAMS, FOLDER, COMMAND)
    with pytest.raises(UnsupportedSubmititError):
        submit(tmp_path, PARAMS, COMMAND)
    run_dir = tmp_path / "runs" / "x"
    launch = SimpleNamespace(submitit=PARAMS, run_dir=str(run_dir), run_id="x")
    with pytest.raises(UnsupportedSubmititError):
        SlurmExecutor().submit(launch)  # type: ignore[arg-type]
    assert not run_dir.exists()


# ---- one adapter -----------------------------------------------------------------------------
PRIVATE_NAMES = {"_make_sbatch_string", "_submit_command", "map_count"}


def _sources() -> list[Path]:
    files = sorted((ROOT / "orchestrator").rglob("*.py"))
    assert (ROOT / "orchestrator" / "backends" / "slurm" / "submitit_adapter.py") in files
    return [p for p in files if p.name != "submitit_adapter.py" or p.parent != ROOT / "orchestrator" / "backends" / "slurm"]


def _root(node: ast.expr) -> str | None:
    """The name an attribute chain starts from: ``submitit`` for ``submitit.helpers._x``."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _private_uses(path: Path) -> list[str]:
    """Where a module names one of submitit's private names, or imports a private one from it
    (code only: comments and docstrings may talk about them)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Attribute) and (node.attr in PRIVATE_NAMES or
                                                (node.attr.startswith("_") and _root(node) == "submitit")):
            found.append(f"{line}: .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in PRIVATE_NAMES:
            found.append(f"{line}: {node.id}")
        elif isinstance(node, ast.keyword) and node.arg in PRIVATE_NAMES:
            found.append(f"{line}: {node.arg}=")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in PRIVATE_NAMES:
            found.append(f"{line}: {node.value!r}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "submitit":
            private = [a.name for a in node.names if a.name.startswith("_")]
            if private or any(part.startswith("_") for part in (node.module or "").split(".")):
                found.append(f"{line}: from {node.module} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "submitit" and any(p.startswith("_") for p in alias.name.split(".")):
                    found.append(f"{line}: import {alias.name}")
    return found


def test_no_module_but_the_adapter_uses_submitit_internals() -> None:
    offenders = {str(p.relative_to(ROOT)): uses for p in _sources() if (uses := _private_uses(p))}
    assert not offenders, f"submitit's private names outside orchestrator/backends/slurm/submitit_adapter.py: {offenders}"


def test_no_module_but_the_adapter_imports_submitit() -> None:
    importers = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.split(".")[0] == "submitit" for n in names):
                importers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not importers, f"submitit imported outside orchestrator/backends/slurm/submitit_adapter.py: {importers}"


def test_the_checks_above_see_a_private_use(tmp_path: Path) -> None:
    """The scan is not blind: each way of reaching into submitit is caught."""
    sample = tmp_path / "sample.py"
    sample.write_text("from submitit.slurm.slurm import _make_sbatch_string\n"
                      "import submitit.core._submit\n"
                      "ex.parameters['map_count'] = 3\n"
                      "job = ex._submit_command('x')\n"
                      "render(map_count=2)\n"
                      "y = submitit.helpers._private\n"
                      "# a comment about submitit.core._submit is fine\n")
    uses = _private_uses(sample)
    for line in range(1, 7):
        assert any(u.startswith(f"{line}: ") for u in uses), (line, uses)
    assert not any(u.startswith("7: ") for u in uses)
