"""Rendered sbatch scripts against golden files, including hostile names and paths.

The tests only read the golden files. After an intended change, rewrite them with the separate
command below and review the diff:
    python tests/update_golden.py
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from orchestrator.core.interpreter import BOOTSTRAP
from orchestrator.core.errors import SpecError
from orchestrator.spec.loading import spec_from_dict
from orchestrator.plan import plan

GOLDEN = Path(__file__).parent.parent / "golden"
PYTHON = "/opt/venv/bin/python"  # fixed, so golden files do not depend on this machine

HOSTILE_DIRS = {
    "quote": "/data/it's a \"run\"",
    "spaces": "/data/my runs/with spaces",
    "semicolon": "/data/a;touch PWNED;b",
    "subshell": "/data/$(touch PWNED)/`touch PWNED`",
}


def _spec(runs_dir: str, **extra: object):
    base = {
        "name": "golden", "entrypoint": "jobs.train:main", "executor": "slurm", "nodes": 2,
        "gpus_per_node": 2, "runs_dir": runs_dir,
        "slurm": {"python": PYTHON, "partition": "gpu", "time": "1-02:00", "mem": "32G",
                  "setup": ["module load cuda", "source /opt/venv/bin/activate"],
                  "extra_sbatch": {"mail-type": "END", "comment": "it's; $(id)"}},
    }
    base.update(extra)
    return spec_from_dict(base)


def _gpu_type_spec():
    """Typed GPUs and node selection: a bracketed host list reaches sbatch quoted, as one word."""
    spec = _spec("/shared/runs")
    slurm = {**spec.slurm.model_dump(mode="json", exclude_defaults=True),
             "gpu_type": "a100", "nodelist": "gpu[01-02]", "exclude": "gpu07,gpu[10-12]"}
    return _spec("/shared/runs", slurm=slurm)


def _site_spec():
    """What sites require: a partition list, a reservation, a wckey, CPUs and memory per GPU."""
    spec = _spec("/shared/runs")
    slurm = {**spec.slurm.model_dump(mode="json", exclude_defaults=True, exclude={"mem"}),
             "partition": "gpu,gpu-preempt", "reservation": "maint", "wckey": "proj-42", "cpus_per_gpu": 8,
             "mem_per_gpu": "64G"}
    return _spec("/shared/runs", slurm=slurm)


def golden_scripts() -> dict[str, str]:
    """Every golden file's name and the text plan() renders for it now (tests/update_golden.py
    writes these; the tests compare against them)."""
    scripts = {
        "plain": plan(_spec("/shared/runs")).sbatch_script or "",
        "sweep": plan(_spec("/shared/runs", sweep={"lr": [0.1, 0.2, 0.3]}, nodes=1)).sbatch_script or "",
        "gpu-type-nodes": plan(_gpu_type_spec()).sbatch_script or "",
        "site-fields": plan(_site_spec()).sbatch_script or "",
    }
    for case, runs_dir in sorted(HOSTILE_DIRS.items()):
        scripts[f"hostile-{case}"] = plan(_spec(runs_dir)).sbatch_script or ""
    return scripts


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.sbatch"
    assert path.exists(), f"missing golden file {path}; write it with: python tests/update_golden.py"
    assert text == path.read_text(), (
        f"sbatch script differs from {path}; if the change is intended, rewrite the golden files with "
        "'python tests/update_golden.py' and review the diff"
    )


def test_golden_files_are_exactly_the_cases() -> None:
    """No stale golden file, none missing, and every case is compared by a test below."""
    assert sorted(p.stem for p in GOLDEN.glob("*.sbatch")) == sorted(golden_scripts())


def test_golden_scripts_keep_the_launch_contract() -> None:
    """What the scripts must keep whatever else changes: the batch shell alone gets the time-limit
    signal and runs the job's agent, which starts one srun task per rank, and a dead rank takes
    the job down."""
    for name, script in golden_scripts().items():
        assert "#SBATCH --signal=B:USR2@" in script, name
        words = shlex.split(script.rstrip().splitlines()[-1])
        assert words[0] == "exec" and words[2:6] == ["-u", "-c", BOOTSTRAP, "orchestrator.backends.slurm.node.slurm_job"], name
        assert words[-1].endswith("/payload.json"), name
    for launch in (plan(_spec("/shared/runs")), plan(_spec("/shared/runs", sweep={"lr": [0.1, 0.2]}))):
        srun = launch.payload.srun
        assert srun[0] == "srun" and "--kill-on-bad-exit=1" in srun, srun
        assert list(srun[-4:]) == ["-c", BOOTSTRAP, "orchestrator.backends.slurm.node.slurm_rank", os.path.join(launch.run_dir, "payload.json")]


def test_plain_script_matches_golden() -> None:
    script = plan(_spec("/shared/runs")).sbatch_script or ""
    assert script == golden_scripts()["plain"]  # the cases update_golden.py writes are the ones tested
    _check_golden("plain", script)


def test_sweep_script_is_one_array() -> None:
    launch = plan(_spec("/shared/runs", sweep={"lr": [0.1, 0.2, 0.3]}, nodes=1))
    assert "#SBATCH --array=0-2%3" in (launch.sbatch_script or "")
    _check_golden("sweep", launch.sbatch_script or "")
    assert [p.args["lr"] for p in launch.sweep] == [0.1, 0.2, 0.3]
    assert len({p.run_dir for p in launch.sweep}) == 3


def test_gpu_type_and_node_selection_match_golden() -> None:
    script = plan(_gpu_type_spec()).sbatch_script or ""
    _check_golden("gpu-type-nodes", script)
    lines = script.splitlines()
    # The typed request in the GPU option (not --gres), and the host lists quoted for the shell
    # reading of #SBATCH lines: sbatch 22.05 strips the quotes (tests/cluster/test_gpu_types.py).
    assert "#SBATCH --gpus-per-node=a100:2" in lines and not any("--gres" in line for line in lines)
    assert "#SBATCH --nodelist='gpu[01-02]'" in lines
    assert "#SBATCH --exclude='gpu07,gpu[10-12]'" in lines


def test_no_cpu_count_and_no_wckey_unless_the_spec_asks() -> None:
    """The site's DefCpuPerGPU applies only to a job without --cpus-per-task, and submitit's own
    --wckey=submitit is refused where wckeys are enforced: neither is in a script the spec did not ask for."""
    for name, script in golden_scripts().items():
        assert "--cpus-per-task" not in script and "--wckey=submitit" not in script, name


def test_site_fields_match_golden() -> None:
    script = plan(_site_spec()).sbatch_script or ""
    _check_golden("site-fields", script)
    lines = script.splitlines()
    for line in ("#SBATCH --partition=gpu,gpu-preempt", "#SBATCH --reservation=maint", "#SBATCH --wckey=proj-42",
                 "#SBATCH --cpus-per-gpu=8", "#SBATCH --mem-per-gpu=64G"):
        assert line in lines, line
    assert not any(line.startswith(("#SBATCH --mem=", "#SBATCH --cpus-per-task")) for line in lines)


@pytest.mark.parametrize("case", sorted(HOSTILE_DIRS))
def test_hostile_paths_are_quoted(case: str, tmp_path: Path) -> None:
    script = plan(_spec(HOSTILE_DIRS[case])).sbatch_script or ""
    _check_golden(f"hostile-{case}", script)
    # Execute the script with stub srun/sbatch-free shell: every line but setup and the command
    # must be inert. We run it with srun replaced by a printer and check nothing was created.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    (bin_dir / "module").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "module").chmod(0o755)
    script_path = tmp_path / "job.sh"
    script_path.write_text(script.replace("source /opt/venv/bin/activate", "true").replace(PYTHON, "true"))
    work = tmp_path / "cwd"
    work.mkdir()
    subprocess.run(["bash", str(script_path)], cwd=work, check=True, timeout=30,
                   env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert not list(work.iterdir()), "a spec field executed inside the sbatch script"


def test_agent_line_parses_back_to_the_exact_path() -> None:
    runs_dir = HOSTILE_DIRS["subshell"]
    launch = plan(_spec(runs_dir))
    words = shlex.split((launch.sbatch_script or "").rstrip().splitlines()[-1])
    assert words == ["exec", PYTHON, "-u", "-c", BOOTSTRAP, "orchestrator.backends.slurm.node.slurm_job",
                     os.path.join(launch.run_dir, "payload.json")]
    srun = launch.payload.srun
    assert srun[srun.index("--output") + 1] == os.path.join(launch.run_dir, "slurm", "%j_%t_log.out")
    assert launch.run_dir.startswith(runs_dir)


def test_newline_in_path_is_refused() -> None:
    with pytest.raises(SpecError, match="runs_dir"):
        _spec("/data/a\nrm -rf ~")


def test_newline_in_name_is_refused() -> None:
    with pytest.raises(SpecError, match="name"):
        spec_from_dict({"name": "a\n#SBATCH --x", "entrypoint": "jobs.train:main"})
