"""The login node (deploy/cluster.sh up --login): SLURM from the host over SSH as a non-root user,
as from a laptop: the generated ssh_config, BatchMode, and a ControlMaster opened once."""

from __future__ import annotations

import hmac
import os
import struct
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.cluster.conftest import CLUSTER_DIR, ROOT, UP_ARGS

# Job states after which a job no longer changes (sacct's State column, first word).
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE"}


def ssh(cluster: dict[str, str], command: str, *options: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run COMMAND on the login node as the login user, never prompting (BatchMode)."""
    return subprocess.run(["ssh", "-F", cluster["login_ssh_config"], "-o", "BatchMode=yes", *options,
                           cluster["login_host"], command],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


def job_state(cluster: dict[str, str], job_id: str) -> str:
    """The job's state as sacct on the login node reports it ('' while accounting has no record yet)."""
    out = ssh(cluster, f"sacct -n -X -P -j {job_id} -o State")
    assert out.returncode == 0, out.stderr
    return out.stdout.split()[0] if out.stdout.split() else ""


def wait_final(cluster: dict[str, str], job_id: str, timeout: float = 120) -> str:
    """Poll squeue, then sacct, over SSH until the job has ended; fail after TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while True:
        queued = ssh(cluster, f"squeue -h -j {job_id} -o %T")
        state = job_state(cluster, job_id)
        if state in FINAL or state.startswith("CANCELLED"):
            return state
        assert time.monotonic() < deadline, f"job {job_id} did not end in {timeout} s: squeue {queued.stdout!r}, " \
                                            f"sacct {state!r}"
        time.sleep(0.5)


def submit(cluster: dict[str, str], args: str) -> str:
    out = ssh(cluster, f"cd && sbatch --parsable {args}")
    assert out.returncode == 0, f"sbatch on the login node failed: {out.stderr}"
    return out.stdout.strip().split(";")[0]


def test_sshd_is_the_login_nodes_own(cluster: dict[str, str]) -> None:
    """The login node's sshd runs in its namespace, from its own config (never the host's /etc/ssh)."""
    pid = (CLUSTER_DIR / "login" / "sshd.pid").read_text().strip()
    # sshd rewrites its title ("sshd: /usr/sbin/sshd -f ... [listener] ..."): look for the words.
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert f"/usr/sbin/sshd -f {CLUSTER_DIR / 'login' / 'sshd_config'} " in cmdline, cmdline
    ns = subprocess.run(["ip", "netns", "identify", pid], capture_output=True, text=True, timeout=30)
    assert ns.stdout.strip() == "orch-login"


def test_sinfo_over_ssh(cluster: dict[str, str]) -> None:
    out = ssh(cluster, "hostname; id -un; echo $SLURM_CONF; sinfo -h -N -o %N")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[:3] == ["login", cluster["login_user"], cluster["SLURM_CONF"]], out.stdout
    assert {"node1", "node2"} <= set(lines[3:]), out.stdout


def test_job_from_the_login_node_runs_as_the_login_user(cluster: dict[str, str]) -> None:
    """sbatch on the login node: the job runs on a compute node as the login user, writes its output
    to the user's (shared) home, and sacct on the login node knows it."""
    job_id = submit(cluster, "-N1 -n1 -t 2 -o login-test-%j.out --wrap 'hostname; id -un'")
    try:
        assert wait_final(cluster, job_id) == "COMPLETED"
        out = ssh(cluster, f"cat ~/login-test-{job_id}.out")
        assert out.returncode == 0, out.stderr
        host, name = out.stdout.split()
        assert host in ("node1", "node2") and name == cluster["login_user"], out.stdout
        assert Path(cluster["login_home"], f"login-test-{job_id}.out").exists()
        # SLURM 22.05 records a user's first job without an association as uid 0 (User root)
        # until about a second after it ends, then the real user: wait for that, bounded.
        deadline = time.monotonic() + 30
        while (row := ssh(cluster, f"sacct -n -X -P -j {job_id} -o User,NodeList").stdout.strip()) != \
                f"{cluster['login_user']}|{host}":
            assert time.monotonic() < deadline, f"sacct does not record job {job_id} as {cluster['login_user']}: {row}"
            time.sleep(0.5)
    finally:
        ssh(cluster, f"scancel {job_id}; rm -f ~/login-test-{job_id}.out")


def test_scancel_from_the_login_node(cluster: dict[str, str]) -> None:
    job_id = submit(cluster, "-N1 -n1 -t 2 -o /dev/null --wrap 'sleep 300'")
    try:
        deadline = time.monotonic() + 60
        while (state := ssh(cluster, f"squeue -h -j {job_id} -o %T").stdout.strip()) != "RUNNING":
            assert time.monotonic() < deadline, f"job {job_id} did not start: {state!r}"
            time.sleep(0.5)
        cancel = ssh(cluster, f"scancel {job_id}")
        assert cancel.returncode == 0, cancel.stderr
        assert wait_final(cluster, job_id).startswith("CANCELLED")
    finally:
        ssh(cluster, f"scancel {job_id}")


