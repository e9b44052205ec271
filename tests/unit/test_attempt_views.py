"""One attempt's part of a rank's log (``logs --attempt K``, ``Run.logs(attempt=K)``), and the
lines ``Run.wait`` prints as attempts start and end (``orchestrator.core.attempt_logs``)."""

from __future__ import annotations

import ast
import functools
import json
import os
import random
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator import api
from orchestrator.core.attempt_logs import (SCHEDULER_LAG_S, AttemptNotFoundError, AttemptStream, AttemptWatch, attempt_text, attempts_in,
                                       first_attempts, history_changes, job_of_log, read_history, split_attempts)
from orchestrator.cli import main
from orchestrator.core.errors import RunNotFoundError, UsageError
from orchestrator.core.records import RunRecord, register
from orchestrator.core.recovery import Attempt, History

ROOT = Path(__file__).resolve().parents[2]


# ---- the markers, rendered from the very f-strings that write them -----------------------------------
@functools.lru_cache(maxsize=None)
def _marker_template(module: str, start: str) -> ast.JoinedStr:
    for node in ast.walk(ast.parse((ROOT / module).read_text())):
        if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant) \
                and str(node.values[0].value).startswith(start):
            return node
    raise AssertionError(f"{module} no longer writes a line starting {start!r}: update orchestrator.core.attempt_logs")


def local_marker(attempt: int) -> str:
    """What the local supervisor (and a rejoin) writes before attempt ``attempt``
    (``attempt_logs.local_marker``), from its own f-string."""
    template = _marker_template("orchestrator/core/attempt_logs.py", "=== attempt ")
    return eval(compile(ast.Expression(template), "local_marker", "eval"),  # noqa: S307 - our own source
                {"attempt": attempt, "time": SimpleNamespace(ctime=lambda: "Mon Jun  3 10:00:00 2024")})


def slurm_marker(rank: int, restart: int, job: str = "77", host: str = "node2") -> str:
    """What orchestrator.backends.slurm.node.slurm_rank prints as a rank's first line in restart ``restart`` of ``job``."""
    template = _marker_template("orchestrator/backends/slurm/node/slurm_rank.py", "[launcher] rank ")
    names = {"rank": SimpleNamespace(rank=rank, world_size=4, local_rank=rank % 2, master_addr="node1",
                                     master_port=29500, init_method="tcp"),
             "os": SimpleNamespace(uname=lambda: SimpleNamespace(nodename=host)),
             "job": SimpleNamespace(job_id=job, restart=restart, attempt=restart)}
    return eval(compile(ast.Expression(template), "slurm_rank", "eval"), names) + "\n"  # noqa: S307


def test_the_rendered_markers_are_the_real_lines() -> None:
    assert local_marker(3).startswith("=== attempt 3 started ") and local_marker(3).endswith("===\n")
    assert slurm_marker(1, 2).startswith("[launcher] rank 1/4 (local 1) on node2, job 77 attempt 2, master node1:")


# ---- splitting ---------------------------------------------------------------------------------------
LOCAL_LOG = (local_marker(1) + "step 1/10\nTraceback: boom\n" + local_marker(2) + "step 2/10\nloss 0.5\n"
             + local_marker(3) + "done")


def test_a_local_log_splits_at_the_supervisors_markers() -> None:
    assert attempts_in(LOCAL_LOG) == [1, 2, 3]
    assert attempt_text(LOCAL_LOG, 1) == local_marker(1) + "step 1/10\nTraceback: boom\n"
    assert attempt_text(LOCAL_LOG, 2) == local_marker(2) + "step 2/10\nloss 0.5\n"
    assert attempt_text(LOCAL_LOG, 3) == local_marker(3) + "done"
    assert "".join(part for _, part in split_attempts(LOCAL_LOG)) == LOCAL_LOG


