"""orchestrator.core.stragglers: the straggler is the rank whose time outside collectives is at
least the factor times the others' median; no one else, and no one when the ranks are alike."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.core.stragglers import MIN_BUSY_S, TRIM, Persistent, straggler, this_attempts_busy


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
    if found is None:  # alike, or too short a step to compare (MIN_BUSY_S)
        assert worst < factor * median or worst < MIN_BUSY_S
    else:
        assert busy[found.rank] == worst and worst >= factor * median and worst >= MIN_BUSY_S


def test_a_straggler_counts_by_its_mean_over_the_window_while_still_slower() -> None:
    watch = Persistent(10.0, 1.5)
    assert watch.observe(0.0, {0: 0.010, 1: 0.040}) is None
    assert watch.observe(9.9, {0: 0.010, 1: 0.040}) is None  # the looks do not cover the window yet
    found = watch.observe(10.0, {0: 0.010, 1: 0.012})  # a look under the factor: the mean still says 3x
    assert found is not None and found.rank == 1 and abs(found.busy_s - 0.092 / 3) < 1e-9
    assert watch.observe(11.0, {0: 0.010, 1: 0.009}) is None  # no longer slower than the others now
    assert "over 10s (watchdog.straggler_window_s)" in watch.message(found, "node2")
    flicker = Persistent(10.0, 1.5)  # above the factor at one look, alike at the next: judged on the mean
    assert flicker.observe(0.0, {0: 0.010, 1: 0.010}) is None
    found = None
    for t in range(1, 12):
        found = flicker.observe(float(t), {0: 0.010, 1: 0.030 if t % 2 else 0.011}) or found
    assert found is not None and found.rank == 1
    alike = Persistent(10.0, 1.5)
    assert not any(alike.observe(float(t), {0: 0.010, 1: 0.0105 + 0.001 * (t % 3)}) for t in range(40))
    checkpointing = Persistent(10.0, 1.5)  # rank 0 writes a checkpoint: seconds in one look of eleven
    assert not any(checkpointing.observe(float(t), {0: 2.0 if t == 5 else 0.0102, 1: 0.0100}) for t in range(30))
    unseen = Persistent(2.0, 1.5)  # a rank measured in fewer than half the looks is not judged
    assert not any(unseen.observe(float(t), {0: 0.010, 1: 0.040 if t % 4 == 0 else None}) for t in range(12))


@given(looks=st.lists(st.tuples(st.floats(0.01, 5.0), st.floats(0.001, 0.1), st.floats(0.001, 0.1)),
                      min_size=1, max_size=60),
       window=st.floats(0.5, 30.0), factor=st.floats(1.1, 4.0))
def test_a_straggler_is_reported_only_by_its_window_mean_once_the_looks_cover_the_window(
        looks: list[tuple[float, float, float]], window: float, factor: float) -> None:
    watch = Persistent(window, factor)
    now, seen = 0.0, []
    for gap, a, b in looks:
        now += gap
        seen.append((now, a, b))
        found = watch.observe(now, {0: a, 1: b})
        if found is None:
            continue
        assert now - seen[0][0] >= window  # the looks cover the window
        start = max(t for t, _, _ in seen if t <= now - window)
        kept = [(x, y) for t, x, y in seen if t >= start]

        def trimmed(values: list[float]) -> float:
            values = sorted(values)[:len(values) - len(values) // TRIM]
            return sum(values) / len(values)

        means = [trimmed([x for x, _ in kept]), trimmed([y for _, y in kept])]
        other = 1 - found.rank
        assert means[found.rank] >= factor * max(means[other], MIN_BUSY_S / factor) - 1e-12
        assert (a, b)[found.rank] > (a, b)[other]  # still the slower one now


def test_only_this_attempts_reports_count() -> None:
    from orchestrator.core.progress import Progress

    def report(at: float, busy: float | None) -> Progress:
        return Progress(rank=0, time=at, step=3, total=None, steps_per_s=None, samples_per_s=None, attempt=0, busy_s=busy)

    assert this_attempts_busy([report(100.0, 0.02), report(90.0, 0.08), None, report(101.0, None)], 95.0) == {
        0: 0.02, 1: None, 2: None, 3: None}
