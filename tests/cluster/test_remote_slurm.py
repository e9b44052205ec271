"""``orchestrator --remote``: from the host, as from a laptop, to the deploy cluster's login node
(sshd in its own namespace, a non-root user with its own home and its own install of the
orchestrator), through an OpenSSH ControlMaster in BatchMode.

The login user cannot run this checkout's interpreter (it lives under /root), so, as a user would
on a real login node, it gets its own virtual environment with the orchestrator installed from
this tree (Debian's python3, the package's dependencies from PyPI)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROJECTS = Path("/srv/orch-test-projects")

SCRIPT = '''\
import os, pwd, sys, time
import helper
print(f"REMOTE helper={helper.V} user={pwd.getpwuid(os.getuid()).pw_name} rank={os.environ['RANK']}", flush=True)
for i in range(int(sys.argv[sys.argv.index("--lines") + 1])):
    print(f"line {i}", flush=True)
    time.sleep(float(sys.argv[sys.argv.index("--sleep") + 1]))
'''


def install_for_login(login_home: str, login_user: str) -> str:
    """The login user's own orchestrator: a venv in its home, this tree installed into it (once)."""
    def as_login(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["runuser", "-u", login_user, "--", *command], capture_output=True, text=True,
                              timeout=600, cwd="/")

    venv = Path(login_home) / "venv"
    if not (venv / "bin" / "orchestrator").exists():
        made = as_login("/usr/bin/python3", "-m", "venv", str(venv))
        assert made.returncode == 0, made.stderr
        source = Path(login_home) / "src"
        shutil.rmtree(source, ignore_errors=True)
        shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", ".git", ".pytest-tmp", ".whl", "runs",
                                                                     "__pycache__", "*.egg-info", ".hypothesis"))
        subprocess.run(["chown", "-R", login_user, str(source)], check=True)
        pip = as_login(str(venv / "bin" / "pip"), "install", "-q", "-c", str(source / ".ci" / "constraints.txt"),
                       str(source))
        assert pip.returncode == 0, pip.stdout + pip.stderr
    return str(venv / "bin" / "orchestrator")


@pytest.fixture(scope="module")
def login_install(cluster: dict[str, str]) -> str:
    return install_for_login(cluster["login_home"], cluster["login_user"])


