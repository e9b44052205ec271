"""A run folder's records read as hostile input (``orchestrator.core.safe_read``): a FIFO, a link,
NaN or a field of the wrong type in ``recovery.json`` (or a metrics file) never blocks ``status``,
``list`` or ``report``, never crashes them, and never hides the run: it is one line naming the file
("recovery.json in <run> is damaged: ..."), or "no permission to read <path>" when nothing is wrong
with the file but this user may not read it, and the rest of the output still shows."""

from __future__ import annotations

import errno
import io
import json
import os
import threading
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any, Callable

import pytest

from orchestrator.cli import main
from orchestrator.core import safe_read
from orchestrator.core.records import RunRecord, register
from orchestrator.core.recovery import History

RUN_ID = "hostile-0123abcd"


def _run(tmp_path: Path, recovery: str | bytes | None = None) -> Path:
    """A registered local run that ended, with ``recovery`` as its recovery.json."""
    run_dir = tmp_path / "runs" / RUN_ID
    (run_dir / "metrics").mkdir(parents=True)
    record = RunRecord(run_id=RUN_ID, run_dir=str(run_dir), executor="local", state="FAILED", world_size=1,
                       error="rank 0 raised RuntimeError: boom")
    record.save()
    register(record)
    if recovery is not None:
        path = run_dir / "recovery.json"
        path.write_bytes(recovery if isinstance(recovery, bytes) else recovery.encode())
    return run_dir


def _cli(*argv: str, unblock: Callable[[], None] = lambda: None) -> tuple[int, str, str]:
    """The CLI in a thread: its exit code and output, or a failure when it is still blocked after
    20 s (``unblock`` then frees it, so that no thread is left behind)."""
    out, err, result = io.StringIO(), io.StringIO(), []

    def call() -> None:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                result.append(main(list(argv)))
            except BaseException as exc:  # noqa: BLE001 - a traceback is what the tests look for
                import traceback

                err.write("Traceback\n" + "".join(traceback.format_exception(exc)))
                result.append(-1)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(20)
    if not result:
        unblock()
        worker.join(5)
        pytest.fail(f"orchestrator {' '.join(argv)} blocked")
    return result[0], out.getvalue(), err.getvalue()


def _feed(fifo: Path) -> Callable[[], None]:
    """What frees a reader blocked on ``fifo``: a writer that opens it and closes it at once."""
    def unblock() -> None:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    return unblock


def _shows_the_run_and_one_damaged_line(code: int, out: str, err: str, run_dir: Path, why: str) -> None:
    assert code == 0 and "Traceback" not in err, err
    assert RUN_ID in out and "FAILED" in out, out  # the run itself is still listed
    assert "rank 0 raised RuntimeError: boom" in out, out  # and the rest of what status says of it
    damaged = [line for line in out.splitlines() if "damaged" in line]
    assert len(damaged) == 1 and f"recovery.json in {run_dir} is damaged: " in damaged[0], out
    assert why in damaged[0], damaged


# ---- recovery.json: never blocking, never a traceback, never a hidden run ----------------------------------
@pytest.mark.parametrize("command", ["status", "list"])
def test_a_recovery_json_that_is_a_fifo_blocks_neither_status_nor_list(tmp_path: Path, command: str) -> None:
    run_dir = _run(tmp_path)
    os.mkfifo(run_dir / "recovery.json")
    code, out, err = _cli(command, unblock=_feed(run_dir / "recovery.json"))
    _shows_the_run_and_one_damaged_line(code, out, err, run_dir, "it is a FIFO (named pipe), not a regular file")


def test_a_recovery_json_linked_to_a_fifo_or_a_device_is_never_opened(tmp_path: Path) -> None:
    run_dir = _run(tmp_path)
    os.mkfifo(tmp_path / "pipe")
    os.symlink(tmp_path / "pipe", run_dir / "recovery.json")
    code, out, err = _cli("status", unblock=_feed(tmp_path / "pipe"))
    _shows_the_run_and_one_damaged_line(code, out, err, run_dir, "it is a symbolic link")
    (run_dir / "recovery.json").unlink()
    os.symlink("/dev/zero", run_dir / "recovery.json")  # a read that never ends, were it followed
    code, out, err = _cli("list")
    _shows_the_run_and_one_damaged_line(code, out, err, run_dir, "it is a symbolic link")


