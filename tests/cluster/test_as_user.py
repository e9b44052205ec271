"""The site profile as the users who run it. An ordinary user (deploy's --login user, with its own
orchestrator in its home, a torch-free script on the rank API's heartbeats) submits, and:

- kills one of its ranks with ``orchestrator chaos``: the job restarts inside its allocation (the
  health gate inside the ranks' step) and completes, while a second user (a stranger on the same
  nodes) has taken the name of the first user's node-local folder and planted a link in it:
  nothing is written through it, nothing of the stranger's is used or removed, the folder is named;
- hangs a rank whose node's step daemon stops answering: the agent's last resort kills the step,
  never the job, and the hang restarts on the spare (not CANCELLED);
- is preempted under PreemptMode=CANCEL: SLURM ends the job PREEMPTED and nothing requeues it.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from orchestrator.core.recovery import History

from .conftest import CPUS
from .test_remote_slurm import install_for_login

SCRIPT = Path(__file__).parent / "scripts" / "user_heartbeats.py"
STRANGER = "orch-stranger"
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY")


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


class LoginUser:
    """One project of the login user's in its home, and its orchestrator run as that user."""

    def __init__(self, cluster: dict[str, str], orchestrator: str, name: str, spec: dict[str, Any],
                 args: list[str]) -> None:
        self.user, home = cluster["login_user"], Path(cluster["login_home"])
        self.uid = pwd.getpwnam(self.user).pw_uid
        self.orchestrator = orchestrator
        self.project = home / f"{name}-{uuid.uuid4().hex[:8]}"
        self.out = self.project / "out"
        self.out.mkdir(parents=True)
        shutil.copy(SCRIPT, self.project / "train.py")
        (self.project / "spec.yaml").write_text(yaml.safe_dump({
            "name": name, "entrypoint": "train.py", "executor": "slurm", "extra_args": [str(self.out), *args],
            "runs_dir": str(self.project / "runs"), **spec}))
        subprocess.run(["chown", "-R", self.user, str(self.project)], check=True)
        self.env = {"PATH": "/usr/bin:/bin", "SLURM_CONF": cluster["SLURM_CONF"], "HOME": str(home),
                    "LANG": "C.UTF-8"}
        self.run_dir = Path()

    def orch(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return _as(self.user, self.orchestrator, *args, cwd=self.project, env=self.env, timeout=timeout)

    def submit(self) -> Path:
        out = self.orch("submit", "spec.yaml")
        assert out.returncode == 0, out.stdout + out.stderr
        self.run_dir = next((self.project / "runs").glob("*/record.json")).parent
        return self.run_dir

    def step(self, rank: int) -> int:
        try:
            return int(json.loads((self.out / f"snapshot-{rank}.json").read_text())["step"])
        except (OSError, ValueError, KeyError):
            return 0

    def wait_step(self, rank: int, step: int, within: float = 180) -> None:
        deadline = time.monotonic() + within
        while self.step(rank) < step:
            assert time.monotonic() < deadline, f"rank {rank} never reached step {step}:\n{self.logs()[-3000:]}"
            time.sleep(0.3)

    def state(self) -> dict[str, Any]:
        shown = self.orch("status", "--json", str(self.run_dir))
        assert shown.returncode == 0, shown.stderr
        data = json.loads(shown.stdout)
        return data[0] if isinstance(data, list) else data

    def wait_end(self, within: float = 300) -> dict[str, Any]:
        deadline = time.monotonic() + within
        while (state := self.state())["state"] not in ENDED:
            assert time.monotonic() < deadline, (state, self.logs()[-3000:])
            time.sleep(1)
        return state

    def logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.run_dir.rglob("*"))
                       if p.is_file() and p.suffix in (".log", ".out", ".err", ""))


def test_an_ordinary_user_recovers_with_chaos_and_a_stranger_takes_nothing_over(
        cluster: dict[str, str], login_install: str) -> None:
    me = LoginUser(cluster, login_install, "as-user", {"nodes": 2, "cpu_ranks_per_node": 2,
                   "recovery": {"max_restarts": 2}, "slurm": {"partition": "debug", "time": "00:05:00"}}, ["40"])
    # The stranger takes the name of the user's node-local folder (every node here shares the
    # host's /dev/shm), open to everyone, with a link inside to a file of the user's.
    victim = me.out / "victim"
    victim.write_text("mine")
    subprocess.run(["chown", me.user, str(victim)], check=True)
    victim.chmod(0o600)
    squat = Path("/dev/shm") / f"orch-u{me.uid}"
    shutil.rmtree(squat, ignore_errors=True)  # the user's own, from an earlier test: the stranger comes first
    made = _as(_stranger(), "/usr/bin/python3", "-c",
               f"import os; os.mkdir({str(squat)!r}); os.chmod({str(squat)!r}, 0o777); "
               f"os.symlink({str(victim)!r}, {str(squat / 'planted')!r})")
    assert made.returncode == 0, made.stderr
    try:
        me.submit()
        me.wait_step(1, 5)
        chaos = me.orch("chaos", str(me.run_dir), "--kill-rank", "1")
        assert chaos.returncode == 0, chaos.stdout + chaos.stderr
        state = me.wait_end()
        logs = me.logs()
        assert state["state"] == "COMPLETED", (state, logs[-4000:])
        attempts = History.load(me.run_dir).attempts
        assert [(a.outcome, a.action) for a in attempts] == [("crash", "restart"), ("completed", "")], attempts
        assert attempts[0].inside_job, attempts[0]
        # Nothing through the stranger's link, nothing of the stranger's used or removed, and said.
        assert victim.read_text() == "mine"
        assert sorted(p.name for p in squat.iterdir()) == ["planted"] and squat.stat().st_uid != me.uid
        assert f"not using {squat}" in logs, logs[-3000:]
        # The heartbeats went through the user's own private folder (the next candidate) or the run folder.
        from orchestrator.core.progress import read_progress

        assert [r.step if r else None for r in read_progress(me.run_dir, 4)] == [40] * 4
    finally:
        shutil.rmtree(squat, ignore_errors=True)