def test_a_slurm_log_splits_at_the_launcher_lines_counted_from_one() -> None:
    log = ("submitit INFO: starting\n" + slurm_marker(1, 0) + "epoch 0\n[launcher] rank 1 failed: RuntimeError\n"
           + slurm_marker(1, 1, host="node3") + "epoch 1\n")
    assert attempts_in(log) == [1, 2]
    assert attempt_text(log, 1) == "submitit INFO: starting\n" + slurm_marker(1, 0) + \
        "epoch 0\n[launcher] rank 1 failed: RuntimeError\n"
    assert attempt_text(log, 2) == slurm_marker(1, 1, host="node3") + "epoch 1\n"


def test_a_slurm_job_submitted_again_goes_on_counting_from_the_history() -> None:
    """The run's attempts 1-2 were job 77; job 78's restarts 0 and 1 are its attempts 3 and 4."""
    log = slurm_marker(0, 0, job="78") + "a\n" + slurm_marker(0, 1, job="78") + "b\n"
    history = History(Path("x"), [Attempt(1, 0.0, job="77"), Attempt(2, 1.0, job="77"), Attempt(3, 2.0, job="78"),
                                  Attempt(4, 3.0, job="78")])
    first = first_attempts(history)
    assert first == {"77": 1, "78": 3}
    assert attempts_in(log, first) == [3, 4]
    assert attempt_text(log, 4, first) == slurm_marker(0, 1, job="78") + "b\n"


def test_a_log_without_markers_is_attempt_one_only() -> None:
    log = "hello\nworld\n"
    assert attempt_text(log, 1) == log
    with pytest.raises(AttemptNotFoundError, match="attempt 2 is not in the log: it holds attempt 1$") as info:
        attempt_text(log, 2)
    assert info.value.present == [1] and isinstance(info.value, RunNotFoundError)


def test_a_missing_attempt_names_the_attempts_the_log_holds() -> None:
    """Attempt 2 was stopped by the health gate: no rank started, so no marker."""
    log = local_marker(1) + "one\n" + local_marker(3) + "three\n"
    with pytest.raises(AttemptNotFoundError, match="it holds attempts 1, 3$"):
        attempt_text(log, 2)
    with pytest.raises(AttemptNotFoundError, match="it holds attempts 1, 3$"):
        attempt_text(log, 4)


def test_lines_that_only_look_like_markers_do_not_split() -> None:
    log = (local_marker(1) + "  === attempt 2 started (indented) ===\n=== attempt x started ===\n"
           "[launcher] rank 0 failed: boom\nprint('[launcher] rank 1/4 (local 1) on h, job 7 attempt 3, master ')\n")
    assert attempts_in(log) == [1]


def _random_log(rng: random.Random, slurm: bool, start: int) -> tuple[str, int]:
    """A log of attempts start..start+n-1 (SLURM: restarts 0..n-1 of a job whose first attempt is ``start``)."""
    n = rng.randint(1, 4)
    parts = ["preamble\n"] if rng.random() < 0.5 else []
    for k in range(start, start + n):
        parts.append(slurm_marker(0, k - start) if slurm else local_marker(k))
        for i in range(rng.randint(0, 4)):
            parts.append(rng.choice([f"line {k}.{i}\n", "\rprogress 50%\rprogress 100%\n", "=== attempt\n",
                                     "[launcher] rank 0 failed: x\n"]))
    if rng.random() < 0.5:
        parts.append("no newline at the end")
    return "".join(parts), n


@pytest.mark.parametrize("slurm", [False, True])
def test_following_a_growing_log_gives_what_splitting_the_whole_gives(slurm: bool) -> None:
    """``logs -f --attempt K`` (K the latest) fed in random chunks prints attempt K's part, as
    splitting the whole log does, and stops at the next attempt's marker."""
    rng = random.Random(20240601 + slurm)
    for _ in range(300):
        start = rng.randint(1, 3)
        first = {"77": start} if slurm else None
        log, n = _random_log(rng, slurm, start)
        k = rng.randint(start, start + n - 1)
        stream, out, pos = AttemptStream(k, first), [], 0
        while pos < len(log) and not stream.done:
            size = rng.randint(1, 40)
            out.append(stream.feed(log[pos:pos + size]))
            pos += size
        out.append(stream.finish())
        assert "".join(out) == attempt_text(log, k, first), (log, k)
        assert stream.found and stream.done == (k < start + n - 1)


