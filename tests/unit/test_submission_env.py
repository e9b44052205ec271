"""The environment sbatch runs in: the user's and the site's SBATCH_* defaults reach it (for what
the spec leaves out), a surrounding job's own SLURM_* do not (and only inside a job), and
``plan`` says which SBATCH_* the submission uses."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.core.errors import SubmissionError
from orchestrator.front.display import print_plan
from orchestrator.backends.slurm.executor import SlurmExecutor
from orchestrator.backends.slurm.slurm_env import (clean_submission_env, sbatch_env_line, sbatch_option_of, script_options,
                                              submission_env)
from orchestrator.plan import plan
from orchestrator.spec.models import JobSpec

ROOT = Path(__file__).resolve().parents[2]
SITE = {"SBATCH_ACCOUNT": "proj-7", "SBATCH_PARTITION": "gpu", "SBATCH_QOS": "high", "SBATCH_RESERVATION": "maint",
        "SBATCH_EXPORT": "ALL"}


def _clear(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith(("SLURM_", "SBATCH_")):
            monkeypatch.delenv(key)


def test_outside_a_job_every_sbatch_and_slurm_variable_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear(monkeypatch)
    for key, value in {**SITE, "SLURM_HINT": "nomultithread", "SLURM_CONF": "/etc/slurm/slurm.conf"}.items():
        monkeypatch.setenv(key, value)
    before = dict(os.environ)
    with clean_submission_env({"nodes", "time", "output"}) as used:
        assert used == SITE
        assert dict(os.environ) == before
    assert dict(os.environ) == before


def test_inside_a_job_only_that_jobs_own_slurm_variables_go(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear(monkeypatch)
    job = {"SLURM_JOB_ID": "17", "SLURM_NODELIST": "node[1-2]", "SLURM_NTASKS": "4", "SLURM_EXPORT_ENV": "NONE"}
    for key, value in {**SITE, **job, "SLURM_CONF": "/etc/slurm/slurm.conf"}.items():
        monkeypatch.setenv(key, value)
    with clean_submission_env({"nodes", "time"}) as used:
        assert used == SITE
        assert not any(k in os.environ for k in job)
        assert os.environ["SLURM_CONF"] == "/etc/slurm/slurm.conf"
        assert all(os.environ[k] == v for k, v in SITE.items())
    assert all(os.environ[k] == v for k, v in job.items())  # the surrounding job's are back afterwards


def test_what_the_script_sets_wins_over_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """sbatch lets SBATCH_* win over #SBATCH lines: the variable is left out where the spec (or the
    orchestrator) set the option, so it is only a default."""
    _clear(monkeypatch)
    env = {"SBATCH_PARTITION": "cpu", "SBATCH_TIMELIMIT": "5", "SBATCH_MEM_PER_CPU": "1G", "SBATCH_NO_REQUEUE": "1",
           "SBATCH_ACCOUNT": "proj-7", "SBATCH_SIGNAL": "USR1@60", "SBATCH_CPUS_PER_GPU": "8"}
    used, dropped = submission_env({"partition", "time", "mem", "requeue", "signal", "cpus-per-task"}, env)
    assert used == {"SBATCH_ACCOUNT": "proj-7"}
    assert set(dropped) == set(env) - {"SBATCH_ACCOUNT"}
    assert "--time" in dropped["SBATCH_TIMELIMIT"] and "--partition" in dropped["SBATCH_PARTITION"]
    # without those lines in the script, the same variables are the job's defaults
    used, dropped = submission_env({"nodes"}, env)
    assert used == env and dropped == {}


def test_variables_that_would_break_the_submission_never_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"SBATCH_WAIT": "1", "SBATCH_ARRAY_INX": "0-3", "SBATCH_CLUSTERS": "other", "SBATCH_QOS": "high"}
    used, dropped = submission_env(set(), env)
    assert used == {"SBATCH_QOS": "high"} and set(dropped) == {"SBATCH_WAIT", "SBATCH_ARRAY_INX", "SBATCH_CLUSTERS"}


def test_option_names_and_script_lines() -> None:
    assert sbatch_option_of("SBATCH_JOB_NAME") == "job-name" and sbatch_option_of("SBATCH_TIMELIMIT") == "time"
    assert sbatch_option_of("SBATCH_MEM_PER_NODE") == "mem" and sbatch_option_of("SBATCH_ARRAY_INX") == "array"
    golden = (ROOT / "tests" / "golden" / "gpu-type-nodes.sbatch").read_text()
    found = script_options(golden)
    assert {"nodes", "time", "partition", "gpus-per-node", "output", "signal"} <= found
    assert "module" not in found  # the setup lines are no options
    assert script_options("#!/bin/bash\n#SBATCH --qos=x\necho hi\n#SBATCH --account=late\n") == {"qos"}


def _slurm_spec(tmp_path: Path, **kw) -> JobSpec:
    base = dict(name="envjob", entrypoint="jobs.train:main", nodes=1, gpus_per_node=1, executor="slurm",
                runs_dir=str(tmp_path / "runs"), code={"snapshot": False})
    return JobSpec(**{**base, **kw})


def _plan_text(launch) -> str:
    buf = io.StringIO()
    print_plan(launch, Console(file=buf, width=400))
    return buf.getvalue()


def test_plan_lists_the_sbatch_variables_the_submission_uses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _clear(monkeypatch)
    monkeypatch.setenv("SBATCH_ACCOUNT", "proj-7")
    monkeypatch.setenv("SBATCH_PARTITION", "gpu")
    text = _plan_text(plan(_slurm_spec(tmp_path)))
    line = next(x for x in text.splitlines() if x.startswith("sbatch defaults from this environment"))
    assert line.endswith(": SBATCH_ACCOUNT=proj-7 SBATCH_PARTITION=gpu"), line
    # the spec names a partition: the variable is said, and said unused
    line = sbatch_env_line(plan(_slurm_spec(tmp_path, slurm={"partition": "debug"})).sbatch_scripts)
    assert line.endswith(": SBATCH_ACCOUNT=proj-7; set but not used (the script's own option wins, or it would break "
                         "the job): SBATCH_PARTITION (the script sets --partition)"), line
    # inside a job, its own SLURM_* are said to stay behind
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    monkeypatch.setenv("SLURM_NODELIST", "n1")
    assert "inside job 99: its 2 SLURM_* variable(s) are not passed on" in \
        sbatch_env_line(plan(_slurm_spec(tmp_path)).sbatch_scripts)
    _clear(monkeypatch)
    assert sbatch_env_line(plan(_slurm_spec(tmp_path)).sbatch_scripts).endswith(": none")
    local = plan(_slurm_spec(tmp_path, executor="local", gpus_per_node=0, cpu_ranks_per_node=1))
    assert "sbatch defaults" not in _plan_text(local)


@pytest.fixture
def env_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An sbatch on PATH that writes the SLURM_*/SBATCH_* it was started with, then answers as sbatch
    (and an srun that answers, which submitit looks for before it submits)."""
    bin_dir, seen = tmp_path / "bin", tmp_path / "sbatch-env.txt"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f"#!/bin/sh\nenv | grep -E '^(SLURM|SBATCH)_' | sort > '{seen}'\necho 'Submitted batch job 4242'\n")
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IXUSR)
    srun = bin_dir / "srun"
    srun.write_text("#!/bin/sh\nexit 0\n")
    srun.chmod(srun.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return seen


@pytest.mark.parametrize("in_job", [False, True])
def test_sbatch_gets_the_defaults_and_never_a_surrounding_jobs_context(tmp_path: Path, env_sbatch: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      in_job: bool) -> None:
    _clear(monkeypatch)
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    for key, value in {**SITE, "SLURM_CONF": str(conf)}.items():
        monkeypatch.setenv(key, value)
    if in_job:
        monkeypatch.setenv("SLURM_JOB_ID", "17")
        monkeypatch.setenv("SLURM_NODELIST", "node1")
    record = SlurmExecutor().submit(plan(_slurm_spec(tmp_path, slurm={"partition": "debug"})))
    assert record.job_ids == ["4242"]
    seen = dict(line.split("=", 1) for line in env_sbatch.read_text().splitlines())
    expected = {**SITE, "SLURM_CONF": str(conf)}
    del expected["SBATCH_PARTITION"]  # the spec names its partition: that one is used
    assert seen == expected
    assert os.environ["SBATCH_PARTITION"] == "gpu"  # the caller's environment is as it was
    assert (os.environ.get("SLURM_JOB_ID") == "17") is in_job


# ---- the hostile-input review: variables that must never reach sbatch, or stop the submission -----------
def test_the_agents_log_options_and_the_job_id_options_never_reach_sbatch() -> None:
    """SBATCH_ERROR (the script sets no --error: stderr goes with stdout to the agent's log) and
    SBATCH_OUTPUT would move the log status and logs read; SBATCH_GPUS_PER_TASK would change the
    ranks' layout; SBATCH_QUIET and SBATCH_PARSABLE (no sbatch reads them today) would hide the job
    id. Each is left out, with why, whatever the script sets; the site's defaults stay."""
    env = {"SBATCH_ERROR": "/tmp/err-%j", "SBATCH_OUTPUT": "/tmp/out-%j", "SBATCH_GPUS_PER_TASK": "1",
           "SBATCH_QUIET": "1", "SBATCH_PARSABLE": "1", "SBATCH_EXPORT": "NONE", "SBATCH_ACCOUNT": "proj-7"}
    used, dropped = submission_env(set(), env)
    assert used == {"SBATCH_EXPORT": "NONE", "SBATCH_ACCOUNT": "proj-7"}
    assert set(dropped) == set(env) - set(used)
    assert "status and logs read" in dropped["SBATCH_ERROR"] and "status and logs read" in dropped["SBATCH_OUTPUT"]
    assert "no job id" in dropped["SBATCH_QUIET"] and "layout" in dropped["SBATCH_GPUS_PER_TASK"]


@pytest.mark.parametrize("name,value,fix", [
    ("SLURM_CLUSTERS", "other", "unset it for the orchestrator"),
    ("SBATCH_CONTAINER", "/bundles/torch", "set container: in the spec instead"),
])
@pytest.mark.parametrize("in_job", [False, True])
def test_a_variable_that_would_send_the_job_elsewhere_stops_the_submission(
        tmp_path: Path, env_sbatch: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str, fix: str,
        in_job: bool) -> None:
    """SLURM_CLUSTERS is sbatch's --clusters, and squeue and scancel read it too: leaving it out of
    sbatch's environment alone would not do. SBATCH_CONTAINER would put the job's agent in the image.
    The submission stops on either, naming it and the fix, before sbatch runs or the run folder is made."""
    _clear(monkeypatch)
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.setenv(name, value)
    if in_job:
        monkeypatch.setenv("SLURM_JOB_ID", "17")
    launch = plan(_slurm_spec(tmp_path))
    with pytest.raises(SubmissionError) as err:
        SlurmExecutor().submit(launch)
    assert f"{name}='{value}' in this environment" in str(err.value) and fix in str(err.value), str(err.value)
    assert not env_sbatch.exists() and not Path(launch.run_dir).exists()
    assert f"submit refuses: {name}='{value}'" in sbatch_env_line(launch.sbatch_scripts)  # plan says so first
    with pytest.raises(SubmissionError, match=name):
        with clean_submission_env():
            pass


def test_validate_cluster_names_a_refused_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.backends.slurm import slurm_checks
    from orchestrator.core.errors import SpecError

    answers = {"partition": "PartitionName=gpu Default=YES MaxTime=UNLIMITED Nodes=n1 State=UP\n",
               "node": "NodeName=n1 CPUTot=8 Gres=gpu:2 State=IDLE Partitions=gpu\n", "config": "MaxArraySize=1001\n"}
    monkeypatch.setattr(slurm_checks, "scontrol_text", lambda *args: answers[args[1]])
    spec = _slurm_spec(tmp_path)
    slurm_checks.check_against_cluster(spec, environ={})  # fits (a CPU warning at most)
    with pytest.raises(SpecError) as err:
        slurm_checks.check_against_cluster(spec, environ={"SLURM_CLUSTERS": "other"})
    assert any(p.startswith("SLURM_CLUSTERS='other' in this environment: sbatch reads it as --clusters")
               for p in err.value.problems), err.value.problems
    with pytest.raises(SpecError) as err:  # a partition named by the environment is shown escaped
        slurm_checks.check_against_cluster(spec, environ={"SBATCH_PARTITION": "gpu\x1b[2J,cpu"})
    assert all(p.isprintable() for p in err.value.problems) and "list 'gpu\\x1b[2J,cpu'" in err.value.problems[0], \
        err.value.problems


def test_plan_escapes_control_characters_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An SBATCH_* value (or name, or SLURM_JOB_ID) holding ESC must not reach the terminal as one:
    plan prints its escape instead, and so does the account hint of a refused submission."""
    from orchestrator.backends.slurm.executor import account_hint

    _clear(monkeypatch)
    hostile = "\x1b[2J\x1b]0;pwned\x07\u202e"
    env = {"SBATCH_ACCOUNT": f"proj{hostile}", f"SBATCH_X{hostile}": "1", "SBATCH_ERROR": "e",
           "SLURM_JOB_ID": f"17{hostile}", "SLURM_NODELIST": "n1"}
    line = sbatch_env_line(plan(_slurm_spec(tmp_path)).sbatch_scripts, env)
    assert line.isprintable(), repr(line)
    assert "SBATCH_ACCOUNT='proj\\x1b[2J\\x1b]0;pwned\\x07\\u202e'" in line and "inside job 17\\x1b[2J" in line
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("OMP_NUM_THREADS", f"4{hostile}")
    text = _plan_text(plan(_slurm_spec(tmp_path)))
    shown = [x for x in text.splitlines() if x.startswith(("sbatch defaults", "CPUs:"))]
    assert len(shown) == 2 and all(x.isprintable() for x in shown), shown
    hint = account_hint("Invalid account or account/partition combination specified", None, None,
                        {"SBATCH_ACCOUNT": f"p{hostile}", "SBATCH_PARTITION": f"gpu{hostile}"}, user="me")
    assert hint.isprintable() and "the account 'p\\x1b[2J" in hint and "partition 'gpu\\x1b[2J" in hint, hint
