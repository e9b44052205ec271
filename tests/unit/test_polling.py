"""Polite polling: every loop that waits on SLURM asks the scheduler as
``executors.slurm.SchedulerPacing`` says (10 s, x1.5 while the answer stays the same, at most
60 s; early once the run folder shows news), and sees the end the job's agent records in the run
folder within about a second.

The policy is tested on a fake clock; the loops (``Run.wait``, ``--follow``, ``logs -f``, the
remote status polling, ``cancel``) on a fake clock with a fake scheduler that counts its calls."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import api, remote
from orchestrator.front import operations
from orchestrator.backends.slurm.node import slurm_controller
from orchestrator.api import Run
from orchestrator.backends.slurm import executor as slurm
from orchestrator.backends.slurm.executor import SchedulerPacing
from orchestrator.core.records import RunRecord
from orchestrator.core.recovery import Attempt, History
from orchestrator.core.states import State


# ---- the policy ---------------------------------------------------------------------------------
def test_the_first_question_is_due_at_once_then_ten_seconds_growing_to_sixty() -> None:
    p = SchedulerPacing()
    assert p.due(0.0)
    delays = [p.answered(t, "RUNNING") for t in range(12)]
    assert delays[:6] == [10.0, 15.0, 22.5, 33.75, 50.625, 60.0] and set(delays[6:]) == {60.0}
    assert not p.due(11 + 59.9) and p.due(11 + 60.0)


def test_a_changed_answer_starts_again_at_ten_seconds() -> None:
    p = SchedulerPacing()
    for t in range(5):
        p.answered(t, State.PENDING)
    assert p.delay > 10.0
    assert p.answered(10.0, State.RUNNING) == 10.0 and p.next_at == 20.0
    assert p.answered(20.0, State.RUNNING) == 15.0


def test_news_in_the_run_folder_brings_the_next_question_to_a_second_then_backs_off() -> None:
    p = SchedulerPacing()
    p.answered(0.0, State.RUNNING)
    for t in (10.0, 25.0, 47.5):
        assert p.due(t)
        p.answered(t, State.RUNNING)  # next at 47.5 + 33.75
    p.folder_changed(50.0)  # the agent recorded the attempt's end
    assert not p.due(50.9) and p.due(51.0)
    # the scheduler has not caught up yet: 1 s, 1.5 s, 2.25 s... not one question a second
    assert [p.answered(t, State.RUNNING) for t in (51.0, 52.0, 53.5)] == [1.0, 1.5, 2.25]


def test_news_never_brings_a_question_forward_more_than_once_per_ten_seconds() -> None:
    p = SchedulerPacing()
    p.answered(0.0, State.RUNNING)
    p.folder_changed(2.0)
    assert p.next_at == 3.0
    p.answered(3.0, State.RUNNING)
    p.answered(4.0, State.PENDING)  # requeued: 10 s again
    assert p.next_at == 14.0
    p.folder_changed(6.0)  # news again, 3 s after the last early question: not before 3 + 10
    assert p.next_at == 13.0
    q = SchedulerPacing()
    q.answered(0.0, "x")
    q.folder_changed(9.5)  # the regular question (at 10) comes first anyway: nothing changes
    assert q.next_at == 10.0


def test_the_pacing_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="soon_s <= first_s <= most_s"):
        SchedulerPacing(first_s=10.0, most_s=5.0)
    with pytest.raises(ValueError, match="factor >= 1"):
        SchedulerPacing(factor=0.5)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(0.05, 20.0), st.booleans(), st.sampled_from(["PENDING", "RUNNING"])),
                min_size=1, max_size=200))
def test_no_story_asks_more_than_once_a_second_nor_often_without_news(steps) -> None:
    """Asked whenever due, over any story of answers and folder news: questions are at least a
    second apart; a story without news asks at least ten seconds apart; and each piece of news
    costs at most the handful of questions of one early chain (1, 1.5, 2.25... s up to 10 s)."""
    for with_news in (True, False):
        p = SchedulerPacing()
        now, asked, news = 0.0, [], 0
        for gap, changed, answer in steps:
            now += gap
            if changed and with_news:
                p.folder_changed(now)
                news += 1
            if p.due(now):
                if asked:
                    assert now - asked[-1] >= 1.0 - 1e-9
                    if not news:
                        assert now - asked[-1] >= 10.0 - 1e-9
                asked.append(now)
                p.answered(now, answer)
        assert len(asked) <= 2 + now / 10.0 + 7 * news


# ---- a fake clock, a fake scheduler, a fake agent -------------------------------------------------
class Story:
    """Time that passes only when a loop sleeps, a scheduler that answers from a timeline and
    counts its calls, and an agent that writes the run folder's files at given times."""

    def __init__(self, run_dir: Path, job: str, states: list[tuple[float, str]], sacct_from: float = 2.0) -> None:
        self.now = 0.0
        self.run_dir, self.job, self.states, self.sacct_from = run_dir, job, states, sacct_from
        self.calls: list[tuple[float, str]] = []
        self.events: list[tuple[float, Callable[[], None]]] = []

    def at(self, t: float, action: Callable[[], None]) -> None:
        self.events.append((t, action))
        self.events.sort(key=lambda e: e[0])

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += max(seconds, 1e-3)
        while self.events and self.events[0][0] <= self.now:
            self.events.pop(0)[1]()

    def state(self) -> str:
        return [s for t, s in self.states if t <= self.now][-1]

    def run(self, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        self.calls.append((self.now, cmd[0]))
        if cmd[0] == "sacct":
            out = f"{self.job}|{self.state()}\n" if self.now >= self.sacct_from else ""
        elif cmd[0] == "squeue":
            out = "" if self.state() in ("COMPLETED", "FAILED", "CANCELLED") else f"{self.job}|{self.state()}\n"
        else:
            raise AssertionError(f"unexpected command {cmd}")
        return subprocess.CompletedProcess(cmd, 0, out, "")

    def history(self, *attempts: Attempt) -> None:
        History(self.run_dir / "recovery.json", list(attempts)).save()


@pytest.fixture
def two_minute_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Story:
    """Job 4242: pending 5 s, its agent starts the attempt at 5 s and records its end at 125 s;
    the scheduler says RUNNING from 5 s and COMPLETED from 125.5 s."""
    monkeypatch.delenv("SLURM_CONF", raising=False)
    run_dir = tmp_path / "runs" / "two-0123abcd"
    run_dir.mkdir(parents=True)
    RunRecord(run_id="two-0123abcd", run_dir=str(run_dir), executor="slurm", job_ids=["4242"]).save()
    story = Story(run_dir, "4242", [(0.0, "PENDING"), (5.0, "RUNNING"), (125.5, "COMPLETED")])
    story.at(5.0, lambda: story.history(Attempt(1, 5.0, ["node1"], job="4242")))
    story.at(125.0, lambda: story.history(Attempt(1, 5.0, ["node1"], job="4242", ended=125.0, outcome="completed")))
    monkeypatch.setattr(api, "_now", story.clock)
    monkeypatch.setattr(api, "_sleep", story.sleep)
    monkeypatch.setattr(slurm_controller, "subprocess", SimpleNamespace(run=story.run, TimeoutExpired=subprocess.TimeoutExpired))
    return story


def _slurm_queries(story: Story) -> int:
    return len(story.calls)


def test_submit_wait_of_a_two_minute_job_asks_the_scheduler_at_most_15_times(two_minute_job: Story,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    story = two_minute_job
    assert Run(RunRecord.load(story.run_dir)).wait(attempts=True) == State.COMPLETED
    err = capsys.readouterr().err
    assert "attempt 1 started on node1" in err and "attempt 1 ended: completed" in err
    assert "pending again" not in err  # the state between two questions is never taken for a requeue
    assert _slurm_queries(story) <= 15, story.calls
    assert story.now <= 127.0, f"the end (at 125.5 s) was seen only at {story.now:.1f} s"
    times = [t for t, _ in story.calls]
    running = [t for t in times if 6.5 <= t <= 124.0]
    assert all(b - a >= 10.0 for a, b in zip(running, running[1:])), times  # while it runs: >= 10 s apart
    assert RunRecord.load(story.run_dir).state == State.COMPLETED


def test_follow_and_logs_f_ask_no_more_than_wait(two_minute_job: Story, capsys: pytest.CaptureFixture[str]) -> None:
    story = two_minute_job
    log = story.run_dir / "slurm" / "4242_0_log.out"
    story.at(6.0, lambda: (log.parent.mkdir(parents=True, exist_ok=True), log.write_text("epoch 0\n")))
    story.at(60.0, lambda: log.write_text("epoch 0\nepoch 1\n"))
    assert Run(RunRecord.load(story.run_dir)).wait(follow=True, attempts=False) == State.COMPLETED
    assert _slurm_queries(story) <= 15, story.calls
    assert story.now <= 127.0

    # logs -f looks at the log every 0.3 s: still the same few questions
    RunRecord.load(story.run_dir).update(state=State.PENDING, ended=None)
    (story.run_dir / "recovery.json").unlink()
    log.unlink()
    story.now, story.calls[:] = 0.0, []
    story.at(5.0, lambda: story.history(Attempt(1, 5.0, ["node1"], job="4242")))
    story.at(6.0, lambda: log.write_text("epoch 0\n"))
    story.at(125.0, lambda: story.history(Attempt(1, 5.0, ["node1"], job="4242", ended=125.0, outcome="completed")))
    capsys.readouterr()
    assert operations.logs(str(story.run_dir), 0, follow=True) == 0
    assert "epoch 0" in capsys.readouterr().out
    assert _slurm_queries(story) <= 15, story.calls
    assert story.now <= 127.0


def test_a_requeue_is_said_once_and_seen_soon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("SLURM_CONF", raising=False)
    run_dir = tmp_path / "rq-0123abcd"
    run_dir.mkdir()
    RunRecord(run_id="rq-0123abcd", run_dir=str(run_dir), executor="slurm", job_ids=["50"]).save()
    story = Story(run_dir, "50", [(0.0, "PENDING"), (5.0, "RUNNING"), (60.5, "PENDING"), (70.0, "RUNNING"),
                                  (130.5, "COMPLETED")])
    first = Attempt(1, 5.0, ["n1"], job="50")
    story.at(5.0, lambda: story.history(first))
    ended = Attempt(1, 5.0, ["n1"], job="50", ended=60.0, outcome="requeued", action="requeue")
    story.at(60.0, lambda: story.history(ended))
    story.at(70.0, lambda: story.history(ended, Attempt(2, 70.0, ["n2"], job="50")))
    story.at(130.0, lambda: story.history(ended, Attempt(2, 70.0, ["n2"], job="50", ended=130.0, outcome="completed")))
    monkeypatch.setattr(api, "_now", story.clock)
    monkeypatch.setattr(api, "_sleep", story.sleep)
    monkeypatch.setattr(slurm_controller, "subprocess", SimpleNamespace(run=story.run, TimeoutExpired=subprocess.TimeoutExpired))
    assert Run(RunRecord.load(run_dir)).wait() == State.COMPLETED
    err = capsys.readouterr().err
    assert err.count("job 50 is pending again (requeued)") == 1, err
    assert "attempt 2 started on n2" in err and story.now <= 132.0
    assert len(story.calls) <= 20, story.calls


def test_an_end_the_agent_did_not_record_is_still_seen_within_a_minute(two_minute_job: Story) -> None:
    """Killed with its node, or at the time limit: only the scheduler tells, within the 60 s cap."""
    story = two_minute_job
    story.events = [e for e in story.events if e[0] < 100.0]  # the agent never writes the end
    assert Run(RunRecord.load(story.run_dir)).wait(attempts=False) == State.COMPLETED
    assert 125.5 <= story.now <= 125.5 + 60.0 + 1.0
    assert _slurm_queries(story) <= 15


def test_an_end_another_client_recorded_needs_no_question(two_minute_job: Story) -> None:
    story = two_minute_job
    story.events = [e for e in story.events if e[0] < 100.0]
    story.at(70.0, lambda: RunRecord.load(story.run_dir).update(state=State.FAILED, ended=70.0))
    assert Run(RunRecord.load(story.run_dir)).wait(attempts=False) == State.FAILED
    assert story.now <= 71.5
    assert all(t < 70.0 for t, _ in story.calls)


def test_a_wait_with_a_timeout_still_paces_its_questions(two_minute_job: Story) -> None:
    from orchestrator.core.errors import WaitTimeoutError

    story = two_minute_job
    with pytest.raises(WaitTimeoutError, match="still RUNNING after 100s"):
        Run(RunRecord.load(story.run_dir)).wait(timeout=100, attempts=False)
    assert _slurm_queries(story) <= 10


def test_status_of_many_runs_is_one_scheduler_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_CONF", raising=False)
    calls: list[list[str]] = []

    def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "".join(f"{40 + i}|RUNNING\n" for i in range(5)), "")

    monkeypatch.setattr(slurm_controller, "subprocess", SimpleNamespace(run=run, TimeoutExpired=subprocess.TimeoutExpired))
    runs = []
    for i in range(5):
        folder = tmp_path / f"r{i}-0123abcd"
        folder.mkdir()
        RunRecord(run_id=folder.name, run_dir=str(folder), executor="slurm", job_ids=[str(40 + i)]).save()
        runs.append(Run(RunRecord.load(folder)))
    assert [r.state for r in api.refresh(runs)] == [State.RUNNING] * 5
    assert len(calls) == 1 and calls[0][0] == "sacct" and calls[0][-1] == "40,41,42,43,44"


# ---- --remote: the login node's status, paced the same way ----------------------------------------
def test_remote_status_polling_is_paced(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = SimpleNamespace(now=0.0)
    answers = [(0.0, "PENDING"), (30.0, "RUNNING"), (150.0, "COMPLETED")]
    asked: list[float] = []

    def run(argv, **kw) -> subprocess.CompletedProcess:
        asked.append(clock.now)
        state = [s for t, s in answers if t <= clock.now][-1]
        return subprocess.CompletedProcess(argv, 0, json.dumps([{"state": state, "run_dir": "/r"}]).encode(), b"")

    def sleep(seconds: float) -> None:
        clock.now += seconds

    ssh = SimpleNamespace(master_up=lambda: True, orchestrator=lambda args: ["ssh", *args])
    monkeypatch.setattr(remote, "subprocess", SimpleNamespace(run=run, DEVNULL=subprocess.DEVNULL, PIPE=subprocess.PIPE))
    row = remote._status_row(ssh, "r", until=lambda s: s.terminal, sleep=sleep, clock=lambda: clock.now)  # type: ignore[arg-type]
    assert row["state"] == "COMPLETED"
    assert all(b - a >= 10.0 for a, b in zip(asked, asked[1:])), asked
    assert len(asked) <= 10 and clock.now <= 150.0 + 60.0


# ---- cancel: one squeue call a question, paced, early when the agent records the end -------------
def test_cancel_waits_for_the_job_with_few_scheduler_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_CONF", raising=False)
    run_dir = tmp_path / "c-0123abcd"
    run_dir.mkdir()
    RunRecord(run_id="c-0123abcd", run_dir=str(run_dir), executor="slurm", state=State.RUNNING,
              job_ids=["77"]).save()
    story = Story(run_dir, "77", [(0.0, "RUNNING"), (8.0, "COMPLETING"), (9.0, "CANCELLED")])
    story.at(8.0, lambda: story.history(Attempt(1, 0.0, ["n1"], job="77", ended=8.0, outcome="cancelled")))
    scancels: list[tuple[float, tuple[str, ...]]] = []
    monkeypatch.setattr(slurm_controller, "subprocess", SimpleNamespace(run=story.run, TimeoutExpired=subprocess.TimeoutExpired))
    monkeypatch.setattr(slurm, "_scancel", lambda *a, quiet=False: scancels.append((story.now, a)))
    monkeypatch.setattr(slurm, "time", SimpleNamespace(monotonic=story.clock, sleep=story.sleep, time=lambda: story.now))
    monkeypatch.setattr(slurm.ownership, "request_cancel", lambda *a: None)
    record = slurm.SlurmExecutor().cancel(RunRecord.load(run_dir))
    assert record.state == State.CANCELLED
    squeues = [t for t, tool in story.calls if tool == "squeue"]
    assert 9.0 <= squeues[-1] <= 11.0, squeues  # gone at 9 s, seen within a couple of seconds
    assert len(squeues) <= 10, squeues  # the old loop asked four times a second
    assert [a for _, a in scancels][:2] == [("--state=PENDING", "77"), ("--signal=TERM", "77")]
    assert ("77",) in [a for _, a in scancels]  # COMPLETING, no longer RUNNING: the plain scancel follows
