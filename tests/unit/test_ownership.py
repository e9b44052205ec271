"""The pieces of run ownership on their own: the lock, the lease, folder identity, the record's
checks, signals only to processes with our handler, and messages that keep the OS's reason."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core import ownership, procs
from orchestrator.core.errors import OrchestratorError, RunNotFoundError, SubmissionError
from orchestrator.executors.base import prepare_run_dir, refresh_by_supervisor
from orchestrator.core.failures import message_of
from orchestrator.core.interpreter import BOOTSTRAP, module_argv
from orchestrator.spec.loading import spec_from_dict
from orchestrator.plan import plan
from orchestrator.core.records import RunRecord


def _launch(tmp: Path, name: str = "own"):
    return plan(spec_from_dict({"name": name, "entrypoint": "jobs.train:main", "runs_dir": str(tmp / "runs")}), "local")


def test_one_lock_per_run_folder_and_a_dead_holders_attempt_is_taken_over(tmp_path: Path) -> None:
    launch = _launch(tmp_path)
    record, lock = prepare_run_dir(launch)
    assert record.host == ownership.this_host() and record.folder_id == ownership.folder_id(launch.run_dir)
    assert ownership.is_held(launch.run_dir)
    with pytest.raises(SubmissionError, match="live attempt"):
        prepare_run_dir(launch)
    gone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    record.update(state="RUNNING", supervisor_pid=gone.pid, supervisor_start=procs.start_time(gone.pid))
    gone.kill()
    gone.wait()
    lock.release()  # the holder died: the kernel drops its lock
    again, lock2 = prepare_run_dir(launch)
    try:
        assert again.attempts == 2 and again.state == "PENDING"
    finally:
        lock2.release()


def test_a_lock_held_by_another_process_is_seen_and_dropped_when_it_dies(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, sys.argv[2]); from orchestrator import ownership; "
        "l = ownership.take(sys.argv[1]); print('held', flush=True); time.sleep(60)"), str(run_dir),
        str(Path(ownership.__file__).parents[1])], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert ownership.is_held(run_dir)
        with pytest.raises(SubmissionError, match="live attempt"):
            ownership.take(run_dir)
    finally:
        holder.kill()
        holder.wait()
    assert not ownership.is_held(run_dir)
    ownership.take(run_dir).release()


def test_a_copied_folder_and_a_symlinked_record_never_act_on_the_original(tmp_path: Path) -> None:
    launch = _launch(tmp_path)
    record, lock = prepare_run_dir(launch)
    record.update(state="RUNNING", supervisor_pid=os.getpid(), supervisor_start=procs.start_time(os.getpid()))
    copy = tmp_path / "copy"
    shutil.copytree(launch.run_dir, copy)
    copied = RunRecord.load(copy)
    assert ownership.copy_reason(copied.folder_id, copy)
    lock.release()  # even with no live holder, a copy is never rewritten
    assert refresh_by_supervisor(copied).state == "RUNNING"
    assert RunRecord.load(copy).state == "RUNNING"
    link = tmp_path / "link"
    link.mkdir()
    (link / "record.json").symlink_to(Path(launch.run_dir) / "record.json")
    with pytest.raises(RunNotFoundError, match="symbolic link"):
        RunRecord.load(link)
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "record.json")
    with pytest.raises(RunNotFoundError, match="not a regular file"):
        RunRecord.load(fifo)  # and it does not block


def test_a_moved_folder_keeps_its_identity(tmp_path: Path) -> None:
    launch = _launch(tmp_path)
    record, lock = prepare_run_dir(launch)
    lock.release()
    moved = tmp_path / "moved"
    os.rename(launch.run_dir, moved)
    assert ownership.copy_reason(RunRecord.load(moved).folder_id, moved) is None


def test_another_host_is_never_ours_to_signal(tmp_path: Path) -> None:
    assert ownership.foreign_reason(ownership.this_host(), None, tmp_path) is None
    other = "node7|" + ownership.this_host().split("|", 1)[1]
    assert "node7" in (ownership.foreign_reason(other, None, tmp_path) or "")
    assert ownership.foreign_reason(None, None, tmp_path)  # an unknown host is not ours either


def test_a_failed_registration_leaves_no_stuck_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "registry.jsonl").mkdir()  # cannot be appended to
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(home))
    launch = _launch(tmp_path)
    with pytest.raises(OrchestratorError, match="ORCHESTRATOR_HOME"):
        prepare_run_dir(launch)
    assert not Path(launch.run_dir).exists()  # nothing half-made is left behind
    (home / "registry.jsonl").rmdir()
    record, lock = prepare_run_dir(launch)  # the rerun is not blocked
    lock.release()
    assert record.attempts == 1


def test_a_runs_dir_that_cannot_hold_runs_is_one_line_and_creates_nothing(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    for runs_dir in (tmp_path / "file", tmp_path / "file" / "below", Path("/proc/self")):
        launch = plan(spec_from_dict({"name": "own", "entrypoint": "jobs.train:main", "runs_dir": str(runs_dir)}),
                      "local")
        with pytest.raises(SubmissionError, match="runs_dir|run folder"):
            prepare_run_dir(launch)
    assert (tmp_path / "file").read_text() == "x"


def test_signals_go_only_to_processes_with_our_handler() -> None:
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    handled = subprocess.Popen([sys.executable, "-c", (
        "import faulthandler, signal, sys, time; "
        "faulthandler.register(signal.SIGRTMIN + 4, file=sys.stderr); print('ok', flush=True); time.sleep(30)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert handled.stdout.readline().strip() == "ok"
        time.sleep(0.2)
        assert procs.catches(handled.pid, signal.SIGRTMIN + 4)
        assert not procs.catches(plain.pid, signal.SIGRTMIN + 4)
        assert not procs.catches(2**22, signal.SIGTERM)  # no such process
    finally:
        plain.kill()
        handled.kill()


def test_stacks_signal_a_rank_only_where_its_pid_means_it(tmp_path: Path) -> None:
    """A rank recorded on another host key (another node, boot or PID namespace, even with the
    same hostname) is never signalled from here; the same record with this host's key is."""
    from orchestrator.node import stack_requests

    handled = subprocess.Popen([sys.executable, "-c", (
        "import faulthandler, signal, sys, time; "
        "faulthandler.register(signal.SIGRTMIN + 4, file=sys.stderr); print('ok', flush=True); time.sleep(30)")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert handled.stdout.readline().strip() == "ok"
        time.sleep(0.2)
        record = stack_requests.rank_record_path(tmp_path, 0)
        record.parent.mkdir(parents=True)
        other = "same-name|other-boot|pid:[1]"
        for key, expected in ((other, []), (ownership.this_host(), [0])):
            record.write_text(json.dumps({"rank": 0, "host": os.uname().nodename, "host_key": key,
                                          "pid": handled.pid, "start_ticks": procs.start_time(handled.pid)}))
            assert stack_requests.signal_ranks(tmp_path) == expected
        assert handled.poll() is None  # it had the handler: the signal only dumped its stacks
    finally:
        handled.kill()


@settings(max_examples=30, deadline=None)
@given(number=st.integers(min_value=1, max_value=64))
def test_every_signal_number_has_a_name(number: int) -> None:
    name = procs.signal_name(number)
    assert name and "\n" not in name
    if signal.SIGRTMIN <= number <= signal.SIGRTMAX:
        assert name.startswith("SIGRT")


def test_the_os_reason_of_a_chained_failure_is_kept() -> None:
    try:
        try:
            raise OSError(28, "No space left on device", "/ckpt/step-10.pt")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file")
    except RuntimeError as exc:
        text = message_of(exc)
    assert "No space left on device" in text and "/ckpt/step-10.pt" in text and "inline_container" in text
    assert message_of(ValueError("plain")) == "plain"


def test_our_interpreters_never_import_from_their_directory(tmp_path: Path) -> None:
    (tmp_path / "json.py").write_text("raise SystemExit('hijacked')\n")
    (tmp_path / "runpy.py").write_text("raise SystemExit('hijacked')\n")
    out = subprocess.run(module_argv(sys.executable, "json.tool", "--help"), cwd=tmp_path, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and "usage" in out.stdout, out.stderr
    argv = ["srun", "--x", *module_argv("/opt/py", "orchestrator.backends.slurm.node.slurm_rank", "p.json")]
    assert argv[argv.index(BOOTSTRAP) - 3] == "/opt/py"
    assert json.loads(json.dumps(BOOTSTRAP)) == BOOTSTRAP and "'" not in BOOTSTRAP  # one plain shell word


def test_whatever_is_in_the_way_of_a_cancel_request_is_handled(tmp_path: Path) -> None:
    for make in (lambda r: (r / "requests" / "cancel").mkdir(parents=True),
                 lambda r: (r / "requests").write_text("x"),
                 lambda r: (r / "requests").mkdir() or (r / "requests" / "cancel").symlink_to("/nonexistent")):
        run_dir = tmp_path / f"run-{time.monotonic_ns()}"
        run_dir.mkdir()
        make(run_dir)
        ownership.forget_requests(run_dir)
        assert not ownership.cancel_requested(run_dir)
        ownership.request_cancel(run_dir, "test")
        assert ownership.cancel_requested(run_dir)
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "requests").write_text("x")
    with pytest.raises(SubmissionError, match="cancel request"):
        ownership.request_cancel(blocked, "test")