def test_following_passes_a_partial_line_on_at_once_unless_it_may_be_a_marker() -> None:
    stream = AttemptStream(1)
    assert stream.feed(local_marker(1) + "epoch 3: 40%") == local_marker(1) + "epoch 3: 40%"
    assert stream.feed("\repoch 3: 90%\n=== att") == "\repoch 3: 90%\n"
    assert stream.feed("empt 2 started now ===\nlater\n") == "" and stream.done


# ---- the CLI and the API on a run folder made here ------------------------------------------------------
def _history(folder: Path, *attempts: Attempt) -> None:
    History(folder / "recovery.json", list(attempts)).save()


def _local_run(tmp_path: Path, state: str = "COMPLETED") -> Path:
    run_dir = tmp_path / "runs" / "att-0123abcd"
    (run_dir / "logs").mkdir(parents=True)
    rec = RunRecord(run_id="att-0123abcd", run_dir=str(run_dir), executor="local", state=state, world_size=2,
                    attempts=3)
    rec.save()
    register(rec)
    (run_dir / "logs" / "rank-0.log").write_text(LOCAL_LOG)
    (run_dir / "logs" / "rank-1.log").write_text(local_marker(1) + "r1 first\n" + local_marker(3) + "r1 third\n")
    _history(run_dir, Attempt(1, 1.0, ["h"], outcome="crash", action="restart"),
             Attempt(2, 2.0, ["h"], outcome="unhealthy", why="disk full", action="restart"),
             Attempt(3, 3.0, ["h"], outcome="completed"))
    return run_dir


def test_cli_logs_attempt_prints_only_that_attempt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _local_run(tmp_path)
    assert main(["logs", str(run_dir), "--rank", "1", "--attempt", "3"]) == 0
    out, err = capsys.readouterr()
    assert out == local_marker(3) + "r1 third\n" and err == ""
    assert main(["logs", "att-0123abcd", "--attempt", "2"]) == 0
    assert capsys.readouterr().out == local_marker(2) + "step 2/10\nloss 0.5\n"
    assert main(["logs", str(run_dir)]) == 0  # without --attempt: the whole log, as before
    assert capsys.readouterr().out == LOCAL_LOG


