"""``orchestrator --remote HOST`` from a Mac, without a Mac: the laptop's CLI runs under the macOS
stand-in of ``macos_standin.py`` (Linux-only names gone, no prctl, the platform decided as macOS)
with /proc hidden in a private mount namespace; ssh is a stand-in that runs the login node's
command here, as a Linux login node (its own HOME, no stand-in), through the same
``remote-receive`` protocol a real login node speaks (``tests/cluster/test_remote_slurm.py`` does
it through real ssh and SLURM).

What the laptop side does is all exercised: the settings and the client id kept beside the
config, the ControlMaster check, the code snapshot scanned and its index written in the laptop's
cache, the manifest and only the missing files shipped, '~' in path fields kept for the cluster,
the folder the user is in carried over, and the answer printed. The login node's ``submit``
is a stand-in too (no SLURM here): it records the spec it was given, validated there, and the
folder it was called from, and answers as ``api.submit`` does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.macos_standin import hidden_proc_argv, proc_can_be_hidden, shim_dir, standin_env

pytestmark = pytest.mark.skipif(proc_can_be_hidden() is not None, reason=str(proc_can_be_hidden()))

#: ssh's stand-in: '-O check' finds the master up; a command runs as the login user's shell would
#: run it, on Linux (the laptop's stand-in taken off the import path).
FAKE_SSH = """#!/bin/sh
case " $* " in *" -O "*) exit 0 ;; esac
for word; do last=$word; done
echo "$last" >> "$LOGIN_HOME/../ssh-commands.txt"
cd "$LOGIN_HOME" || exit 255
exec env -u ORCHESTRATOR_HOME -u ORCHESTRATOR_CONFIG -u PYTHONPATH -u XDG_CACHE_HOME HOME="$LOGIN_HOME" sh -c "$last"
"""

#: The login node's orchestrator, with SLURM's submission stood in for: it records what it was
#: asked to submit (the spec as validated there, the folder it runs in) and answers as api.submit.
LOGIN_CLI = """
import json, os, sys
from types import SimpleNamespace

import orchestrator.api


def submit(spec, executor="slurm", on_plan=None):
    with open(os.environ["LOGIN_RECORD"], "a") as out:
        out.write(json.dumps({"cwd": os.getcwd(), "executor": executor, "spec": spec.model_dump(mode="json")}) + "\\n")
    run_dir = os.path.join(str(spec.runs_dir), "standin-0001")
    return SimpleNamespace(id="standin-0001", job_ids=["4242"], run_dir=run_dir)


orchestrator.api.submit = submit
from orchestrator.cli import main

