"""Every recovery measured (orchestrator.core.attempt_times): the phases between two attempts, what
status says of them, and the goodput, on recorded attempts (no process)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from orchestrator.core.attempt_times import (Goodput, goodput, joined_at, phases_line, progress_at, progress_marks,
                                             recovery_phases, trained_until)
from orchestrator.core.progress import ProgressWriter
from orchestrator.core.recovery import Attempt, History, describe
from orchestrator.core.states import Action, Outcome


def _two_attempts() -> tuple[Attempt, Attempt]:
    first = Attempt(number=1, started=100.0, ended=131.0, outcome=Outcome.CRASH, action=Action.RESTART,
                    times={"ranks_at": 101.0, "joined_at": 104.0, "first_step_at": 105.0, "first_step": 0,
                           "last_step_at": 129.0, "last_step": 24, "failed_at": 130.0})
    second = Attempt(number=2, started=131.5, ended=160.0, outcome=Outcome.COMPLETED,
                     times={"gate_s": 0.5, "ranks_at": 132.0, "joined_at": 135.0, "first_step_at": 136.0,
                            "first_step": 21, "last_step_at": 159.0, "last_step": 50})
    return first, second


def test_a_recovery_is_told_phase_by_phase() -> None:
    first, second = _two_attempts()
    phases = recovery_phases(first, second)
    assert phases == {"teardown": 1.0, "wait": 0.5, "gate": 0.5, "launch": 0.0, "start": 3.0, "first step": 1.0,
                      "total": 6.0}
    assert phases_line(phases) == "recovered in 6.0s (teardown 1.0, wait 0.5, gate 0.5, start 3.0, first step 1.0)"
    assert recovery_phases(first, Attempt(number=2, started=131.5)) is None  # an attempt that never started ranks
    assert recovery_phases(Attempt(number=1, started=1.0), second) is None  # a failure never recorded
    completed = Attempt(number=1, started=100.0, ended=131.0, outcome=Outcome.COMPLETED, times=dict(first.times))
    assert recovery_phases(completed, second) is None  # the same spec run again later: no recovery


def test_status_shows_the_recovery_under_the_attempt_it_brought_back(tmp_path: Path) -> None:
    history = History(tmp_path / "recovery.json", list(_two_attempts()))
    history.save()
    shown = describe(History.load(tmp_path))
    assert shown[2] == "  attempt 2: completed" and shown[3].startswith("    recovered in 6.0s from attempt 1 (teardown 1.0"), shown


def test_goodput_counts_training_and_sets_queue_recovery_and_lost_work_apart() -> None:
    first, second = _two_attempts()
    g = goodput([first, second], submitted=90.0, now=200.0)
    assert g is not None
    # training 105..129 and 136..159; steps 21..24 were done again: 3 steps at 1 s each; the recovery:
    # 6 s from the failure seen, and the second from the last step (129) to it (130)
    assert (g.wall_s, g.queue_s, g.startup_s, g.recovery_s, g.lost_s) == (70.0, 10.0, 5.0, 7.0, 3.0)
    assert g.productive_s == 24.0 + 23.0 - 3.0
    assert g.line().startswith(f"goodput {44 / 70:.1%}: 44s training of 70s since submit")


def test_a_run_submitted_again_counts_only_this_submissions_attempts() -> None:
    """The spec failed without a restart left and was submitted again an hour later (the same run
    folder, its history kept): the goodput is the new submission's, never over 100 %."""
    first, second = _two_attempts()
    stopped = Attempt(number=1, started=first.started, ended=first.ended, outcome=Outcome.CRASH, action=Action.STOP,
                      times=dict(first.times))
    again = Attempt(number=2, started=3700.0, ended=3730.0, outcome=Outcome.COMPLETED,
                    times={"ranks_at": 3702.0, "joined_at": 3705.0, "last_step_at": 3729.0, "last_step": 50})
    g = goodput([stopped, again], submitted=3690.0, now=4000.0)
    assert g is not None
    assert (g.wall_s, g.queue_s, g.startup_s, g.recovery_s, g.lost_s, g.productive_s) == (40.0, 10.0, 5.0, 0.0, 0.0, 24.0)
    assert goodput([stopped], submitted=3690.0, now=3695.0) is None  # nothing of this submission trained yet


