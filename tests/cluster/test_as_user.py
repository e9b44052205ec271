"""The site profile as the users who run it: an ordinary user (deploy's --login user, with its own
orchestrator in its home) submits a 2-node job on the rank API's heartbeats, with the health gate
inside the ranks' step, kills one of its ranks with ``orchestrator chaos``, and the job restarts
inside its allocation and completes, while a second user (a stranger on the same nodes) has taken
the name of the first user's node-local folder and planted links in it: nothing is written
through them, nothing of the stranger's is used or removed, and the refused folder is named."""

from __future__ import annotations

import json
import pwd
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from orchestrator.core.recovery import History

from .test_remote_slurm import install_for_login

SCRIPT = Path(__file__).parent / "scripts" / "user_heartbeats.py"
STRANGER = "orch-stranger"


@pytest.fixture(scope="module")
def login_install(cluster: dict[str, str]) -> str:
    return install_for_login(cluster["login_home"], cluster["login_user"])


def _as(user: str, *command: str, cwd: Path | str = "/", timeout: float = 300,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    runuser = shutil.which("runuser") or "/usr/sbin/runuser"
    return subprocess.run([runuser, "-u", user, "--", *command], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=env)


def _stranger() -> str:
    try:
        pwd.getpwnam(STRANGER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", STRANGER],
                       capture_output=True, timeout=30)
        pwd.getpwnam(STRANGER)
    return STRANGER


def test_an_ordinary_user_recovers_with_chaos_and_a_stranger_takes_nothing_over(
        cluster: dict[str, str], login_install: str) -> None:
    user, home = cluster["login_user"], Path(cluster["login_home"])
    uid = pwd.getpwnam(user).pw_uid
    project = home / f"as-user-{uuid.uuid4().hex[:8]}"
    (project / "out").mkdir(parents=True)
    shutil.copy(SCRIPT, project / "train.py")
    (project / "spec.yaml").write_text(yaml.safe_dump({
        "name": "as-user", "entrypoint": "train.py", "executor": "slurm", "nodes": 2, "cpu_ranks_per_node": 2,
        "extra_args": [str(project / "out"), "40"], "runs_dir": str(project / "runs"),
        "recovery": {"max_restarts": 2}, "slurm": {"partition": "debug", "time": "00:05:00"}}))
    subprocess.run(["chown", "-R", user, str(project)], check=True)
    # The stranger takes the name of the user's node-local folder (every node here shares the
    # host's /dev/shm), open to everyone, with a link inside to a file of the user's.
    victim = project / "out" / "victim"
    victim.write_text("mine")
    subprocess.run(["chown", user, str(victim)], check=True)
    victim.chmod(0o600)
    squat = Path("/dev/shm") / f"orch-u{uid}"
    shutil.rmtree(squat, ignore_errors=True)  # the user's own, from an earlier test: the stranger comes first
    stranger = _stranger()
    made = _as(stranger, "/usr/bin/python3", "-c",
               f"import os; os.mkdir({str(squat)!r}); os.chmod({str(squat)!r}, 0o777); "
               f"os.symlink({str(victim)!r}, {str(squat / 'planted')!r})")
    assert made.returncode == 0, made.stderr
    env = {"PATH": "/usr/bin:/bin", "SLURM_CONF": cluster["SLURM_CONF"], "HOME": str(home), "LANG": "C.UTF-8"}
    orchestrator = login_install
    try:
        submitted = _as(user, orchestrator, "submit", "spec.yaml", cwd=project, env=env)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        run_dir = next((project / "runs").glob("*/record.json")).parent
        deadline = time.monotonic() + 180
        while not (project / "out" / "snapshot-1.json").exists() or \
                json.loads((project / "out" / "snapshot-1.json").read_text())["step"] < 5:
            assert time.monotonic() < deadline, "the job never reached step 5"
            time.sleep(0.3)
        chaos = _as(user, orchestrator, "chaos", str(run_dir), "--kill-rank", "1", cwd=project, env=env)
        assert chaos.returncode == 0, chaos.stdout + chaos.stderr
        deadline = time.monotonic() + 300
        while True:
            shown = _as(user, orchestrator, "status", "--json", str(run_dir), cwd=project, env=env)
            assert shown.returncode == 0, shown.stderr
            state = json.loads(shown.stdout)
            state = state[0] if isinstance(state, list) else state
            if state.get("state") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED"):
                break
            assert time.monotonic() < deadline, shown.stdout
            time.sleep(1)
        logs = "".join(p.read_text(errors="replace") for p in run_dir.rglob("*") if p.is_file() and
                       p.suffix in (".log", ".out", ".err", ""))
        assert state["state"] == "COMPLETED", (state, logs[-4000:])
        attempts = History.load(run_dir).attempts
        assert [(a.outcome, a.action) for a in attempts] == [("crash", "restart"), ("completed", "")], attempts
        assert attempts[0].inside_job, attempts[0]
        # Nothing through the stranger's link, nothing of the stranger's used or removed, and said.
        assert victim.read_text() == "mine"
        assert sorted(p.name for p in squat.iterdir()) == ["planted"] and squat.stat().st_uid != uid
        assert f"not using {squat}" in logs, logs[-3000:]
        # The heartbeats went through the user's own private folder (the next candidate) or the run folder.
        from orchestrator.core.progress import read_progress

        assert [r.step if r else None for r in read_progress(run_dir, 4)] == [40] * 4
    finally:
        shutil.rmtree(squat, ignore_errors=True)