sys.exit(main())
"""


@pytest.fixture
def mac(tmp_path: Path) -> dict:
    """A Mac (its home, its config naming the login node, a project) and a login node."""
    laptop_home, login_home = tmp_path / "Users" / "alice", tmp_path / "login-home"
    laptop_home.mkdir(parents=True)
    login_home.mkdir()
    ssh = tmp_path / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    login_cli = tmp_path / "login_cli.py"
    login_cli.write_text(LOGIN_CLI)
    config = laptop_home / ".config" / "orchestrator" / "config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(yaml.safe_dump({"remote": {"host": "login", "ssh": [str(ssh)],
                                                 "command": [sys.executable, str(login_cli)]}}))
    project = laptop_home / "proj"
    (project / "model").mkdir(parents=True)
    (project / "train.py").write_text("print('train')\n")
    (project / "model" / "__init__.py").write_text("WIDTH = 4\n")
    (project / "conf.yaml").write_text("lr: 0.1\n")
    (project / "weights.bin").write_bytes(b"\0" * 4096)  # not code: never shipped
    (project / "data").symlink_to(tmp_path)  # leads out of the project: not code, never shipped
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ORCHESTRATOR_", "SLURM_", "SCRATCH", "WORK"))}
    base.update(GIT_CEILING_DIRECTORIES=str(tmp_path), HOME=str(laptop_home), ORCHESTRATOR_CONFIG=str(config),
                LOGIN_HOME=str(login_home),
                XDG_CACHE_HOME=str(laptop_home / "Library" / "Caches"), LOGIN_RECORD=str(tmp_path / "submitted.jsonl"))
    env = standin_env(shim_dir(tmp_path / "shim"), base)
    return {"env": env, "project": project, "config": config, "login_home": login_home, "laptop_home": laptop_home,
            "record": tmp_path / "submitted.jsonl", "tmp": tmp_path}


def _orch(mac: dict, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(hidden_proc_argv([sys.executable, "-m", "orchestrator", *args]), cwd=cwd or mac["project"],
                         env=mac["env"], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in out.stdout + out.stderr, out.stderr
    return out


def _spec(folder: Path, **fields: object) -> Path:
    data = {"name": "macjob", "entrypoint": "train.py", "executor": "slurm", "runs_dir": "~/runs",
            "checkpoint": {"dir": "~/ckpt/x"}, **fields}
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _submitted(mac: dict) -> list[dict]:
    return [json.loads(line) for line in mac["record"].read_text().splitlines()]


def _checkout(mac: dict) -> Path:
    projects = mac["login_home"] / ".local" / "share" / "orchestrator" / "remote" / "projects"
    found = [p for p in projects.iterdir() if not p.name.startswith(".")]
    assert len(found) == 1, found
    return found[0]


def test_the_standin_is_a_mac_without_proc(mac: dict) -> None:
    """The laptop's interpreter really is the stand-in (so the tests below prove something)."""
    probe = ("import os, signal, sys; from orchestrator import platform_caps; "
             "print(platform_caps.system(), hasattr(signal, 'SIGRTMIN'), hasattr(os, 'sched_getaffinity'), "
             "os.path.exists('/proc/self/stat'))")
    out = subprocess.run(hidden_proc_argv([sys.executable, "-c", probe]), env=mac["env"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["darwin", "False", "False", "False"], out.stdout


def test_submit_from_a_mac_ships_the_snapshot_with_the_clusters_paths(mac: dict) -> None:
    _spec(mac["project"])
    out = _orch(mac, "submit", "spec.yaml")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("submitted standin-0001 on login: job(s) 4242; run folder "), out.stdout
    assert "(shipped 4 file(s)" in out.stdout, out.stdout  # train.py, model/__init__.py, conf.yaml, spec.yaml
    # the login node got the code (and only the code), byte for byte
    checkout = _checkout(mac)
    shipped = sorted(p.relative_to(checkout).as_posix() for p in checkout.rglob("*") if p.is_file()
                     and p.name != ".orchestrator-shipped.json")
    assert shipped == ["conf.yaml", "model/__init__.py", "spec.yaml", "train.py"], shipped
    assert (checkout / "model" / "__init__.py").read_text() == "WIDTH = 4\n"
    # the spec means the cluster's paths: '~' arrives as written (never /Users/alice), the login
    # user's home there (test_plan_from_a_mac_is_the_login_nodes shows it expanded)
    (done,) = _submitted(mac)
    assert done["executor"] == "slurm" and done["cwd"] == str(checkout)
    assert done["spec"]["runs_dir"] == "~/runs" and done["spec"]["checkpoint"]["dir"] == f"{mac['login_home']}/ckpt/x"
    assert str(mac["laptop_home"]) not in json.dumps(done), done
    # the laptop kept its client id beside its config, and its scan index in its own cache
    client = (mac["config"].parent / "client-id").read_text().strip()
    from orchestrator.remote import project_name

    assert checkout.name == project_name(str(mac["project"]), client)
    assert list((mac["laptop_home"] / "Library" / "Caches" / "orchestrator" / "ship").rglob("index/*.json"))
    # the session ran through the master, BatchMode, the remote words quoted
    commands = (mac["tmp"] / "ssh-commands.txt").read_text().splitlines()
    assert commands[-1].endswith(f"login_cli.py --client-version {_version()} remote-receive"), commands


def test_a_second_submit_ships_only_what_changed_to_the_same_checkout(mac: dict) -> None:
    _spec(mac["project"])
    assert _orch(mac, "submit", "spec.yaml").returncode == 0
    (mac["project"] / "model" / "__init__.py").write_text("WIDTH = 8\n")
    (mac["project"] / "conf.yaml").unlink()
    again = _orch(mac, "submit", "spec.yaml")
    assert again.returncode == 0, again.stderr
    assert "(shipped 1 file(s), 10 bytes)" in again.stdout, again.stdout
    checkout = _checkout(mac)
    assert (checkout / "model" / "__init__.py").read_text() == "WIDTH = 8\n" and not (checkout / "conf.yaml").exists()
    assert [d["cwd"] for d in _submitted(mac)] == [str(checkout)] * 2


def test_submit_from_a_subfolder_reached_through_a_link(mac: dict) -> None:
    """macOS's /tmp and /var are links to /private/...: the folder the user is in, the spec's path
    and an absolute entrypoint may each be spelled through a link, and must still name the
    same place in the login node's checkout."""
    linked = mac["tmp"] / "linked-proj"
    linked.symlink_to(mac["project"])
    (mac["project"] / "conf").mkdir()
    spec = _spec(mac["project"] / "conf", entrypoint=str(linked / "train.py"))
    out = _orch(mac, "submit", str(linked / "conf" / spec.name), cwd=linked / "conf")
    assert out.returncode == 0, out.stderr
    (done,) = _submitted(mac)
    checkout = _checkout(mac)
    assert done["cwd"] == str(checkout / "conf")
    assert done["spec"]["entrypoint"] == "../train.py", done["spec"]


def test_plan_from_a_mac_is_the_login_nodes(mac: dict) -> None:
    """``plan`` of a SLURM spec, with remote.host set: made on the login node (its interpreter, its
    home for '~'), shown here; nothing submitted."""
    (mac["config"]).write_text(yaml.safe_dump({"remote": {**yaml.safe_load(mac["config"].read_text())["remote"],
                                                          "command": [sys.executable, "-m", "orchestrator"]}}))
    _spec(mac["project"])
    out = _orch(mac, "plan", "spec.yaml")
    assert out.returncode == 0, out.stderr
    login, mine = str(mac["login_home"]), str(mac["laptop_home"])
    assert f"run folder: {login}/runs/macjob-" in out.stdout and f"{login}/ckpt/x" in out.stdout, out.stdout
    assert mine not in out.stdout
    assert not mac["record"].exists()


def test_status_and_cancel_reach_the_login_node(mac: dict) -> None:
    """The commands that only forward their words: the same session, the login node's answer."""
    out = _orch(mac, "status", "nosuchrun")
    assert out.returncode != 0 and "nosuchrun" in out.stderr, out.stdout + out.stderr
    commands = (mac["tmp"] / "ssh-commands.txt").read_text().splitlines()
    assert commands[-1].endswith("status nosuchrun"), commands


def _version() -> str:
    from orchestrator import __version__

    return __version__
