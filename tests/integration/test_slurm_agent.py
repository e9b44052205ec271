"""The job's agent (orchestrator.backends.slurm.node.slurm_job) without a cluster: a stand-in srun (a child that
exits on USR2 unless told to checkpoint) and a recording stand-in scontrol on PATH. Its
requeue decisions are checked for each slurm.requeue policy, through real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.core import lean_record

# The child plays all the ranks: it records that USR2 reached it and (like the rank API after a
# collective checkpoint) writes the marker when asked to; USR2 ends it either way.
# NOTICE names the signal it listens for (slurm.signal); CLEANUP_S: how long its clean-up takes
# after the notice before it writes "child-cleaned-up" (STAY: it never ends on its own).
CHILD = """
import os, signal, sys, time

out = sys.argv[1]
if os.environ.get("LISTENING") == "1":  # the rank API's StopFlag on rank 0
    from orchestrator.core.run_folder import stop_flag_note
    os.makedirs(os.path.dirname(os.environ["ORCH_REQUEUE_MARKER"]), exist_ok=True)
    open(stop_flag_note(os.environ["ORCH_REQUEUE_MARKER"]), "w").write("listening")
def on_usr2(signum, frame):
    open(os.path.join(out, "child-got-usr2"), "w").close()
    if os.environ.get("FINISH") == "1":  # the notice met the last step: the work is done, rank 0 returns
        import json
        json.dump({"finished": time.time(), "result": None}, open(os.path.join(out, "run", "result.json"), "w"))
        sys.exit(0)
    open(os.path.join(out, "child-got-" + signal.Signals(signum).name), "w").close()
    if os.environ.get("CHECKPOINT") == "1":
        os.makedirs(os.path.dirname(os.environ["ORCH_REQUEUE_MARKER"]), exist_ok=True)
        open(os.environ["ORCH_REQUEUE_MARKER"], "w").close()
    if os.environ.get("STAY") == "1":
        return
    time.sleep(float(os.environ.get("CLEANUP_S", "0")))
    open(os.path.join(out, "child-cleaned-up"), "w").close()
    sys.exit(0 if os.environ.get("CHECKPOINT") == "1" else 1)
signal.signal(getattr(signal, os.environ.get("NOTICE", "SIGUSR2")), on_usr2)
if os.environ.get("IGNORE_TERM") == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(os.path.join(out, "child-started"), "w").write(str(os.getpid()))
time.sleep(60)
"""


def _payload(tmp: Path, slurm: dict | None = None, spec: dict | None = None, **fields) -> None:
    """A real SLURM payload as plan writes it, with a stand-in srun."""
    from orchestrator.plan import plan
    from orchestrator.spec.models import JobSpec

    launch = plan(JobSpec(name="agent", entrypoint="jobs.train:main", executor="slurm", runs_dir=str(tmp / "runs"),
                          slurm={"requeue": fields["requeue"], "max_requeues": fields["max_requeues"], **(slurm or {})},
                          **(spec or {})))
    lean_record.replace(launch.payload, run_dir=str(tmp / "run"), **fields).write(tmp / "payload.json")


def _agent(tmp: Path, policy: str, checkpoint: bool, restart: int = 0, max_requeues: int = 2,
           scontrol_exit: int = 0, slurm: dict | None = None, child_env: dict | None = None,
           spec: dict | None = None, job_info: str = ""):
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    # Each call also records whether the ranks' clean-up had finished when it came.
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp / 'scontrol-calls'}\n"
                                      f"test \"$1\" = show && echo '{job_info}' && exit 0\n"
                                      f"test -e {tmp / 'child-cleaned-up'} && echo cleaned >> {tmp / 'scontrol-when'}\n"
                                      f"test -e {tmp / 'child-cleaned-up'} || echo running >> {tmp / 'scontrol-when'}\n"
                                      + (f"echo 'slurm_requeue error: Requested operation is presently disabled' >&2\n"
                                         f"exit {scontrol_exit}\n" if scontrol_exit else ""))
    (bin_dir / "scontrol").chmod(0o755)
    (bin_dir / "scancel").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp / 'scancel-calls'}\n")
    (bin_dir / "scancel").chmod(0o755)
    # squeue -s: the job's steps as SLURM lists them (the batch step, the extern step, the ranks').
    (bin_dir / "squeue").write_text("#!/bin/sh\nprintf '77.batch\\n77.extern\\n77.0\\n'\n")
    (bin_dir / "squeue").chmod(0o755)
    # The health gate's srun (the ranks' srun is the payload's stand-in): run its command here, once.
    (bin_dir / "srun").write_text('#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    (bin_dir / "srun").chmod(0o755)
    marker = tmp / "run" / "requeue" / f"checkpointed-77-{restart}"
    _payload(tmp, slurm, spec, requeue=policy, max_requeues=max_requeues, srun=(sys.executable, "-c", CHILD, str(tmp)))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77",
           "SLURM_RESTART_COUNT": str(restart), "ORCH_REQUEUE_MARKER": str(marker),
           "CHECKPOINT": "1" if checkpoint else "0", **(child_env or {})}
    return _start_agent(tmp, env)


def _start_agent(tmp: Path, env: dict[str, str]) -> subprocess.Popen:
    """The agent on tmp's payload, returned once its stand-in srun (the ranks) has started."""
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.backends.slurm.node.slurm_job", str(tmp / "payload.json")], env=env,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 30
    while not (tmp / "child-started").exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the stand-in srun never started"
        time.sleep(0.05)
    return proc