def _step_daemons(job: str) -> list[int]:
    """The slurmstepd processes of the job's numbered steps that SLURM lists now (the ranks')."""
    listed = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"], capture_output=True, text=True).stdout
    pids = []
    for step in (s for s in listed.split() if s.partition(".")[2].isdigit()):
        found = subprocess.run(["pgrep", "-f", f"slurmstepd: \\[{step}\\]"], capture_output=True, text=True).stdout
        pids += [int(p) for p in found.split()]
    return pids


def test_a_step_that_cannot_end_is_killed_as_a_step_and_the_hang_restarts_on_the_spare(
        cluster: dict[str, str], login_install: str) -> None:
    """The last rank hangs (the others wait for it at the script's barrier) and its node's step
    daemon stops answering (SIGSTOP, as on a node whose slurmd is gone): srun cannot end the step
    within 5 s of SIGTERM. The agent's last resort signals the job's steps (``scancel
    --signal=KILL JOB.STEP``), never the job: not CANCELLED; the hang restarts inside the
    allocation on the spare, and the job completes. (The script never joins a process group; its
    heartbeats put every rank past its start, so the hang is stall_s's to find, issue 51.)"""
    me = LoginUser(cluster, login_install, "as-user-stuck", {
        "nodes": 1, "cpu_ranks_per_node": 2, "distributed": {"init_timeout_s": 15}, "watchdog": {"stall_s": 10},
        "recovery": {"max_restarts": 1, "on": ["hang"], "spares": 1},
        "slurm": {"partition": "debug", "time": "00:05:00"}}, ["12", "4"])
    me.submit()
    deadline = time.monotonic() + 180
    while not (me.out / "hung-once").exists():
        assert time.monotonic() < deadline, me.logs()[-3000:]
        time.sleep(0.3)
    job = json.loads((me.run_dir / "record.json").read_text())["job_ids"][0]
    frozen = _step_daemons(job)
    assert frozen, "no step daemon of the ranks' step found"
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 180
        while len(History.load(me.run_dir).attempts) < 2:  # the restart began: the old step may go
            assert me.state()["state"] not in ENDED, me.logs()[-4000:]
            assert time.monotonic() < deadline, me.logs()[-4000:]
            time.sleep(0.5)
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    state = me.wait_end()
    logs = me.logs()
    assert state["state"] == "COMPLETED", (state, logs[-4000:])
    assert re.search(rf"SIGKILL to step\(s\) {job}\.\d+", logs), logs[-3000:]
    first, second = History.load(me.run_dir).attempts
    assert (first.outcome, first.action, first.inside_job) == ("hang", "restart", True), first
    assert second.nodes != first.nodes, (first, second)


@pytest.fixture
def debug_cancels() -> Iterator[None]:
    """debug's PreemptMode CANCEL for one test, put back to the profile's REQUEUE after it."""
    subprocess.run(["scontrol", "update", "PartitionName=debug", "PreemptMode=CANCEL"], check=True)
    try:
        yield
    finally:
        subprocess.run(["scontrol", "update", "PartitionName=debug", "PreemptMode=REQUEUE"], check=True)


def test_under_preempt_mode_cancel_the_site_ends_the_users_job_and_nothing_requeues_it(
        cluster: dict[str, str], login_install: str, debug_cancels: None) -> None:
    """A script without the rank API's checkpoint, under slurm.requeue: always (the case where the
    agent would requeue after any stop): preempted where the site cancels, it is not requeued."""
    me = LoginUser(cluster, login_install, "as-user-preempted", {
        "nodes": 2, "cpu_ranks_per_node": 1, "slurm": {"partition": "debug", "time": "00:05:00",
                                                        "requeue": "always", "max_requeues": 3}}, ["400"])
    me.submit()
    me.wait_step(0, 5)
    job = json.loads((me.run_dir / "record.json").read_text())["job_ids"][0]
    high = subprocess.run(["sbatch", "--parsable", "-p", "high", "-N2", f"--ntasks-per-node={CPUS}", "-t", "2",
                           "-o", "/dev/null", "--wrap", "srun true"], capture_output=True, text=True, check=True)
    try:
        state = me.wait_end()
        assert state["state"] == "PREEMPTED", (state, me.logs()[-3000:])
        assert "Restarts=0 " in subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True,
                                               text=True).stdout
        attempts = History.load(me.run_dir).attempts
        assert len(attempts) == 1 and attempts[0].outcome == "preempted", attempts
        assert "PreemptMode=CANCEL" in attempts[0].why and "not requeued" in attempts[0].why, attempts[0]
    finally:
        subprocess.run(["scancel", high.stdout.strip().split(";")[0]], capture_output=True)