ATTEMPT = {"number": 1, "started": 100.0, "ended": 110.0, "outcome": "crash", "action": "restart",
           "times": {"ranks_at": 101.0, "failed_at": 109.0}}
SECOND = {"number": 2, "started": 112.0, "ended": 130.0, "outcome": "completed", "times": {"ranks_at": 113.0}}
WRONG_TYPES = {
    "attempts is text": ({"attempts": "x"}, "its 'attempts' is a string \"x\", not a list"),
    "attempts is a dict": ({"attempts": {"1": ATTEMPT}}, "its 'attempts' is an object"),
    "numbers as strings": ({"attempts": [{**ATTEMPT, "number": "1", "started": "100"}, SECOND]},
                           "its 'number' is a string \"1\", not a whole number"),
    "times as a list": ({"attempts": [{**ATTEMPT, "times": []}, SECOND]}, "its 'times' is a list"),
    "health as a list": ({"attempts": [{**ATTEMPT, "health": ["node1"]}, SECOND]}, "its 'health' is a list"),
    "an attempt as a number": ({"attempts": [ATTEMPT, 7]}, "attempt entry 2 is a number 7, not an object"),
    "excluded as a number": ({"attempts": [ATTEMPT, SECOND], "excluded": 5}, "its 'excluded' is a number 5"),
    "a whole file of text": ("[1, 2", "it is not JSON"),
}


@pytest.mark.parametrize("command", ["status", "list"])
@pytest.mark.parametrize("case", sorted(WRONG_TYPES))
def test_a_recovery_json_of_the_wrong_types_is_one_line_and_the_run_still_shows(tmp_path: Path, command: str,
                                                                                case: str) -> None:
    content, why = WRONG_TYPES[case]
    run_dir = _run(tmp_path, content if isinstance(content, str) else json.dumps(content))
    code, out, err = _cli(command)
    _shows_the_run_and_one_damaged_line(code, out, err, run_dir, why)


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_nan_or_infinite_time_is_damaged_not_recovered_in_nans(tmp_path: Path, bad: str) -> None:
    text = json.dumps({"attempts": [{**ATTEMPT, "times": {"ranks_at": 101.0, "failed_at": "BAD"}}, SECOND]})
    run_dir = _run(tmp_path, text.replace('"BAD"', bad))
    code, out, err = _cli("status")
    _shows_the_run_and_one_damaged_line(code, out, err, run_dir, "")
    assert "recovered in" not in out and "goodput" not in out, out  # no "recovered in nans"


def test_a_good_recovery_json_is_still_shown(tmp_path: Path) -> None:
    """The check refuses only what is wrong: what the supervisor writes (``History.save``) reads back."""
    _run(tmp_path, json.dumps({"attempts": [ATTEMPT, SECOND], "excluded": []}))
    code, out, _err = _cli("status")
    assert code == 0 and "damaged" not in out and "attempts: 2 (1 restart(s)" in out, out
    assert "recovered in 4.0s from attempt 1" in out, out