def test_cli_logs_attempt_not_in_the_log_names_those_it_holds(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _local_run(tmp_path)
    assert main(["logs", str(run_dir), "--rank", "1", "--attempt", "2"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "attempt 2 is not in rank 1's log" in err and "it holds attempts 1, 3" in err, err
    assert "stopped by the health gate" in err, err
    assert main(["logs", str(run_dir), "--attempt", "7"]) == 1
    err = capsys.readouterr().err
    assert "it holds attempts 1, 2, 3" in err and "has had 3 attempt(s)" in err, err


def test_cli_logs_attempt_is_counted_from_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _local_run(tmp_path)
    for bad in ("0", "-1", "two"):
        with pytest.raises(SystemExit) as info:
            main(["logs", str(run_dir), "--attempt", bad])
        assert info.value.code == 2
        assert "counted from 1" in capsys.readouterr().err


def test_cli_follow_takes_only_the_latest_attempt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _local_run(tmp_path)
    assert main(["logs", str(run_dir), "-f", "--attempt", "2"]) == 2
    err = capsys.readouterr().err
    assert "--attempt 2 cannot be followed" in err and "latest attempt (3)" in err, err
    assert main(["logs", str(run_dir), "--rank", "1", "--follow", "--attempt", "3"]) == 0  # an ended run: its rest
    assert capsys.readouterr().out == local_marker(3) + "r1 third\n"


def test_cli_follow_stops_where_a_later_attempt_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """recovery.json still says attempt 2 is the latest, but attempt 3 has started in the log."""
    run_dir = _local_run(tmp_path)
    _history(run_dir, Attempt(1, 1.0, ["h"], outcome="crash", action="restart"), Attempt(2, 2.0, ["h"]))
    assert main(["logs", str(run_dir), "-f", "--attempt", "2"]) == 0
    out, err = capsys.readouterr()
    assert out == local_marker(2) + "step 2/10\nloss 0.5\n"
    assert "attempt 2 of att-0123abcd has ended and attempt 3 started" in err and "--attempt 3" in err, err


def test_api_logs_attempt(tmp_path: Path) -> None:
    run = api.Run.get(str(_local_run(tmp_path)))
    assert run.logs(rank=0, attempt=1) == local_marker(1) + "step 1/10\nTraceback: boom\n"
    assert run.logs(rank=0) == LOCAL_LOG
    with pytest.raises(RunNotFoundError, match="it holds attempts 1, 3"):
        run.logs(rank=1, attempt=2)
    for bad in (0, True, "1", 1.0):
        with pytest.raises(UsageError, match="counted from 1"):
            run.logs(attempt=bad)


def test_api_logs_attempt_of_a_slurm_job_submitted_again(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "sl-0123abcd"
    (run_dir / "slurm").mkdir(parents=True)
    rec = RunRecord(run_id="sl-0123abcd", run_dir=str(run_dir), executor="slurm", state="COMPLETED", world_size=2,
                    job_ids=["78"])
    rec.save()
    register(rec)
    (run_dir / "slurm" / "78_1_log.out").write_text(slurm_marker(1, 0, job="78") + "third\n"
                                                    + slurm_marker(1, 1, job="78") + "fourth\n")
    _history(run_dir, Attempt(1, 1.0, job="77", outcome="crash", action="restart"),
             Attempt(2, 2.0, job="77", outcome="requeued", action="requeue"), Attempt(3, 3.0, job="78"),
             Attempt(4, 4.0, job="78", outcome="completed"))
    run = api.Run.get(str(run_dir))
    assert run.logs(rank=1, attempt=4) == slurm_marker(1, 1, job="78") + "fourth\n"
    with pytest.raises(RunNotFoundError, match="it holds attempts 3, 4"):
        run.logs(rank=1, attempt=1)
    assert job_of_log(run_dir / "slurm" / "123_4_0_log.out") == "123_4"


# ---- what changed between two looks at recovery.json -------------------------------------------------------
CRASH = "rank 1 raised RuntimeError: boom"


def test_history_changes_reports_starts_and_ends() -> None:
    one = History(Path("x"), [Attempt(1, 10.0, ["node1"])])
    assert history_changes(None, one) == ["attempt 1 started on node1"]
    assert history_changes(one, one) == []
    two = History(Path("x"), [Attempt(1, 10.0, ["node1"], outcome="crash", why=CRASH + "\nTraceback...", action="restart"),
                              Attempt(2, 20.0, ["node2"])])
    assert history_changes(one, two) == [f"attempt 1 ended: crash ({CRASH}); restarting (recovery)",
                                         "attempt 2 started on node2"]
    three = History(Path("x"), [*two.attempts[:1],
                                Attempt(2, 20.0, ["node2"], outcome="requeued", action="requeue"),
                                Attempt(3, 30.0, ["node2", "node3"], outcome="node_failure", why="node3 failed",
                                        blamed=["node3"], action="stop")])
    assert history_changes(two, three) == [
        "attempt 2 ended: requeued; requeued for the time limit or a preemption",
        "attempt 3 started on node2,node3",
        "attempt 3 ended: node_failure (node3 failed); blamed: node3; not restarted"]
    assert history_changes(three, two) == []  # what vanished is not news
    done = History(Path("x"), [Attempt(1, 10.0, outcome="completed", why="the record's text")])
    assert history_changes(History(Path("x"), [Attempt(1, 10.0)]), done) == ["attempt 1 ended: completed"]


def test_history_changes_an_attempt_started_again() -> None:
    """History.begin replaces a record of the same number (its agent was restarted)."""
    old = History(Path("x"), [Attempt(2, 20.0, ["node2"], outcome="crash", action="restart")])
    new = History(Path("x"), [Attempt(2, 25.0, ["node4"])])
    assert history_changes(old, new) == ["attempt 2 started on node4"]


def test_history_changes_over_generated_histories() -> None:
    """Any history grown step by step: each attempt's start and end is said exactly once, in order."""
    rng = random.Random(7)
    outcomes = [("crash", "restart"), ("requeued", "requeue"), ("hang", "stop"), ("completed", ""), ("unhealthy", "restart")]
    for _ in range(200):
        history: list[Attempt] = []
        said: list[str] = []
        old: History | None = None
        for _ in range(rng.randint(1, 12)):
            if history and history[-1].outcome is None and rng.random() < 0.6:
                outcome, action = rng.choice(outcomes)
                history[-1] = Attempt(**{**history[-1].__dict__, "outcome": outcome, "action": action, "ended": 1.0})
            elif not history or history[-1].outcome is not None:
                history.append(Attempt(len(history) + 1, float(len(history)), [f"n{len(history)}"]))
            if rng.random() < 0.7:  # a look
                new = History(Path("x"), [Attempt(**a.__dict__) for a in history])
                said += history_changes(old, new)
                old = new
        said += history_changes(old, History(Path("x"), history))
        expected = []
        for a in history:
            expected.append(f"attempt {a.number} started on n{a.number - 1}")
            if a.outcome is not None:
                expected.append(f"attempt {a.number} ended: {a.outcome}")
        assert [s.split(";")[0] for s in said] == expected


def test_the_watch_reads_recovery_json_only_when_it_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[Any] = []
    real = History.load.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(History, "load", classmethod(lambda cls, d: loads.append(d) or real(cls, d)))
    watch = AttemptWatch(slurm=False)
    assert watch.look(tmp_path, False, []) == [] and loads == []  # no file: nothing read, nothing said
    _history(tmp_path, Attempt(1, 1.0, ["a"]))
    assert watch.look(tmp_path, False, []) == ["attempt 1 started on a"] and len(loads) == 1
    assert watch.look(tmp_path, False, []) == [] and len(loads) == 1  # unchanged: not read again
    _history(tmp_path, Attempt(1, 1.0, ["a"], outcome="crash", why=CRASH, action="restart"), Attempt(2, 2.0, ["b"]))
    assert watch.look(tmp_path, False, []) == [f"attempt 1 ended: crash ({CRASH}); restarting (recovery)",
                                               "attempt 2 started on b"]
    assert len(loads) == 2


def test_the_watchs_first_look_only_takes_note(tmp_path: Path) -> None:
    _history(tmp_path, Attempt(1, 1.0, ["a"], outcome="crash", action="restart"), Attempt(2, 2.0, ["b"]))
    watch = AttemptWatch(slurm=False)
    assert watch.look(tmp_path, False, []) == []
    _history(tmp_path, Attempt(1, 1.0, ["a"], outcome="crash", action="restart"),
             Attempt(2, 2.0, ["b"], outcome="completed"))
    assert watch.look(tmp_path, False, []) == ["attempt 2 ended: completed"]


@pytest.mark.parametrize("damage", ["{not json", "[]", '{"attempts": [{"number": "x"}]}', '{"attempts": 5}', "",
                                    "fifo", "folder"])
def test_a_missing_or_damaged_history_says_nothing(tmp_path: Path, damage: str) -> None:
    watch = AttemptWatch(slurm=True)
    assert watch.look(tmp_path, True, ["9"]) == []
    path = tmp_path / "recovery.json"
    if damage == "fifo":
        os.mkfifo(path)  # never opened: a read would block
    elif damage == "folder":
        path.mkdir()
    else:
        path.write_text(damage)
    assert read_history(tmp_path) is None
    assert watch.look(tmp_path, True, ["9"]) == []
    assert watch.look(tmp_path, True, ["9"]) == []


def test_a_slurm_job_pending_again_is_said_once_per_requeue(tmp_path: Path) -> None:
    watch = AttemptWatch(slurm=True)
    assert watch.look(tmp_path, True, ["9"]) == []  # pending before its first attempt: not "again"
    _history(tmp_path, Attempt(1, 1.0, ["a"], job="9", outcome="requeued", action="requeue"))
    assert watch.look(tmp_path, True, ["9"]) == [
        "attempt 1 started on a", "attempt 1 ended: requeued; requeued for the time limit or a preemption",
        "job 9 is pending again (requeued); waiting for an allocation"]
    assert watch.look(tmp_path, True, ["9"]) == []
    _history(tmp_path, Attempt(1, 1.0, ["a"], job="9", outcome="requeued", action="requeue"),
             Attempt(2, 2.0, ["b"], job="9", outcome="crash", why=CRASH, action="restart"))
    assert watch.look(tmp_path, True, ["9"]) == [
        "attempt 2 started on b", f"attempt 2 ended: crash ({CRASH}); restarting (recovery)",
        "job 9 is pending again (requeued); waiting for an allocation"]
    assert watch.look(tmp_path, False, ["9"]) == []


def test_an_earlier_submissions_history_is_not_pending_again(tmp_path: Path) -> None:
    _history(tmp_path, Attempt(1, 1.0, ["a"], job="8", outcome="completed"))
    assert AttemptWatch(slurm=True).look(tmp_path, True, ["9"]) == []
    assert AttemptWatch(slurm=False).look(tmp_path, True, [""]) == []  # local runs never pend again


@pytest.mark.parametrize("attempts", [True, False])
def test_wait_prints_the_attempts_as_they_change(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 attempts: bool) -> None:
    from orchestrator.core import procs

    run_dir = tmp_path / "runs" / "w-0123abcd"
    run_dir.mkdir(parents=True)
    rec = RunRecord(run_id="w-0123abcd", run_dir=str(run_dir), executor="local", state="RUNNING", world_size=1,
                    supervisor_pid=os.getpid(), supervisor_start=procs.start_time(os.getpid()))
    rec.save()
    register(rec)
    run = api.Run.get(str(run_dir))
    host = socket.gethostname()

    def story() -> None:
        time.sleep(0.5)
        _history(run_dir, Attempt(1, 1.0, [host]))
        time.sleep(0.5)
        _history(run_dir, Attempt(1, 1.0, [host], outcome="crash", why=CRASH, action="restart"),
                 Attempt(2, 2.0, [host]))
        time.sleep(0.5)
        _history(run_dir, Attempt(1, 1.0, [host], outcome="crash", why=CRASH, action="restart"),
                 Attempt(2, 2.0, [host], outcome="completed"))
        RunRecord.load(run_dir).update(state="COMPLETED")

    teller = threading.Thread(target=story, daemon=True)
    teller.start()
    assert run.wait(timeout=30, attempts=attempts) == "COMPLETED"
    teller.join(5)
    err = capsys.readouterr().err.splitlines()
    assert err == ([f"[orchestrator] attempt 1 started on {host}",
                    f"[orchestrator] attempt 1 ended: crash ({CRASH}); restarting (recovery)",
                    f"[orchestrator] attempt 2 started on {host}",
                    "[orchestrator] attempt 2 ended: completed"] if attempts else []), err
    assert len(json.loads((run_dir / "recovery.json").read_text())["attempts"]) == 2  # wait only reads it


def test_pending_just_after_the_attempt_started_is_the_schedulers_lag_not_a_requeue(tmp_path: Path) -> None:
    """sacct learns that a job started a few seconds after its agent recorded the attempt: a
    PENDING answer then is not "pending again" (issue 32: said for jobs SLURM never requeued)."""
    watch = AttemptWatch(slurm=True)
    assert watch.look(tmp_path, True, ["9"], now=100.0) == []
    _history(tmp_path, Attempt(1, 100.0, ["a"], job="9"))
    assert watch.look(tmp_path, True, ["9"], now=102.0) == ["attempt 1 started on a"]
    assert watch.look(tmp_path, True, ["9"], now=130.0) == []
    # Still running by its record a minute later while the scheduler says PENDING: SLURM requeued the
    # job without its agent recording the end (a node failure killed it).
    assert watch.look(tmp_path, True, ["9"], now=100.0 + SCHEDULER_LAG_S) == [
        "job 9 is pending again (requeued); waiting for an allocation"]
    assert watch.look(tmp_path, True, ["9"], now=500.0) == []