@pytest.fixture
def control_socket() -> Iterator[Path]:
    """A short path for a ControlMaster socket (a unix socket's path is at most 107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="orch-cm-", dir="/tmp") as d:
        yield Path(d) / "s"


def test_control_master_serves_batch_mode_commands(cluster: dict[str, str], control_socket: Path) -> None:
    """One authenticated master connection; later BatchMode commands ride on it without
    authenticating again (here they offer no key at all), as --remote will use it."""
    base = ["ssh", "-F", cluster["login_ssh_config"], "-S", str(control_socket)]
    host = cluster["login_host"]
    with tempfile.TemporaryFile() as err:
        # -f: ssh goes to the background once authenticated, keeping any pipes it was given open,
        # so it gets none (a capture would wait for the master to exit).
        master = subprocess.run([*base, "-M", "-fN", host], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, timeout=60)
        err.seek(0)
        assert master.returncode == 0, err.read().decode(errors="replace")
    try:
        check = subprocess.run([*base, "-O", "check", host], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0 and "Master running" in check.stderr, check.stderr
        for _ in range(3):
            out = subprocess.run([*base, "-o", "BatchMode=yes", "-o", "PubkeyAuthentication=no", host,
                                  "squeue -h -o %i >/dev/null && hostname"],
                                 stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            assert out.stdout.strip() == "login"
        # The same command without the master is refused: it had to go through it.
        alone = ssh(cluster, "true", "-o", "PubkeyAuthentication=no")
        assert alone.returncode == 255 and "Permission denied" in alone.stderr, alone.stderr
    finally:
        subprocess.run([*base, "-O", "exit", host], capture_output=True, timeout=30)
    deadline = time.monotonic() + 10
    while control_socket.exists():
        assert time.monotonic() < deadline, "the master did not remove its socket after -O exit"
        time.sleep(0.1)


def test_password_and_root_logins_are_refused(cluster: dict[str, str]) -> None:
    """Keys only: the server offers no password or keyboard-interactive method, and root is refused
    even with the authorized key."""
    password = ssh(cluster, "true", "-o", "PubkeyAuthentication=no",
                   "-o", "PreferredAuthentications=password,keyboard-interactive")
    assert password.returncode == 255
    # The parenthesis lists the methods the server still accepts.
    assert "Permission denied (publickey)." in password.stderr, password.stderr
    root = ssh(cluster, "true", "-l", "root")
    assert root.returncode == 255 and "Permission denied" in root.stderr, root.stderr


def totp(secret_hex: str, steps_ahead: int = 0) -> str:
    """RFC 6238's code (SHA-1, 30 s, 6 digits), as an authenticator app shows it."""
    counter = int(time.time() // 30) + steps_ahead
    mac = hmac.new(bytes.fromhex(secret_hex), struct.pack(">Q", counter), "sha1").digest()
    offset = mac[-1] & 0x0F
    return f"{(struct.unpack('>I', mac[offset:offset + 4])[0] & 0x7FFFFFFF) % 10**6:06d}"


def answer_with(path: Path, code: str) -> dict[str, str]:
    """An environment in which ssh reads the keyboard-interactive answer from an askpass program."""
    path.write_text(f"#!/bin/sh\necho {code}\n")
    path.chmod(0o755)
    return {**os.environ, "SSH_ASKPASS": str(path), "SSH_ASKPASS_REQUIRE": "force"}


def test_totp_second_factor_then_batch_mode_through_the_master(cluster: dict[str, str], control_socket: Path,
                                                                 tmp_path: Path) -> None:
    """up --login --login-totp: the key alone is refused, a wrong code too; a master opened with the
    key and the current code carries BatchMode commands; the same code is not taken twice. Then
    `up --login` turns the second factor off again for the other tests."""
    script = str(ROOT / "deploy" / "cluster.sh")
    on = subprocess.run(["bash", script, *UP_ARGS, "--login-totp"], capture_output=True, text=True, timeout=600)
    assert on.returncode == 0, on.stderr
    base = ["ssh", "-F", cluster["login_ssh_config"], "-S", str(control_socket)]
    host = cluster["login_host"]
    secret = (CLUSTER_DIR / "login" / "totp_secret").read_text().strip()
    try:
        key_only = ssh(cluster, "true")
        assert key_only.returncode == 255 and "Permission denied (keyboard-interactive)" in key_only.stderr, \
            key_only.stderr
        # Ten steps ahead: outside pam_oath's window (2 steps), so it is wrong, not replayed.
        wrong = subprocess.run(["ssh", "-F", cluster["login_ssh_config"], host, "true"], stdin=subprocess.DEVNULL,
                               env=answer_with(tmp_path / "wrong", totp(secret, 10)), capture_output=True, text=True,
                               timeout=60)
        assert wrong.returncode == 255 and "Permission denied" in wrong.stderr, wrong.stderr
        env = answer_with(tmp_path / "askpass", totp(secret))
        with tempfile.TemporaryFile() as err:
            master = subprocess.run([*base, "-M", "-fN", host], env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=err, timeout=60)
            err.seek(0)
            assert master.returncode == 0, err.read().decode(errors="replace")
        out = subprocess.run([*base, "-o", "BatchMode=yes", host, "sinfo -h -o %P"], stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "debug" in out.stdout, out.stderr
        replay = subprocess.run(["ssh", "-F", cluster["login_ssh_config"], host, "true"], stdin=subprocess.DEVNULL,
                                env=env, capture_output=True, text=True, timeout=60)
        assert replay.returncode == 255, "pam_oath took the same code twice"
    finally:
        subprocess.run([*base, "-O", "exit", host], capture_output=True, timeout=30)
        off = subprocess.run(["bash", script, *UP_ARGS], capture_output=True, text=True, timeout=600)
    assert off.returncode == 0, off.stderr
    assert ssh(cluster, "hostname").stdout.strip() == "login"