def _deny(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Opening any file called ``name`` fails as a file of another user does (the tests may run as
    root, whom a mode never stops)."""
    real = os.open

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.path.basename(os.fspath(path)) == name:
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(safe_read.os, "open", open_)


def test_a_recovery_json_this_user_may_not_read_is_no_permission_not_damaged(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = _run(tmp_path, json.dumps({"attempts": [ATTEMPT, SECOND]}))
    _deny(monkeypatch, "recovery.json")
    code, out, err = _cli("status")
    assert code == 0 and RUN_ID in out and "Traceback" not in err, err
    assert f"no permission to read {run_dir / 'recovery.json'}" in out and "damaged" not in out, out


# ---- report: the plots and the summary, with one line for what cannot be read -------------------------------
def _metrics(run_dir: Path) -> None:
    (run_dir / "metrics" / "rank-0.jsonl").write_text(
        '{"kind": "train", "step": 1, "loss": 0.5}\n{"kind": "train", "step": 2, "loss": 0.25}\n')


@pytest.mark.parametrize("case", ["numbers as strings", "times as a list", "health as a list"])
def test_report_with_a_damaged_recovery_json_still_reports(tmp_path: Path, case: str) -> None:
    pytest.importorskip("matplotlib")
    run_dir = _run(tmp_path, json.dumps(WRONG_TYPES[case][0]))
    _metrics(run_dir)
    code, out, err = _cli("report", str(run_dir))
    assert code == 0 and "Traceback" not in err, err
    assert "final train loss 0.2500" in out and f"recovery.json in {run_dir} is damaged: " in out, out
    assert (run_dir / "report" / "metrics.png").is_file()


def test_report_on_a_metrics_file_this_user_may_not_read_says_no_permission(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = _run(tmp_path)
    _metrics(run_dir)
    _deny(monkeypatch, "rank-0.jsonl")
    code, _out, err = _cli("report", str(run_dir))
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"no permission to read {run_dir / 'metrics' / 'rank-0.jsonl'}" in err and "damaged" not in err, err


# ---- the reader itself ----------------------------------------------------------------------------------
def test_a_huge_recovery_json_is_not_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("orchestrator.core.recovery.HISTORY_MAX_BYTES", 1000)
    (tmp_path / "recovery.json").write_text(json.dumps({"attempts": [ATTEMPT] * 100}))
    history, line = History.shown(tmp_path)
    assert history.attempts == [] and line is not None and "more than a record's 1000" in line, line
    assert History.load(tmp_path).attempts == []  # the attempt's owner starts a new one


def test_what_the_writer_saves_reads_back_unchanged(tmp_path: Path) -> None:
    history = History(tmp_path / "recovery.json")
    attempt = history.begin(1, ["node1"], tmp_path / "ckpt", job="77")
    attempt.times.update({"ranks_at": attempt.started + 1, "gate_s": 0.5})
    attempt.health["node2"] = "disk full"
    history.finish(attempt, "crash", "boom", progress=False, action="restart", blamed=["node1"], exclude=["node1"])
    again = History.read(tmp_path)
    assert again.attempts == history.attempts and again.excluded == ["node1"]


# ---- a rerun never moves an attempt's failures through a link ----------------------------------------------
def _failed_attempt(run_dir: Path) -> None:
    (run_dir / "errors").mkdir(parents=True)
    (run_dir / "errors" / "rank-0.json").write_text(json.dumps({"rank": 0, "attempt": 0, "message": "boom"}))
    (run_dir / "end.json").write_text('{"reason": "crash"}')


def _elsewhere(tmp_path: Path) -> tuple[Path, list[str]]:
    outside = tmp_path / "teammate"
    outside.mkdir()
    (outside / "notes.txt").write_text("mine\n")
    return outside, sorted(os.listdir(outside))


def test_a_rerun_refuses_a_linked_attempts_folder_before_moving_anything(tmp_path: Path) -> None:
    from orchestrator.core.errors import SubmissionError
    from orchestrator.core.run_folder import RunFolder
    from orchestrator.executors.previous_attempt import PreviousAttempt

    run_dir = tmp_path / "run"
    _failed_attempt(run_dir)
    outside, before = _elsewhere(tmp_path)
    os.symlink(outside, run_dir / "attempts")
    with pytest.raises(SubmissionError) as info:
        PreviousAttempt.put_aside(run_dir, [RunFolder(run_dir)])
    message = str(info.value)
    assert len(message.splitlines()) == 1 and f"{run_dir / 'attempts'} is a symbolic link to {outside}" in message
    assert "move the link out of" in message, message
    assert sorted(os.listdir(outside)) == before  # no attempts/1/errors made over there
    assert (run_dir / "errors" / "rank-0.json").is_file() and (run_dir / "end.json").is_file()
    assert not (run_dir / ".previous-attempt").exists()  # the run is as it was


def test_a_rerun_refuses_a_linked_sweep_point(tmp_path: Path) -> None:
    from orchestrator.core.errors import SubmissionError
    from orchestrator.core.run_folder import RunFolder
    from orchestrator.executors.previous_attempt import PreviousAttempt

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    outside, _ = _elsewhere(tmp_path)
    _failed_attempt(outside / "0000")
    before = sorted(str(p.relative_to(outside)) for p in outside.rglob("*"))
    (run_dir / "points").mkdir()
    os.symlink(outside / "0000", run_dir / "points" / "0000")
    with pytest.raises(SubmissionError, match="points/0000 is a symbolic link"):
        PreviousAttempt.put_aside(run_dir, [RunFolder(run_dir), RunFolder(run_dir / "points" / "0000")])
    assert sorted(str(p.relative_to(outside)) for p in outside.rglob("*")) == before


def test_between_attempts_nothing_is_moved_through_a_linked_attempts_folder(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``forget_attempt`` (the supervisor and the SLURM agent, between attempts) keeps nothing
    through the link, and says so in one line, instead of stopping the run."""
    from orchestrator.core.run_folder import RunFolder

    run_dir = tmp_path / "run"
    _failed_attempt(run_dir)
    outside, before = _elsewhere(tmp_path)
    os.symlink(outside, run_dir / "attempts")
    RunFolder(run_dir).forget_attempt()
    assert sorted(os.listdir(outside)) == before
    err = capsys.readouterr().err
    assert "failures are not kept" in err and f"{run_dir / 'attempts'} is a symbolic link" in err, err


def test_keeping_failures_never_blocks_on_a_fifo_traceback(tmp_path: Path) -> None:
    from orchestrator.core.run_folder import RunFolder

    run_dir = tmp_path / "run"
    _failed_attempt(run_dir)
    os.rename(run_dir / "errors" / "rank-0.json", run_dir / "errors" / "rank-1.json")
    os.mkfifo(run_dir / "errors" / "rank-0.json")  # read first: its attempt names the folder
    kept: list[Path | None] = []
    worker = threading.Thread(target=lambda: kept.append(RunFolder(run_dir).keep_failures()), daemon=True)
    worker.start()
    worker.join(20)
    if not kept:
        _feed(run_dir / "errors" / "rank-0.json")()
        worker.join(5)
        pytest.fail("keeping the previous attempt's failures blocked on a FIFO")
    assert kept == [run_dir / "attempts" / "1"] and (run_dir / "attempts" / "1" / "errors" / "rank-1.json").is_file()


# ---- the attempt markers: the script's look-alike lines do not move where an attempt starts ------------------
T1 = 1_717_401_600.25  # attempt 1 started; its ranks a moment later, its failure a minute later


def _local_marker_at(attempt: int, when: float, zone_s: int = 0) -> str:
    """The supervisor's marker (its own f-string, ``attempt_logs.local_marker``) written at ``when``
    by a supervisor whose clock reads ``zone_s`` ahead of UTC."""
    from tests.unit.test_attempt_views import _marker_template

    import ast
    import time as real_time
    from types import SimpleNamespace

    template = _marker_template("orchestrator/core/attempt_logs.py", "=== attempt ")
    text = real_time.asctime(real_time.gmtime(when + zone_s))  # what ctime() prints in that zone
    return eval(compile(ast.Expression(template), "local_marker", "eval"),  # noqa: S307 - our own source
                {"attempt": attempt, "time": SimpleNamespace(ctime=lambda: text)})


def _two_attempts() -> History:
    from orchestrator.core.recovery import Attempt

    return History(Path("recovery.json"), [
        Attempt(1, T1, ["h"], ended=T1 + 60, outcome="crash", action="restart", times={"ranks_at": T1 + 0.4}),
        Attempt(2, T1 + 61, ["h"], ended=T1 + 90, outcome="completed", times={"ranks_at": T1 + 61.3})])


def _forged_log(zone_s: int) -> tuple[str, str, str]:
    """Attempt 1's script prints attempt 2's marker, to the second, half a minute before attempt 2
    starts, then goes on; the supervisor's own marker follows when attempt 2 does start."""
    first = _local_marker_at(1, T1 + 0.1, zone_s) + "step 1\n"
    forged = _local_marker_at(2, T1 + 30, zone_s) + "step 2 of attempt 1\nTraceback: boom\n"
    second = _local_marker_at(2, T1 + 61.1, zone_s) + "resumed at step 2\n"
    return first + forged, second, first + forged + second


@pytest.mark.parametrize("zone_s", [0, 2 * 3600, 5 * 3600 + 45 * 60, -(3 * 3600 + 30 * 60)])
def test_a_script_line_claiming_the_next_attempt_at_another_time_does_not_split(zone_s: int) -> None:
    """Whatever the supervisor's zone: the time in a marker is read modulo a quarter hour."""
    from orchestrator.core.attempt_logs import AttemptStream, attempt_text, marker_rules

    one, two, log = _forged_log(zone_s)
    rules = marker_rules(_two_attempts())
    assert attempt_text(log, 1, rules) == one and attempt_text(log, 2, rules) == two
    stream = AttemptStream(1, rules)  # logs -f --attempt 1 stops at the supervisor's marker only
    assert stream.feed(log) == one and stream.done


def test_a_script_line_claiming_an_earlier_attempt_does_not_split() -> None:
    """Markers only go forward: attempt 2's script printing attempt 1's banner (or an old log) stays in attempt 2."""
    from orchestrator.core.attempt_logs import attempt_text, attempts_in

    first = _local_marker_at(1, T1) + "one\n"
    second = _local_marker_at(2, T1 + 61) + "two\n" + _local_marker_at(1, T1) + "echoed from the old log\n"
    assert attempt_text(first + second, 2) == second and attempts_in(first + second) == [1, 2]


def test_another_jobs_or_ranks_launcher_line_in_a_slurm_log_does_not_split() -> None:
    from orchestrator.core.attempt_logs import attempt_text, attempts_in
    from tests.unit.test_attempt_views import slurm_marker

    echoed = slurm_marker(0, 1, job="99") + slurm_marker(3, 1, job="78")  # another job's, another rank's
    log = slurm_marker(1, 0, job="78") + "epoch 0\n" + echoed + slurm_marker(1, 1, job="78") + "epoch 1\n"
    assert attempts_in(log) == [1, 2]
    assert attempt_text(log, 1) == slurm_marker(1, 0, job="78") + "epoch 0\n" + echoed
    # and the other backend's kind of marker, in a local log
    local = _local_marker_at(1, T1) + "one\n" + slurm_marker(0, 3, job="5") + _local_marker_at(2, T1 + 61) + "two\n"
    assert attempts_in(local) == [1, 2] and attempt_text(local, 2) == _local_marker_at(2, T1 + 61) + "two\n"


def test_logs_attempt_of_a_run_whose_script_forged_a_marker(tmp_path: Path) -> None:
    """``orchestrator logs --attempt K`` end to end: the run's recovery.json decides."""
    one, two, log = _forged_log(0)
    run_dir = _run(tmp_path)
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "rank-0.log").write_text(log)
    History(run_dir / "recovery.json", _two_attempts().attempts).save()
    code, out, err = _cli("logs", str(run_dir), "--attempt", "1")
    assert code == 0 and out == one, (out, err)
    code, out, err = _cli("logs", str(run_dir), "--attempt", "2")
    assert code == 0 and out == two, (out, err)