def test_no_goodput_before_anything_trained() -> None:
    assert goodput([Attempt(number=1, started=5.0)], 1.0, 9.0) is None
    assert goodput([], 1.0, 9.0) is None


@given(st.lists(st.tuples(st.floats(0, 50), st.floats(0, 50), st.floats(0, 50)), min_size=1, max_size=6),
       st.floats(0, 100), st.integers(0, 5))
@example(gaps=[(0.0, 1.0, 0.0), (0.0, 1.0, 0.0)], queue=0.0, resubmitted=1)  # the previous attempt ended as it was resubmitted
@example(gaps=[(0.0, 0.0, 0.0)], queue=0.0, resubmitted=0)  # an attempt of no length, at the submission
def test_goodput_is_a_fraction_of_the_wall_time_whatever_was_recorded(gaps: list[tuple[float, float, float]],
                                                                      queue: float, resubmitted: int) -> None:
    attempts, t = [], 1000.0 + queue
    for i, (start, train, fail) in enumerate(gaps):
        a = Attempt(number=i + 1, started=t, times={"ranks_at": t + start, "joined_at": t + start})
        t += start + train
        a.times["failed_at"] = t
        a.ended = t + fail
        t += fail
        attempts.append(a)
    g = goodput(attempts, submitted=1000.0, now=t + 1)
    assert isinstance(g, Goodput) and 0.0 <= g.fraction <= 1.0 + 1e-9
    assert g.productive_s <= g.wall_s + 1e-6
    # submitted again just before one of the attempts: only that one and those after it count
    since = attempts[min(resubmitted, len(attempts) - 1)].started
    g = goodput(attempts, submitted=since, now=t + 1)
    assert isinstance(g, Goodput) and 0.0 <= g.fraction <= 1.0 + 1e-9 and g.queue_s == 0.0


def test_the_watchdogs_joins_and_the_rank_apis_first_and_last_steps(tmp_path: Path) -> None:
    assert joined_at({0: 3.0, 1: 5.0}, 2) == {"joined_at": 5.0}
    assert joined_at({0: 3.0}, 2) == {}  # rank 1 never joined
    for rank in (0, 1):
        writer = ProgressWriter(tmp_path, rank, min_interval_s=0.0)
        writer.report(10 + rank)
        writer.report(20 + rank)
    marks = progress_marks(tmp_path, 2, since=0.0)
    assert (marks["first_step"], marks["last_step"]) == (10.0, 20.0)
    assert marks["first_step_at"] <= marks["last_step_at"]
    assert progress_marks(tmp_path, 3, since=0.0).keys() == {"last_step_at", "last_step"}  # rank 2 never stepped
    assert progress_marks(tmp_path, 2, since=marks["last_step_at"] + 1) == {}  # an earlier attempt's reports


def test_a_running_jobs_goodput_adds_up_while_it_runs(tmp_path: Path) -> None:
    """Issue 51, item 4: the running attempt's agent records its moments only when it ends; status
    reads them from the ranks' progress files meanwhile (``with_live_marks``), and a recovery still
    under way counts as recovery, so training + queue + start-up + recovery + lost work make the
    wall time since submit at every moment, not only at the end."""
    import time as clock

    from orchestrator.core.attempt_times import with_live_marks

    first, _ = _two_attempts()
    recovering = Attempt(number=2, started=131.5, times={})
    g = goodput([first, recovering], submitted=90.0, now=140.0)
    assert g is not None and g.recovery_s == 11.0  # its last step at 129, failed at 130, not training yet at 140
    assert g.productive_s + g.queue_s + g.startup_s + g.recovery_s + g.lost_s == g.wall_s
    now = clock.time()
    first = Attempt(number=1, started=now - 40, ended=now - 10, outcome=Outcome.CRASH, action=Action.RESTART,
                    times={"ranks_at": now - 39, "first_step_at": now - 35, "first_step": 1, "last_step_at": now - 11,
                           "last_step": 24, "failed_at": now - 10.5})
    running = Attempt(number=2, started=now - 10, times={"ranks_at": now - 9.9})
    for rank, step in ((0, 25), (1, 25)):  # both ranks trained again from step 25 (survivors kept: nothing lost)
        writer = ProgressWriter(tmp_path, rank)
        writer.report(step, force=True)
    live = with_live_marks([first, running], tmp_path, 2)
    assert live[0] is first and "first_step_at" in live[1].times and running.times == {"ranks_at": now - 9.9}
    g = goodput(live, submitted=now - 41, now=clock.time())
    assert g is not None and g.recovery_s > 10.0 and g.lost_s == 0.0
    assert abs(g.productive_s + g.queue_s + g.startup_s + g.recovery_s + g.lost_s - g.wall_s) <= 2.0


