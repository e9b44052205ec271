"""``--remote`` end to end without a cluster: the laptop's CLI, a stand-in for ssh that runs the
login node's command here (with the login user's own HOME and, as sites set it, $SCRATCH), and
the login node's CLI answering it. What the cluster test shows through a real login node, in
seconds: ``plan`` is the login node's plan ('~' is the login user's home, its interpreter), a
relative runs_dir under that home is refused naming the fix, and the checkout is named by the
laptop's client id."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

FAKE_SSH = """#!/bin/sh
# ssh's stand-in: '-O check' finds the master up; a command runs here, as the login user's shell would
case " $* " in *" -O "*) exit 0 ;; esac
for word; do last=$word; done
cd "$LOGIN_HOME" || exit 255
exec env -u ORCHESTRATOR_HOME -u ORCHESTRATOR_CONFIG HOME="$LOGIN_HOME" ${LOGIN_SCRATCH:+SCRATCH="$LOGIN_SCRATCH"} \\
    sh -c "$last"
"""


@pytest.fixture
def laptop(tmp_path: Path) -> dict:
    """A laptop (its home, its config naming the login node) and a login node (another home)."""
    laptop_home, login_home = tmp_path / "laptop-home", tmp_path / "login-home"
    laptop_home.mkdir()
    login_home.mkdir()
    ssh = tmp_path / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    config = laptop_home / ".config" / "orchestrator" / "config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(yaml.safe_dump({"remote": {"host": "login", "ssh": [str(ssh)],
                                                 "command": [sys.executable, "-m", "orchestrator"]}}))
    project = laptop_home / "proj"
    project.mkdir()
    (project / "train.py").write_text("print('train')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCHESTRATOR_", "SLURM_", "SCRATCH", "WORK"))}
    env.update(HOME=str(laptop_home), ORCHESTRATOR_CONFIG=str(config), LOGIN_HOME=str(login_home),
               XDG_CACHE_HOME=str(laptop_home / ".cache"), LOGIN_SCRATCH=str(tmp_path / "scratch" / "alice"))
    return {"env": env, "project": project, "config": config, "login_home": login_home, "laptop_home": laptop_home}


def _orch(laptop: dict, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=laptop["project"], env=laptop["env"],
                          capture_output=True, text=True, timeout=120)


def _spec(laptop: dict, **fields: object) -> None:
    data = {"name": "standin", "entrypoint": "train.py", "executor": "slurm", **fields}
    (laptop["project"] / "spec.yaml").write_text(yaml.safe_dump(data))


def test_plan_of_a_slurm_spec_is_the_login_nodes(laptop: dict) -> None:
    _spec(laptop, runs_dir="~/runs", checkpoint={"dir": "~/ckpt/x"})
    out = _orch(laptop, "plan", "spec.yaml")
    assert out.returncode == 0, out.stderr
    login, mine = str(laptop["login_home"]), str(laptop["laptop_home"])
    assert f"run folder: {login}/runs/standin-" in out.stdout, out.stdout
    assert f"{login}/ckpt/x" in out.stdout and sys.executable in out.stdout
    assert mine not in out.stdout, out.stdout
    # made by the laptop's client id: the checkout's name, and the id kept beside the config
    client = (laptop["config"].parent / "client-id").read_text().strip()
    projects = laptop["login_home"] / ".local" / "share" / "orchestrator" / "remote" / "projects"
    from orchestrator.remote import project_name

    assert (projects / project_name(str(laptop["project"]), client) / "train.py").is_file()
    # --local: this machine's plan, '~' this machine's home
    here = _orch(laptop, "--local", "plan", "spec.yaml")
    assert here.returncode == 0 and f"{mine}/ckpt/x" in here.stdout and login not in here.stdout, here.stderr


def test_a_relative_runs_dir_in_the_login_users_home_is_refused_with_the_sites_scratch(laptop: dict) -> None:
    _spec(laptop)  # runs_dir: the default 'runs', relative
    out = _orch(laptop, "submit", "spec.yaml")
    assert out.returncode == 1, out.stdout + out.stderr  # the login node refused it (RemoteError)
    scratch = laptop["env"]["LOGIN_SCRATCH"]
    assert re.search(r"error: runs_dir: 'runs' is relative, so runs and their checkpoints would be written under "
                     r"your home on the login node", out.stderr), out.stderr
    assert f"--set runs_dir={scratch}/orchestrator-runs" in out.stderr and "allow_runs_in_home" in out.stderr
    assert not (laptop["login_home"] / ".local" / "share" / "orchestrator" / "remote" / "projects").exists()
    # plan says the same as a warning, and still shows the plan
    planned = _orch(laptop, "plan", "spec.yaml")
    assert planned.returncode == 0 and "warning: runs_dir: 'runs' is relative" in planned.stderr, planned.stderr