# ---- orchestrator diff: the run's code.json ------------------------------------------------------------------
def test_diff_on_a_code_json_that_is_a_fifo_says_damaged_without_blocking(tmp_path: Path) -> None:
    run_dir = _run(tmp_path)
    os.mkfifo(run_dir / "code.json")
    code, _out, err = _cli("diff", str(run_dir), unblock=_feed(run_dir / "code.json"))
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"the run's code record {run_dir / 'code.json'} is damaged: it is a FIFO" in err, err


def test_diff_on_a_code_json_this_user_may_not_read_says_no_permission(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = _run(tmp_path)
    (run_dir / "code.json").write_text(json.dumps({"id": "abc", "root": str(tmp_path), "manifest": "m.json"}))
    _deny(monkeypatch, "code.json")
    code, _out, err = _cli("diff", str(run_dir))
    assert code == 1 and "Traceback" not in err, err
    assert f"no permission to read {run_dir / 'code.json'}" in err and "damaged" not in err, err


def test_an_end_json_that_is_a_fifo_never_blocks_its_reader(tmp_path: Path) -> None:
    """end.json is read by status (every SLURM refresh of an ended job) and the agent."""
    import os
    import threading

    from orchestrator.node.forensics import read_end

    os.mkfifo(tmp_path / "end.json")
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(read_end(tmp_path)), daemon=True)
    thread.start()
    thread.join(5)
    assert got == [None], "reading a FIFO end.json blocked"