def _ended(proc: subprocess.Popen, timeout: float) -> str:
    """The agent's stderr once it has exited; past ``timeout``, a failure that says what was still
    running in its session (the stand-in ranks, an scontrol) and what the agent had said."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired as exc:
        alive = subprocess.run(["ps", "-s", str(proc.pid), "-o", "pid,stat,etimes,args"], capture_output=True,
                               text=True).stdout
        said = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
        raise AssertionError(f"the agent had not ended after {timeout:g}s; its session:\n{alive}\nit said:\n{said}") \
            from None


def _calls(tmp: Path) -> list[str]:
    """The requeues asked of the stand-in scontrol (``show job`` questions left out)."""
    path = tmp / "scontrol-calls"
    return [c for c in path.read_text().splitlines() if not c.startswith("show ")] if path.exists() else []


@pytest.mark.parametrize("policy,checkpoint,requeued", [
    ("always", False, True),    # a script with no handler dies on USR2: requeued anyway
    ("auto", True, True),       # the rank API checkpointed: requeued
    ("auto", False, False),     # no checkpoint: auto does not requeue
    ("never", True, False),
])
def test_usr2_requeues_by_policy(tmp_path: Path, policy: str, checkpoint: bool, requeued: bool) -> None:
    proc = _agent(tmp_path, policy, checkpoint)
    proc.send_signal(signal.SIGUSR2)  # what B:USR2@margin sends the batch shell (the agent)
    err = _ended(proc, 30)
    assert (tmp_path / "child-got-usr2").exists(), "the agent did not forward USR2 to the ranks"
    assert _calls(tmp_path) == (["requeue 77"] if requeued else []), err
    if requeued:
        assert "requeueing 77 (requeue 1 of 2)" in err and proc.returncode == 0


@pytest.mark.parametrize("policy", ["always", "auto"])
@pytest.mark.parametrize("listening", [True, False])
def test_work_finished_after_the_notice_is_not_requeued(tmp_path: Path, policy: str, listening: bool) -> None:
    """The notice met the end of the work (issue 32: under ``always`` such a job was requeued and ran
    again). Ranks that listen through the rank API and never stopped, whose rank 0 returned, are
    done: COMPLETED (exit 0), no requeue. A script that gives no such evidence is requeued under
    ``always``, as the policy says (it resumes from its own snapshot)."""
    proc = _agent(tmp_path, policy, False, child_env={"FINISH": "1", "LISTENING": "1" if listening else "0"})
    proc.send_signal(signal.SIGUSR2)
    err = _ended(proc, 30)
    requeued = policy == "always" and not listening
    assert _calls(tmp_path) == (["requeue 77"] if requeued else []), err
    assert proc.returncode == 0, err
    if listening:
        assert "the ranks finished their work before stopping for it" in err, err
        assert "did not checkpoint through the rank API" not in err, err


def test_sigterm_never_requeues_and_the_limit_holds(tmp_path: Path) -> None:
    cancelled = tmp_path / "a"
    cancelled.mkdir()
    proc = _agent(cancelled, "always", False)
    proc.send_signal(signal.SIGTERM)  # scancel: the ranks get it from SLURM; the agent only notes it
    proc.send_signal(signal.SIGUSR2)
    _ended(proc, 30)
    assert _calls(cancelled) == []
    done = tmp_path / "b"
    done.mkdir()
    proc = _agent(done, "always", False, restart=2, max_requeues=2)
    proc.send_signal(signal.SIGUSR2)
    err = _ended(proc, 30)
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
    from orchestrator.node.forensics import read_end

    proc = _agent(tmp_path, "never" if case == "never" else "auto", True, restart=2 if case == "limit" else 0,
                  scontrol_exit=1 if case == "refused" else 0)
    proc.send_signal(signal.SIGUSR2)
    err = _ended(proc, 90)
    assert proc.returncode == 3, err
    end = read_end(tmp_path / "run")
    assert end and end.reason == "not_requeued" and why in end.error, (end, err)
    assert "submit the spec again to resume" in end.error
    if case == "refused":
        assert len(_calls(tmp_path)) >= 3, _calls(tmp_path)  # retried


RECORD_ARGV = "import json, sys; json.dump(sys.argv[1:], open(sys.argv[1], 'w'))"


@pytest.mark.parametrize("taken", [False, True])
def test_the_agent_checks_the_auto_port_on_the_masters_node(tmp_path: Path, taken: bool) -> None:
    """Before any rank starts, the agent binds the derived port on its node (the master's) and
    hands the ranks that port, or the next free one when another job holds it."""
    import json
    import socket

    from orchestrator.core.rendezvous import derive_port

    argv_file = tmp_path / "srun-argv.json"
    _payload(tmp_path, spec={"recovery": {"health_check": False}},  # no srun stand-in here for the gate
             requeue="auto", max_requeues=0, srun=(sys.executable, "-c", RECORD_ARGV, str(argv_file)))
    derived = derive_port("77", 0)
    holder = socket.socket()
    try:
        if taken:
            holder.bind(("", derived))
            holder.listen()
        env = {**os.environ, "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": socket.gethostname(),
               "SLURMD_NODENAME": socket.gethostname()}
        out = subprocess.run([sys.executable, "-m", "orchestrator.backends.slurm.node.slurm_job", str(tmp_path / "payload.json")],
                             env=env, capture_output=True, text=True, timeout=60)
    finally:
        holder.close()
    argv = json.loads(argv_file.read_text())
    port = int(argv[argv.index("--master-port") + 1])
    if taken:
        assert port != derived and f"port {derived} is in use" in out.stderr, out.stderr
    else:
        assert port == derived, out.stderr


def test_always_requeues_after_the_ranks_clean_up_not_during_it(tmp_path: Path) -> None:
    """Under ``always`` the requeue (which ends every rank at once) waits for the ranks' clean-up
    after the notice: a checkpoint being written is never cut in half."""
    proc = _agent(tmp_path, "always", False, child_env={"CLEANUP_S": "3"})
    proc.send_signal(signal.SIGUSR2)
    err = _ended(proc, 60)
    assert _calls(tmp_path) == ["requeue 77"], err
    assert (tmp_path / "scontrol-when").read_text().split() == ["cleaned"], err
    assert proc.returncode == 0


def test_always_requeues_ranks_that_never_end_before_the_margin_is_spent(tmp_path: Path) -> None:
    """Ranks that ignore the notice are requeued when the margin is nearly spent (signal_margin_s
    10: after 5 s), not left to the time limit, which would end the job TIMEOUT unrequeued."""
    from orchestrator.backends.slurm.node.agent_decisions import requeue_deadline

    proc = _agent(tmp_path, "always", False, slurm={"signal_margin_s": 10}, child_env={"STAY": "1"})
    t0 = time.monotonic()
    proc.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 30
    while not _calls(tmp_path):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)
    waited = time.monotonic() - t0
    os.killpg(proc.pid, signal.SIGKILL)  # the stand-in scontrol does not end the job as SLURM's requeue would
    err = _ended(proc, 30)
    assert 4.5 <= waited <= 8, (waited, err)
    assert (tmp_path / "scontrol-when").read_text().split() == ["running"]
    assert requeue_deadline(100.0, 120) == 100.0 + 105 and requeue_deadline(0.0, 10) == 5.0


def test_the_notice_is_the_specs_signal(tmp_path: Path) -> None:
    """slurm.signal: USR1 (Lightning's requeue signal): the agent takes USR1 as the notice,
    forwards it to the ranks, and requeues on it; sbatch is asked for B:USR1@margin."""
    from orchestrator.plan import plan
    from orchestrator.spec.models import JobSpec

    proc = _agent(tmp_path, "always", False, slurm={"signal": "USR1"}, child_env={"NOTICE": "SIGUSR1"})
    proc.send_signal(signal.SIGUSR1)
    err = _ended(proc, 60)
    assert (tmp_path / "child-got-SIGUSR1").exists(), err
    assert _calls(tmp_path) == ["requeue 77"], err
    launch = plan(JobSpec(name="lightning", entrypoint="jobs.train:main", executor="slurm", runs_dir="/shared/runs",
                          slurm={"signal": "USR1", "signal_margin_s": 90}))
    assert "#SBATCH --signal=B:USR1@90" in launch.sbatch_script


def _scancels(tmp: Path) -> list[str]:
    path = tmp / "scancel-calls"
    return path.read_text().splitlines() if path.exists() else []


def test_orchestrator_cancel_gives_the_ranks_stop_grace_s_then_scancels(tmp_path: Path) -> None:
    """`orchestrator cancel` leaves a request in the run folder (and signals the ranks' step): the
    agent gives the ranks stop_grace_s, then scancels its own job (SLURM: CANCELLED); it never
    requeues, even when the ranks checkpointed on that SIGTERM."""
    from orchestrator.core import ownership

    stuck = tmp_path / "stuck"
    stuck.mkdir()
    proc = _agent(stuck, "auto", False, child_env={"STAY": "1"}, spec={"stop_grace_s": 2})
    ownership.request_cancel(stuck / "run", "orchestrator cancel")
    t0 = time.monotonic()
    while not _scancels(stuck):
        assert time.monotonic() - t0 < 20 and proc.poll() is None
        time.sleep(0.05)
    waited = time.monotonic() - t0
    os.killpg(proc.pid, signal.SIGKILL)
    _ended(proc, 30)
    assert _scancels(stuck) == ["77"] and _calls(stuck) == []
    assert 1.0 <= waited <= 6.0, waited  # stop_grace_s: 2 (below), after the agent's next look

    done = tmp_path / "done"
    done.mkdir()
    proc = _agent(done, "auto", True)
    ownership.request_cancel(done / "run", "orchestrator cancel")
    proc.send_signal(signal.SIGUSR2)  # the ranks checkpoint and exit 0 at once (faster than a look)
    err = _ended(proc, 60)
    assert _calls(done) == [] and _scancels(done) == ["77"], err
    assert proc.returncode == 3 and "requeueing" not in err, err


def test_a_rank_that_fails_before_its_entrypoint_is_recorded_with_its_rank_and_reason(tmp_path: Path) -> None:
    """A named interface missing on the node fails the rank before the user's code: one line and
    <run>/errors/rank-N.json (rank, reason, node), which status reports like any rank's failure."""
    import json
    import socket

    from orchestrator.executors.base import first_error

    _payload(tmp_path, requeue="auto", max_requeues=0, spec={"distributed": {"interface": "nosuchif9"}})
    env = {**os.environ, "SLURM_JOB_ID": "78", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
           "SLURM_NTASKS": "2", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": socket.gethostname()}
    out = subprocess.run([sys.executable, "-m", "orchestrator.backends.slurm.node.slurm_rank", str(tmp_path / "payload.json")],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "rank 1 failed: RuntimeError: interface nosuchif9 does not exist" in out.stderr
    err = first_error(tmp_path / "run")
    assert err is not None and err.rank == 1 and "before the entrypoint" in err.message, err
    assert json.loads((tmp_path / "run" / "errors" / "rank-1.json").read_text())["attempt"] == 0


@pytest.mark.parametrize("preempting", [True, False])
def test_a_preemptions_sigterm_requeues_and_a_scancels_does_not(tmp_path: Path, preempting: bool) -> None:
    """SIGTERM reaches the batch shell and the ranks alike, from a preemption (GraceTime) or a
    scancel; the controller tells them apart (PreemptTime). The ranks checkpoint on it either way:
    a preemption is requeued under auto, a cancel never."""
    info = "JobId=77 JobState=RUNNING PreemptTime=2026-11-24T18:00:00" if preempting else \
        "JobId=77 JobState=CANCELLED PreemptTime=None"
    proc = _agent(tmp_path, "auto", True, child_env={"NOTICE": "SIGTERM"}, job_info=info)
    os.killpg(proc.pid, signal.SIGTERM)  # SLURM signals the batch step and the ranks' step
    err = _ended(proc, 60)
    assert _calls(tmp_path) == (["requeue 77"] if preempting else []), err
    assert ("is being preempted" in err) == preempting, err


def test_a_cancel_preemption_is_not_requeued_and_the_site_ends_the_job(tmp_path: Path) -> None:
    """Under PreemptMode=CANCEL the site's policy wins: the ranks checkpointed (auto), yet the agent
    does not requeue the job, says why where status reads it (the attempt's record: preempted),
    and leaves as soon as the controller says SLURM ended the job."""
    from orchestrator.core.attempt_logs import ended_line
    from orchestrator.core.recovery import History

    # The stand-in scontrol answers every 'show' alike: the job's and its partition's fields in one
    # line; the job as SLURM has it once its GraceTime ran out.
    info = "JobId=77 JobState=PREEMPTED PreemptTime=2026-11-24T18:00:00 Partition=debug PreemptMode=CANCEL"
    proc = _agent(tmp_path, "auto", True, child_env={"NOTICE": "SIGTERM"}, job_info=info)
    os.killpg(proc.pid, signal.SIGTERM)
    err = _ended(proc, 60)
    assert _calls(tmp_path) == [], err  # no scontrol requeue
    (attempt,) = History.load(tmp_path / "run").attempts
    assert attempt.outcome == "preempted", (attempt, err)
    line = ended_line(attempt)
    assert "PreemptMode=CANCEL" in line and "not requeued" in line, line
    assert "SLURM ended the job: PREEMPTED" in err, err


def test_always_requeues_ranks_that_ended_because_the_job_is_preempted(tmp_path: Path) -> None:
    """SLURM 22.05 signals only the ranks' step on preemption: the agent gets no signal, the
    ranks of a snapshotting script exit 0, and under ``always`` the agent asks the controller
    whether that was a preemption (PreemptTime) before it lets the job end."""
    info = "JobId=77 JobState=RUNNING PreemptTime=2026-11-24T18:00:00"
    proc = _agent(tmp_path, "always", False, child_env={"NOTICE": "SIGTERM"}, job_info=info)
    os.kill(int((tmp_path / "child-started").read_text()), signal.SIGTERM)  # the ranks' step only
    err = _ended(proc, 60)
    assert _calls(tmp_path) == ["requeue 77"], err


def test_ranks_that_end_on_the_cancels_sigterm_before_the_agent_looks_end_cancelled(tmp_path: Path) -> None:
    """`orchestrator cancel`'s SIGTERM ends a script with no handler at once, before the agent's
    next look at the request: the job is still a cancel (scancel, CANCELLED), not a failure
    blamed on a rank "killed by a signal", and not a completion."""
    from orchestrator.core import ownership

    proc = _agent(tmp_path, "auto", False, child_env={"NOTICE": "SIGTERM"})
    ownership.request_cancel(tmp_path / "run", "orchestrator cancel")
    os.kill(int((tmp_path / "child-started").read_text()), signal.SIGTERM)  # scancel --signal=TERM
    err = _ended(proc, 60)
    assert _scancels(tmp_path) == ["77"] and _calls(tmp_path) == [], err
    assert proc.returncode == 3 and "killed by a signal" not in err, err


def test_a_stalled_rank_that_ignores_sigterm_is_killed_within_the_hard_tier(tmp_path: Path) -> None:
    """After a watchdog verdict the ranks get SIGTERM through srun; one that ignores it gets
    SIGKILL END_GRACE_S later through its step (scancel --signal=KILL 77.0: never the job, which
    a bare SIGKILL would cancel, agent included), and srun goes after that: every rank is gone
    within ~10 s of the decision."""
    from orchestrator.core.recovery import History
    from orchestrator.backends.slurm.node.slurm_job import END_GRACE_S

    proc = _agent(tmp_path, "never", False, spec={"watchdog": {"stall_s": 2}}, child_env={"IGNORE_TERM": "1"})
    t0 = time.monotonic()
    err = _ended(proc, 60)
    took = time.monotonic() - t0
    assert _scancels(tmp_path) == ["--signal=KILL 77.0"], err
    assert took < 2 + 2 * END_GRACE_S + 15, (took, err)  # stall_s, both tiers, and slack for a loaded machine
    child = int((tmp_path / "child-started").read_text())
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split(")")[1][:3]
    assert proc.returncode == 1
    (attempt,) = History.load(tmp_path / "run").attempts
    assert (attempt.outcome, attempt.action) == ("hang", "stop")  # recovery is off: the hang ends the job


@pytest.mark.parametrize("suspended", ["now", "earlier"])
def test_ranks_slurm_suspended_are_never_called_stalled(tmp_path: Path, suspended: str) -> None:
    """Under SUSPEND,GANG preemption (or ``scontrol suspend``) SLURM stops the ranks: the
    watchdog's clock leaves the suspended time out. The controller says the job is SUSPENDED, or
    (after a resume) that it ran 1 s of its 1000 s since it started: no stall verdict either way."""
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 1000))
    info = "JobState=SUSPENDED" if suspended == "now" else f"JobState=RUNNING StartTime={start} RunTime=00:00:01"
    proc = _agent(tmp_path, "never", False, spec={"watchdog": {"stall_s": 2}}, job_info=info)
    time.sleep(8)  # four times stall_s with no progress at all
    assert proc.poll() is None
    proc.send_signal(signal.SIGUSR2)  # end the stand-in ranks
    err = _ended(proc, 30)
    assert "no progress" not in err and "--signal=KILL" not in _scancels(tmp_path), err
    if suspended == "earlier":
        assert "was suspended for 10" in err, err  # 1000 s since its start (and the test's own), less the second it ran
    assert (tmp_path / "scontrol-calls").read_text().count("show job") <= 3  # asked only near a verdict


def test_an_earlier_jobs_attempt_its_agent_never_closed_is_recorded_lost(tmp_path: Path) -> None:
    """Two submissions of one run: the first job's agent was killed (no end recorded); the second
    job's agent records that attempt as lost, not as a node failure of its own, and numbers on."""
    from orchestrator.core.recovery import History

    (tmp_path / "run").mkdir()
    History(tmp_path / "run" / "recovery.json").begin(1, ["nodeX"], tmp_path / "ckpt", job="55")
    proc = _agent(tmp_path, "never", False)
    proc.send_signal(signal.SIGTERM)  # scancel: the agent notes it...
    proc.send_signal(signal.SIGUSR2)  # ...and the stand-in rank ends
    err = _ended(proc, 30)
    first, second = History.load(tmp_path / "run").attempts
    assert (first.outcome, first.action, first.blamed) == ("lost", "", []), err
    assert "job 55 ended without its agent recording how" in first.why
    assert (second.number, second.job, second.outcome) == (2, "77", "cancelled"), err


def test_a_node_failure_requeue_past_max_restarts_ends_the_job(tmp_path: Path) -> None:
    """SLURM requeued the job itself (the agent's node failed) once more than recovery.max_restarts
    allows: the next attempt records the node failure and ends FAILED without starting the ranks."""
    from orchestrator.core.recovery import History

    (tmp_path / "run").mkdir()
    history = History(tmp_path / "run" / "recovery.json")
    history.finish(history.begin(1, ["n1"], tmp_path / "ckpt", job="77"), "crash", action="restart")
    history.begin(2, ["n2"], tmp_path / "ckpt", job="77")  # its agent died with its node
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text("#!/bin/sh\necho 'n2 down*'\n")
    (bin_dir / "sinfo").chmod(0o755)
    _payload(tmp_path, spec={"recovery": {"max_restarts": 1}}, requeue="auto", max_requeues=3,
             srun=(sys.executable, "-c", "open('ranks-started', 'w')"))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "2"}
    out = subprocess.run([sys.executable, "-m", "orchestrator.backends.slurm.node.slurm_job", str(tmp_path / "payload.json")], env=env,
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    assert "no restarts left (1 of 1 used; recovery.max_restarts)" in out.stderr
    assert not (tmp_path / "ranks-started").exists()
    a = History.load(tmp_path / "run").attempts
    assert [(x.outcome, x.action, x.blamed) for x in a] == [("crash", "restart", []), ("node_failure", "restart", ["n2"]),
                                                            ("node_failure", "stop", [])], a


def test_a_preemption_slurm_requeued_itself_is_a_requeue_not_a_node_failure(tmp_path: Path) -> None:
    """slurm.requeue: never, preempted under PreemptMode=REQUEUE: SLURM requeues the job itself.
    The attempt is recorded preempted, and the next attempt of the job counts it as a requeue."""
    from orchestrator.core.recovery import History

    info = "JobId=77 JobState=RUNNING PreemptTime=2026-11-24T18:00:00"
    proc = _agent(tmp_path, "never", False, child_env={"NOTICE": "SIGTERM"}, job_info=info)
    os.killpg(proc.pid, signal.SIGTERM)  # the preemption's SIGTERM, to the agent and the ranks
    err = _ended(proc, 60)
    (first,) = History.load(tmp_path / "run").attempts
    assert (first.outcome, first.action) == ("preempted", ""), err
    (tmp_path / "child-started").unlink()
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SLURM_JOB_ID": "77",
           "SLURM_RESTART_COUNT": "1", "NOTICE": "SIGTERM"}
    again = _start_agent(tmp_path, env)  # the job's next attempt
    os.killpg(again.pid, signal.SIGTERM)
    again.communicate(timeout=60)
    first, second = History.load(tmp_path / "run").attempts
    assert (first.outcome, first.action) == ("preempted", "requeue") and second.number == 2
    assert History.load(tmp_path / "run").restarts() == 0


RECORD_ARGV_ENV = "import json, os, sys; json.dump({'argv': sys.argv[2:], 'env': dict(os.environ)}, open(sys.argv[1], 'w'))"


@pytest.mark.parametrize("own_threads", [False, True])
def test_without_cpus_per_task_each_rank_gets_its_share_of_the_nodes_cpus(tmp_path: Path, own_threads: bool) -> None:
    """slurm.cpus_per_task unset: the plan carries the ranks' srun --cpus-per-task and the thread
    default as a rule, and the agent resolves it from what SLURM granted (SLURM_CPUS_ON_NODE // ranks
    per node); a thread count the user set stays theirs. The agent's sruns (the ranks', the health
    gate's) export the job's environment where the batch step has SLURM_EXPORT_ENV=NONE (sites
    defaulting to --export=NONE)."""
    import json

    from orchestrator.plan import plan
    from orchestrator.spec.models import JobSpec

    env_spec = {"KEEP_ME": "yes", **({"OMP_NUM_THREADS": "3"} if own_threads else {})}
    launch = plan(JobSpec(name="cpus", entrypoint="jobs.train:main", executor="slurm", cpu_ranks_per_node=2,
                          runs_dir=str(tmp_path / "runs"), env=env_spec))
    rule = next(a for a in launch.payload.srun if a.startswith("--cpus-per-task="))
    assert rule == "--cpus-per-task=<SLURM_CPUS_ON_NODE / 2>"
    assert launch.payload.env["OMP_NUM_THREADS"] == ("3" if own_threads else "<SLURM_CPUS_ON_NODE / 2>")
    out = tmp_path / "srun.json"
    lean_record.replace(launch.payload, run_dir=str(tmp_path / "run"),
                        srun=(sys.executable, "-c", RECORD_ARGV_ENV, str(out), rule)).write(tmp_path / "payload.json")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # The health gate's srun: records what its environment says, then runs the gate here.
    (bin_dir / "srun").write_text(f'#!/bin/sh\necho "$SLURM_EXPORT_ENV ${{SLURM_CPUS_PER_GPU:-unset}} '
                                  f'$OMP_NUM_THREADS" > {tmp_path / "gate-env"}\n'
                                  'while [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    (bin_dir / "srun").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77", "SLURM_CPUS_ON_NODE": "9",
           "SLURM_EXPORT_ENV": "NONE", "SLURM_CPUS_PER_GPU": "4"}
    env.pop("OMP_NUM_THREADS", None)
    done = subprocess.run([sys.executable, "-m", "orchestrator.backends.slurm.node.slurm_job", str(tmp_path / "payload.json")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(out.read_text())
    assert seen["argv"][0] == "--cpus-per-task=4", seen["argv"]  # 9 CPUs, 2 ranks: 4 each
    assert seen["env"]["OMP_NUM_THREADS"] == ("3" if own_threads else "4")
    assert seen["env"]["SLURM_EXPORT_ENV"] == "ALL" and seen["env"]["KEEP_ME"] == "yes"
    assert "SLURM_CPUS_PER_GPU" not in seen["env"]  # srun gets --cpus-per-task on its command line
    assert "each rank gets 4 CPU(s) (SLURM granted 9 CPUs on the node, shared by 2 rank(s)" in done.stderr
    assert (tmp_path / "gate-env").read_text().split() == ["ALL", "unset", "3" if own_threads else "4"]


def test_the_health_gate_never_imports_from_the_submit_folder(tmp_path: Path) -> None:
    """A json.py where the user submitted (the job's working folder): the agent and its health
    gate, which srun starts there, never import it, and the job goes on to its ranks."""
    from orchestrator.core.interpreter import module_argv
    from orchestrator.plan import plan
    from orchestrator.spec.models import JobSpec

    submit_dir, marker = tmp_path / "submit", tmp_path / "hijacked"
    submit_dir.mkdir()
    for name in ("json", "typing"):
        (submit_dir / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write('{name}')\nraise SystemExit(3)\n")
    launch = plan(JobSpec(name="gate", entrypoint="jobs.train:main", executor="slurm", cpu_ranks_per_node=1,
                          runs_dir=str(tmp_path / "runs")))
    assert launch.payload.recovery.health_check  # on by default
    out = tmp_path / "srun.json"
    lean_record.replace(launch.payload, run_dir=str(tmp_path / "run"),
                        srun=(sys.executable, "-P", "-c", RECORD_ARGV_ENV, str(out))  # the ranks' stand-in: -P, as
                        ).write(tmp_path / "payload.json")  # the real rank's bootstrap drops '' too
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    (bin_dir / "srun").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "78", "SLURM_CPUS_ON_NODE": "2"}
    done = subprocess.run(module_argv(sys.executable, "orchestrator.backends.slurm.node.slurm_job", str(tmp_path / "payload.json")),
                          cwd=submit_dir, env=env, capture_output=True, text=True, timeout=120)
    assert not marker.exists(), (marker.read_text(), done.stderr[-2000:])
    assert done.returncode == 0 and out.exists(), done.stderr[-2000:]  # the gate passed: the ranks' srun ran
