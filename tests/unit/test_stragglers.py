"""orchestrator.core.stragglers: the straggler is the rank whose time outside collectives is at
least the factor times the others' median; no one else, and no one when the ranks are alike."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.core.stragglers import Persistent, Straggler, straggler, this_attempts_busy


def test_a_rank_four_times_slower_is_named_and_alike_ranks_are_not() -> None:
    found = straggler({0: 0.010, 1: 0.041, 2: 0.011, 3: 0.010}, 1.5)
    assert found is not None and found.rank == 1 and abs(found.ratio - 4.1) < 1e-9
    assert "rank 1 on node2 spends 41 ms a step outside collectives, 4.1x the other ranks' median (10 ms)" in found.line("node2")
    assert straggler({0: 0.010, 1: 0.013, 2: 0.011}, 1.5) is None  # noise, not a straggler
    assert straggler({0: 0.010, 1: None}, 1.5) is None  # one rank measured: nothing to compare
    assert straggler({0: 0.0001, 1: 0.0009}, 1.5) is None  # too short to compare


@given(busy=st.dictionaries(st.integers(0, 15), st.floats(0.002, 10.0), min_size=2, max_size=16),
       factor=st.floats(1.1, 5.0))
def test_the_named_rank_is_the_slowest_and_at_least_factor_times_the_others_median(busy: dict[int, float],
                                                                                    factor: float) -> None:
    import statistics

    found = straggler(busy, factor)
    worst = max(busy.values())
    median = statistics.median(sorted(busy.values())[:-1])
    if found is None:
        assert worst < factor * median
    else:
        assert busy[found.rank] == worst and worst >= factor * median


def _named(rank: int) -> Straggler:
    return Straggler(rank=rank, ratio=4.0, busy_s=0.04, median_s=0.01)


def test_a_straggler_counts_once_named_for_the_window_and_a_missed_look_breaks_nothing() -> None:
    watch = Persistent(10.0)
    assert watch.observe(0.0, _named(1)) is None
    assert watch.observe(9.9, _named(1)) is None  # the looks do not cover the window yet
    found = watch.observe(10.0, _named(1))
    assert found is not None and found.rank == 1
    assert watch.observe(11.0, None) is None  # the last look must name it
    assert watch.observe(12.0, _named(1)) is not None  # 4 of the 5 looks since 0 s name it
    assert watch.observe(13.0, _named(0)) is None  # another rank now: 1 of 6
    assert "for 10s (watchdog.straggler_window_s)" in watch.message(_named(1), "node2")
    flicker = Persistent(10.0)
    assert not any(flicker.observe(float(t), _named(1) if t % 2 else None) for t in range(40))  # half the looks


@given(looks=st.lists(st.tuples(st.floats(0.01, 5.0), st.sampled_from([None, 0, 1])), min_size=1, max_size=60),
       window=st.floats(0.5, 30.0))
def test_a_straggler_is_reported_only_when_named_now_and_through_the_window(
        looks: list[tuple[float, int | None]], window: float) -> None:
    from orchestrator.core.stragglers import PERSISTENT_SHARE

    watch = Persistent(window)
    now, seen, streak_since = 0.0, [], None
    for gap, rank in looks:
        now += gap
        seen.append((now, rank))
        streak_since = (streak_since if streak_since is not None and seen[-2:-1] and seen[-2][1] == rank
                        else now) if rank is not None else None
        found = watch.observe(now, None if rank is None else _named(rank))
        if found is not None:
            assert found.rank == rank and now - seen[0][0] >= window  # named now; the looks cover the window
            recent = [r for t, r in seen if t > now - window]
            assert sum(r == rank for r in recent) >= PERSISTENT_SHARE * len(recent) - 1
        if streak_since is not None and now - streak_since >= window:
            assert found is not None  # named at every look for the whole window: reported


def test_only_this_attempts_reports_count() -> None:
    from orchestrator.core.progress import Progress

    def report(at: float, busy: float | None) -> Progress:
        return Progress(rank=0, time=at, step=3, total=None, steps_per_s=None, samples_per_s=None, attempt=0, busy_s=busy)

    assert this_attempts_busy([report(100.0, 0.02), report(90.0, 0.08), None, report(101.0, None)], 95.0) == {
        0: 0.02, 1: None, 2: None, 3: None}
