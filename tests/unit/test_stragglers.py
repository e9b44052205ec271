"""orchestrator.core.stragglers: the straggler is the rank whose time outside collectives is at
least the factor times the others' median; no one else, and no one when the ranks are alike."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.core.stragglers import straggler


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
