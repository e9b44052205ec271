"""The job's agent (orchestrator.slurm_job) without a cluster: a stand-in srun (a child that
exits on USR2 unless told to checkpoint) and a recording stand-in scontrol on PATH. Its
requeue decisions are checked for each slurm.requeue policy, through real signals."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# The child plays all the ranks: it records that USR2 reached it and (like the rank API after a
# collective checkpoint) writes the marker when asked to; USR2 ends it either way.
CHILD = """
import os, signal, sys, time
out = sys.argv[1]
def on_usr2(signum, frame):
    open(os.path.join(out, "child-got-usr2"), "w").close()
    if os.environ.get("CHECKPOINT") == "1":
        os.makedirs(os.path.dirname(os.environ["ORCH_REQUEUE_MARKER"]), exist_ok=True)
        open(os.environ["ORCH_REQUEUE_MARKER"], "w").close()
    sys.exit(0 if os.environ.get("CHECKPOINT") == "1" else 1)
signal.signal(signal.SIGUSR2, on_usr2)
open(os.path.join(out, "child-started"), "w").close()
time.sleep(60)
"""


def _payload(tmp: Path, **fields) -> None:
    """A real SLURM payload as plan writes it, with a stand-in srun."""
    from orchestrator.plan import plan
    from orchestrator.spec import JobSpec

    launch = plan(JobSpec(name="agent", entrypoint="jobs.train:main", executor="slurm", runs_dir=str(tmp / "runs"),
                          slurm={"requeue": fields["requeue"], "max_requeues": fields["max_requeues"]}))
    dataclasses.replace(launch.payload, run_dir=str(tmp / "run"), **fields).write(tmp / "payload.json")


def _agent(tmp: Path, policy: str, checkpoint: bool, restart: int = 0, max_requeues: int = 2,
           scontrol_exit: int = 0):
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp / 'scontrol-calls'}\n"
                                      + (f"echo 'slurm_requeue error: Requested operation is presently disabled' >&2\n"
                                         f"exit {scontrol_exit}\n" if scontrol_exit else ""))
    (bin_dir / "scontrol").chmod(0o755)
    marker = tmp / "run" / "requeue" / f"checkpointed-77-{restart}"
    _payload(tmp, requeue=policy, max_requeues=max_requeues, srun=(sys.executable, "-c", CHILD, str(tmp)))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77",
           "SLURM_RESTART_COUNT": str(restart), "ORCH_REQUEUE_MARKER": str(marker),
           "CHECKPOINT": "1" if checkpoint else "0"}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.slurm_job", str(tmp / "payload.json")], env=env,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (tmp / "child-started").exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the stand-in srun never started"
        time.sleep(0.05)
    return proc


def _calls(tmp: Path) -> list[str]:
    path = tmp / "scontrol-calls"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("policy,checkpoint,requeued", [
    ("always", False, True),    # a script with no handler dies on USR2: requeued anyway
    ("auto", True, True),       # the rank API checkpointed: requeued
    ("auto", False, False),     # no checkpoint: auto does not requeue
    ("never", True, False),
])
def test_usr2_requeues_by_policy(tmp_path: Path, policy: str, checkpoint: bool, requeued: bool) -> None:
    proc = _agent(tmp_path, policy, checkpoint)
    proc.send_signal(signal.SIGUSR2)  # what B:USR2@margin sends the batch shell (the agent)
    _, err = proc.communicate(timeout=30)
    assert (tmp_path / "child-got-usr2").exists(), "the agent did not forward USR2 to the ranks"
    assert _calls(tmp_path) == (["requeue 77"] if requeued else []), err
    if requeued:
        assert "requeueing 77 (restart 1 of 2)" in err and proc.returncode == 0


def test_sigterm_never_requeues_and_the_limit_holds(tmp_path: Path) -> None:
    cancelled = tmp_path / "a"
    cancelled.mkdir()
    proc = _agent(cancelled, "always", False)
    proc.send_signal(signal.SIGTERM)  # scancel: the ranks get it from SLURM; the agent only notes it
    proc.send_signal(signal.SIGUSR2)
    proc.communicate(timeout=30)
    assert _calls(cancelled) == []
    done = tmp_path / "b"
    done.mkdir()
    proc = _agent(done, "always", False, restart=2, max_requeues=2)
    proc.send_signal(signal.SIGUSR2)
    _, err = proc.communicate(timeout=30)
    assert _calls(done) == [] and "no requeues left (2 of 2 used;" in err


@pytest.mark.parametrize("case,why", [
    ("never", "slurm.requeue: never"),
    ("limit", "no requeues left (2 of 2 used; slurm.max_requeues)"),
    ("refused", "scontrol requeue failed: slurm_requeue error: Requested operation is presently disabled"),
])
def test_a_stop_that_no_requeue_follows_never_ends_completed(tmp_path: Path, case: str, why: str) -> None:
    """The ranks checkpointed on the notice and exited 0, but no requeue followed: the agent ends
    non-zero (SLURM: FAILED, never COMPLETED) and end.json says why, for status. A refused
    scontrol is retried first, within a bound."""
    from orchestrator.forensics import read_end

    proc = _agent(tmp_path, "never" if case == "never" else "auto", True, restart=2 if case == "limit" else 0,
                  scontrol_exit=1 if case == "refused" else 0)
    proc.send_signal(signal.SIGUSR2)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 3, err
    end = read_end(tmp_path / "run")
    assert end and end["reason"] == "not_requeued" and why in end["error"], (end, err)
    assert "submit the spec again to resume" in end["error"]
    if case == "refused":
        assert len(_calls(tmp_path)) >= 3, _calls(tmp_path)  # retried


RECORD_ARGV = "import json, sys; json.dump(sys.argv[1:], open(sys.argv[1], 'w'))"


@pytest.mark.parametrize("taken", [False, True])
def test_the_agent_checks_the_auto_port_on_the_masters_node(tmp_path: Path, taken: bool) -> None:
    """Before any rank starts, the agent binds the derived port on its node (the master's) and
    hands the ranks that port, or the next free one when another job holds it."""
    import json
    import socket

    from orchestrator.rendezvous import derive_port

    argv_file = tmp_path / "srun-argv.json"
    _payload(tmp_path, requeue="auto", max_requeues=0, srun=(sys.executable, "-c", RECORD_ARGV, str(argv_file)))
    derived = derive_port("77", 0)
    holder = socket.socket()
    try:
        if taken:
            holder.bind(("", derived))
            holder.listen()
        env = {**os.environ, "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": socket.gethostname(),
               "SLURMD_NODENAME": socket.gethostname()}
        out = subprocess.run([sys.executable, "-m", "orchestrator.slurm_job", str(tmp_path / "payload.json")],
                             env=env, capture_output=True, text=True, timeout=60)
    finally:
        holder.close()
    argv = json.loads(argv_file.read_text())
    port = int(argv[argv.index("--master-port") + 1])
    if taken:
        assert port != derived and f"port {derived} is in use" in out.stderr, out.stderr
    else:
        assert port == derived, out.stderr