def test_a_survivors_last_step_the_throttled_reports_missed_counts_as_training(tmp_path: Path) -> None:
    """Reports are written at most once a second: the failed attempt's last one written (129.0 here)
    may be older than its last step. A survivor that rejoins (``progress.rejoined``) carries that step
    and its time into the next attempt's reports (``kept_last_step_at``); goodput counts the time up
    to it as training and only the rest as recovery. A kept step after the failure (another clock,
    another attempt) is not believed."""
    import time as clock

    from orchestrator.core import progress

    writer = ProgressWriter(tmp_path, 0, min_interval_s=60.0)
    writer.report(24, force=True)
    last = clock.time()
    writer.report(26)  # not written: within the interval
    assert progress.read_progress(tmp_path, 1)[0].step == 24  # type: ignore[union-attr]
    progress.rejoined()
    writer.report(27, force=True)  # the new attempt's first report carries the kept step
    marks = progress_marks(tmp_path, 1, since=0.0)
    assert marks["kept_last_step"] == 26.0 and last <= marks["kept_last_step_at"] <= clock.time()
    assert progress.read_progress(tmp_path, 1)[0].rss_mb  # type: ignore[union-attr]

    first, second = _two_attempts()
    before = goodput([first, second], submitted=90.0, now=200.0)
    second.times.update({"kept_last_step_at": 129.8, "kept_last_step": 25.0})
    after = goodput([first, second], submitted=90.0, now=200.0)
    assert before is not None and after is not None
    assert round(after.productive_s - before.productive_s, 6) == round((129.8 - 129.0) - after.lost_s + before.lost_s, 6)
    assert round(before.recovery_s - after.recovery_s, 6) == 0.8  # the failure seen at 130.0
    assert round(after.wall_s - (after.productive_s + after.queue_s + after.startup_s + after.recovery_s
                                 + after.lost_s), 6) == round(before.wall_s - (before.productive_s + before.queue_s
                                                                              + before.startup_s + before.recovery_s
                                                                              + before.lost_s), 6)
    second.times.update({"kept_last_step_at": 131.0})  # after the failure seen: not this attempt's step
    assert goodput([first, second], submitted=90.0, now=200.0) == before


def _hung_once() -> tuple[Attempt, Attempt]:
    """The tester's hang (spec_hang1: watchdog.stall_s 6, a script without the rank API): rank 1 slept
    at step 2; its last output at 750.6, the stall seen at 756.67 (stall_s later, and the stacks)."""
    first = Attempt(number=1, started=743.8, ended=756.8, outcome=Outcome.HANG, action=Action.RESTART,
                    times={"gate_s": 0.005, "ranks_at": 748.3, "joined_at": 749.3, "progress_at": 750.6,
                           "failed_at": 756.67})
    second = Attempt(number=2, started=756.8, ended=759.6, outcome=Outcome.COMPLETED,
                     times={"gate_s": 0.003, "ranks_at": 756.85, "joined_at": 757.9})
    return first, second