@pytest.fixture
def remote(cluster: dict[str, str], login_install: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A user config naming the login node, a ControlPath of its own, and the master opened."""
    control = f"/tmp/orch-ctl-{uuid.uuid4().hex[:8]}-%C"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"remote": {
        "host": cluster["login_host"], "ssh": ["ssh", "-F", cluster["login_ssh_config"]], "control_path": control,
        "command": [login_install], "reconnect_s": 90,
        # the specs here use runs_dir: runs, in the login node's checkout under the login user's home (no
        # $SCRATCH on the deploy cluster): said on purpose, as a user with a roomy home would
        "allow_runs_in_home": True}}))
    env = {**os.environ, "ORCHESTRATOR_CONFIG": str(config)}
    env.pop("SLURM_CONF", None)  # the laptop has no cluster configuration
    facts = {"config": str(config), "control": control, "host": cluster["login_host"],
             "ssh_config": cluster["login_ssh_config"], "env": json.dumps(env)}
    try:
        yield facts
    finally:
        _master(facts, "-O", "exit")


def _master(remote: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ssh", "-F", remote["ssh_config"], "-o", f"ControlPath={remote['control']}", *args,
                           "--", remote["host"]], capture_output=True, text=True, timeout=60)


def _open(remote: dict[str, str]) -> None:
    """Open the master as a user does. Its output goes to a file: the backgrounded master keeps the
    streams it was given, and a pipe would make this wait until the master exits."""
    log = Path(remote["control"].replace("%C", "open.log"))
    with log.open("w") as out:
        opened = subprocess.run(["ssh", "-F", remote["ssh_config"], "-o", f"ControlPath={remote['control']}", "-M",
                                 "-o", "ControlPersist=yes", "-fN", "--", remote["host"]], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=out, timeout=60)
    assert opened.returncode == 0, log.read_text()


def _orch(remote: dict[str, str], *args: str, cwd: Path | str = "/", timeout: float = 300,
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=json.loads(remote["env"]))


@pytest.fixture
def project(cluster: dict[str, str]) -> Iterator[Path]:
    folder = PROJECTS / f"laptop-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    (folder / "train.py").write_text(SCRIPT)
    (folder / "helper.py").write_text("V = 'shipped'\n")
    (folder / "spec.yaml").write_text(yaml.safe_dump({
        "name": f"remote-{folder.name[-4:]}", "entrypoint": "train.py", "executor": "slurm", "nodes": 2,
        "cpu_ranks_per_node": 1, "runs_dir": "runs", "distributed": {"backend": "gloo"},
        "extra_args": ["--lines", "3", "--sleep", "0.2"], "slurm": {"time": "00:05:00"}}))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            PROJECTS.rmdir()  # the last one out removes the shared parent


def test_without_a_master_the_error_gives_the_ssh_command(cluster: dict[str, str], remote: dict[str, str]) -> None:
    out = _orch(remote, "status")
    assert out.returncode != 0
    assert "no SSH master connection" in out.stderr and " -M " in out.stderr and remote["host"] in out.stderr, out.stderr


def test_submit_follow_from_the_laptop_then_status_and_a_second_submit(cluster: dict[str, str], remote: dict[str, str],
                                                                      project: Path) -> None:
    _open(remote)
    out = _orch(remote, "submit", "spec.yaml", cwd=project)
    assert out.returncode == 0, out.stdout + out.stderr
    run_id = re.search(r"submitted (\S+) on ", out.stdout)[1]  # type: ignore[index]
    assert "shipped 3 file(s)" in out.stdout, out.stdout
    shutil.rmtree(project)  # the laptop's copy is not needed once submit returned
    follow = _orch(remote, "logs", "-f", run_id, "--rank", "1", timeout=300)
    assert follow.returncode == 0, follow.stderr
    assert f"REMOTE helper=shipped user={cluster['login_user']} rank=1" in follow.stdout, follow.stdout
    assert "line 2" in follow.stdout
    deadline = time.monotonic() + 120
    while True:
        shown = _orch(remote, "status", "--json", run_id)
        assert shown.returncode == 0, shown.stderr
        row = json.loads(shown.stdout)[0]
        if row["state"] in ("COMPLETED", "FAILED", "CANCELLED"):
            break
        assert time.monotonic() < deadline, row
        time.sleep(1)
    assert row["state"] == "COMPLETED", row
    assert row["run_dir"].startswith(cluster["login_home"])  # the login user's own home, not the laptop's paths


def test_a_second_submit_ships_only_what_changed_and_resumes_the_same_run(cluster: dict[str, str],
                                                                          remote: dict[str, str], project: Path) -> None:
    _open(remote)
    first = _orch(remote, "submit", "spec.yaml", "--wait", cwd=project)
    assert first.returncode == 0, first.stdout + first.stderr
    (project / "helper.py").write_text("V = 'edited'\n")
    second = _orch(remote, "submit", "spec.yaml", "--set", "slurm.time=00:06:00", "--follow", cwd=project)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "shipped 1 file(s)" in second.stdout, second.stdout
    ids = re.findall(r"submitted (\S+) on ", first.stdout + second.stdout)
    assert len(ids) == 2 and ids[0] == ids[1], ids  # an operational change: the same run
    assert "REMOTE helper=edited" in second.stdout and "COMPLETED" in second.stdout, second.stdout


def test_status_is_one_ssh_session(cluster: dict[str, str], remote: dict[str, str], tmp_path: Path) -> None:
    _open(remote)
    calls = tmp_path / "calls"
    counting = tmp_path / "ssh"
    counting.write_text(f'#!/bin/sh\ncase " $* " in *" -O "*) ;; *) echo "$*" >> {calls} ;; esac\nexec ssh "$@"\n')
    counting.chmod(0o755)
    config = yaml.safe_load(Path(remote["config"]).read_text())
    config["remote"]["ssh"][0] = str(counting)
    Path(remote["config"]).write_text(yaml.safe_dump(config))
    out = _orch(remote, "status")
    assert out.returncode == 0, out.stderr
    assert len(calls.read_text().splitlines()) == 1, calls.read_text()


def test_cancel_and_a_dropped_connection_during_a_follow(cluster: dict[str, str], remote: dict[str, str],
                                                         project: Path) -> None:
    _open(remote)
    spec = yaml.safe_load((project / "spec.yaml").read_text())
    spec["extra_args"] = ["--lines", "400", "--sleep", "0.25"]
    (project / "spec.yaml").write_text(yaml.safe_dump(spec))
    out = _orch(remote, "submit", "spec.yaml", cwd=project)
    run_id = re.search(r"submitted (\S+) on ", out.stdout)[1]  # type: ignore[index]
    follow = subprocess.Popen([sys.executable, "-m", "orchestrator", "logs", "-f", run_id], cwd="/", text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=json.loads(remote["env"]))
    lines: list[str] = []  # read by one thread from start to end (communicate() would skip what readline buffered)
    reader = threading.Thread(target=lambda: lines.extend(iter(follow.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while "line 5\n" not in lines:
            assert time.monotonic() < deadline, lines
            time.sleep(0.1)
        _master(remote, "-O", "exit")  # the connection drops
        time.sleep(3)
        _open(remote)  # the user reopens it
        time.sleep(5)
        stacks = _orch(remote, "stacks", run_id, "--rank", "0")
        assert stacks.returncode == 0 and "train.py" in stacks.stdout, stacks.stdout + stacks.stderr
        cancelled = _orch(remote, "cancel", run_id)
        assert cancelled.returncode == 0 and "CANCELLED" in cancelled.stdout, cancelled.stdout + cancelled.stderr
        follow.wait(timeout=120)
        reader.join(timeout=30)
        err = follow.stderr.read()  # type: ignore[union-attr]
    finally:
        if follow.poll() is None:
            follow.kill()
    text = "".join(lines)
    assert "dropped" in err and "reconnected" in err, err
    numbers = [int(n) for n in re.findall(r"^line (\d+)$", text, re.M)]
    assert numbers == list(range(len(numbers))) and len(numbers) > 6, numbers  # nothing repeated, nothing lost


def test_a_client_of_another_version_is_refused(cluster: dict[str, str], remote: dict[str, str],
                                                login_install: str) -> None:
    _open(remote)
    out = subprocess.run(["ssh", "-F", remote["ssh_config"], "-o", f"ControlPath={remote['control']}", "-o",
                          "BatchMode=yes", "--", remote["host"], f"{login_install} --client-version 0.0.1 status"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 3 and "0.0.1" in out.stderr and "install the same version" in out.stderr, out.stderr


CKPT_SCRIPT = '''\
import os, sys
folder = os.environ["ORCH_CHECKPOINT_DIR"]
if os.environ["RANK"] == "0":
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "written-by-rank-0"), "w") as f:
        f.write(sys.executable)
print(f"CKPT {folder}", flush=True)
'''


def test_tilde_is_the_login_users_home_plan_is_the_clusters_and_a_new_host_name_resumes(
        cluster: dict[str, str], remote: dict[str, str], project: Path, login_install: str) -> None:
    """checkpoint.dir: ~/x written on the laptop is the login user's home on the cluster (never the
    laptop's), plan shows what the cluster will run (the login node's python and paths), and a
    submission after the laptop's host name changed (macOS renames it on another network) lands in
    the same checkout, so the same run folder: the run resumes."""
    # ssh's %C hashes the local host name too: under another host name the master is another
    # socket (a user reopens it, as the error says). A path without it keeps this test to one master.
    remote["control"] = f"/tmp/orch-ctl-{uuid.uuid4().hex[:8]}-%r@%h:%p"
    config = yaml.safe_load(Path(remote["config"]).read_text())
    config["remote"]["control_path"] = remote["control"]
    Path(remote["config"]).write_text(yaml.safe_dump(config))
    _open(remote)
    folder = f"ckpt-{uuid.uuid4().hex[:8]}"
    (project / "ckpt.py").write_text(CKPT_SCRIPT)
    spec = yaml.safe_load((project / "spec.yaml").read_text())
    spec.update(entrypoint="ckpt.py", nodes=1, extra_args=[], checkpoint={"dir": f"~/{folder}"})
    (project / "spec.yaml").write_text(yaml.safe_dump(spec))
    login_home, python = cluster["login_home"], str(Path(login_install).parent / "python")  # python or python3
    planned = _orch(remote, "plan", "spec.yaml", cwd=project)  # remote.host is set and the spec is SLURM's
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert f"{login_home}/{folder}" in planned.stdout and python in planned.stdout, planned.stdout
    assert str(Path.home()) + "/" not in planned.stdout.replace(login_home, ""), planned.stdout
    first = _orch(remote, "submit", "spec.yaml", "--wait", cwd=project)
    assert first.returncode == 0, first.stdout + first.stderr
    written = Path(login_home) / folder / "written-by-rank-0"
    assert written.read_text().startswith(login_home), written  # written by the cluster's python, there
    assert written.stat().st_uid != 0 and not (Path.home() / folder).exists()
    # the same laptop on another network: another host name, the same client id
    renamed = subprocess.run(["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                              f"laptop-elsewhere-{uuid.uuid4().hex[:6]}", sys.executable, "-m", "orchestrator",
                              "submit", "spec.yaml", "--wait"], cwd=project, capture_output=True, text=True,
                             timeout=300, env=json.loads(remote["env"]))
    assert renamed.returncode == 0, renamed.stdout + renamed.stderr
    folders = re.findall(r"; run folder (\S+) \(shipped", first.stdout + renamed.stdout)
    assert len(folders) == 2 and folders[0] == folders[1], folders