def test_a_hangs_stall_window_is_recovery_not_training() -> None:
    """The explore report's bug: "9s training of 16s" for about 3 s of steps. The stall_s in which
    no rank progressed, up to the failure seen, counts as the recovery that follows, not as training."""
    first, second = _hung_once()
    g = goodput([first, second], submitted=743.5, now=800.0)
    assert g is not None
    assert round(g.productive_s, 6) == round((750.6 - 749.3) + (759.6 - 757.9), 6)  # 3.0 s, was 9.07
    assert round(g.recovery_s, 6) == round((756.67 - 750.6) + (757.9 - 756.67), 6)  # the stall, then the restart
    assert g.lost_s == 0.0 and round(g.startup_s, 6) == round(749.3 - 743.8, 6)
    assert round(g.productive_s + g.queue_s + g.startup_s + g.recovery_s + g.lost_s, 6) == round(g.wall_s, 6)
    assert g.line() == ("goodput 18.6%: 3s training of 16s since submit (queue 0s, start-up 6s, recovery 7s, "
                        "lost work 0s)"), g.line()
    phases = recovery_phases(first, second)  # its phases still count from the failure seen
    assert phases is not None and round(phases["total"], 6) == round(757.9 - 756.67, 6)


def test_a_failed_attempt_trains_until_its_last_progress_never_past_its_failure() -> None:
    first, second = _hung_once()
    assert trained_until(first, now=900.0) == 750.6
    assert trained_until(second, now=900.0) == 759.6  # completed: its end (no failure, no step)
    stepped = Attempt(number=1, started=1.0, ended=20.0, times={"last_step_at": 12.0, "progress_at": 14.0,
                                                                "failed_at": 19.0})
    assert trained_until(stepped, now=900.0) == 12.0  # the rank API's last step first
    late = Attempt(number=1, started=1.0, ended=20.0, times={"progress_at": 19.5, "failed_at": 19.0})
    assert trained_until(late, now=900.0) == 19.0  # a look after the failure seen is not training
    # a hang before anything trained: the stall is start-up, never counted twice as recovery
    early = Attempt(number=1, started=743.8, ended=756.8, outcome=Outcome.HANG, action=Action.RESTART,
                    times={"ranks_at": 748.3, "joined_at": 749.3, "progress_at": 748.3, "failed_at": 756.67})
    g = goodput([early, _hung_once()[1]], submitted=743.5, now=800.0)
    assert g is not None and round(g.recovery_s, 6) == round(757.9 - 749.3, 6)
    assert round(g.productive_s + g.queue_s + g.startup_s + g.recovery_s + g.lost_s, 6) == round(g.wall_s, 6)


def test_the_watchdogs_last_progress_is_recorded_only_with_a_stall_clock() -> None:
    """``progress_at`` from the stall watchdog's looks (any script: output, a join, a report). Without
    watchdog.stall_s the watchdog stops looking once every rank has joined: no moment."""
    from orchestrator.node.watchdog import Watch

    watch = Watch(2, started=100.0, stall_s=6.0)
    watch.observe(101.0, {0: 10, 1: 10}, {}, [0, 1])  # both joined at 101
    watch.observe(103.0, {0: 20, 1: 10}, {}, [])  # rank 0 printed a step at 103; rank 1 hangs from here
    watch.observe(109.0, {0: 20, 1: 10}, {}, [])
    assert watch.stalled(109.0) and progress_at(watch) == {"progress_at": 103.0}
    unwatched = Watch(2, started=100.0, stall_s=None)
    unwatched.observe(101.0, {0: 10, 1: 10}, {}, [0, 1])
    assert progress_at(unwatched) == {}


def test_the_reports_timeline_shows_a_hangs_stall_apart_from_training() -> None:
    from orchestrator.front.report import plot_timeline

    class Axes:
        def __init__(self) -> None:
            self.bars: list[tuple[float, float, str]] = []

        def broken_barh(self, spans: list[tuple[float, float]], _row: tuple[float, float], facecolors: str) -> None:
            self.bars += [(round(start, 6), round(width, 6), facecolors) for start, width in spans]

        def set_yticks(self, *_args: object) -> None: ...

        def invert_yaxis(self) -> None: ...

        def set(self, **_kwargs: object) -> None: ...

    ax = Axes()
    plot_timeline(ax, list(_hung_once()))
    t0 = 743.8
    green, orange = [(round(749.3 - t0, 6), round(750.6 - 749.3, 6), "tab:green"),
                     (round(750.6 - t0, 6), round(756.67 - 750.6, 6), "tab:orange")]
    assert ax.bars[1:3] == [green, orange], ax.bars
    assert [c for _, _, c in ax.bars[3:]] == ["tab:red", "lightgrey", "tab:green"]  # teardown; attempt 2 to its end
