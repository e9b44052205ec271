"""orchestrator.watchdog.Watch and judge: when a job is judged, and when there is nothing left to
judge (the supervisors then stop reading the ranks' files). Generated sequences of looks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.watchdog import Watch, judge

looks = st.lists(st.tuples(st.floats(0, 50), st.lists(st.integers(0, 7), max_size=8)), max_size=12)


def _no_stacks(reason: str, always: bool) -> dict[int, str]:
    return {}


@given(world=st.integers(1, 8), stall=st.one_of(st.none(), st.floats(1, 30)),
       init=st.one_of(st.none(), st.floats(1, 30)), seq=looks)
def test_a_settled_watch_never_gives_a_verdict_again(world: int, stall: float | None, init: float | None,
                                                     seq: list[tuple[float, list[int]]]) -> None:
    """Once settled, no later look (with any joins, at any time) can produce a verdict: stopping
    the looks loses nothing. And without a stall watchdog, every rank joined means settled."""
    watch = Watch(world, 0.0, stall, init)
    now, settled_at = 0.0, None
    for step, joined in seq:
        now += step
        if settled_at is not None:
            assert watch.settled()
            assert judge(watch, now, lambda: [], _no_stacks) is None
        watch.observe(now, {r: 0 for r in range(world)}, {}, [r for r in joined if r < world])
        if watch.settled() and settled_at is None:
            settled_at = now
            if judge(watch, now, lambda: [], _no_stacks) is not None:
                return  # a verdict ends the job before anyone would look again
    if not stall and (init is None or world == 1 or len(watch.joined) == world):
        assert watch.settled()
    if stall:
        assert not watch.settled()  # the stall watchdog judges until the end


def test_the_init_deadline_keeps_the_watch_looking_until_every_rank_joined() -> None:
    watch = Watch(2, 0.0, None, 10.0)
    assert not watch.settled()
    watch.observe(1.0, {0: 0, 1: 0}, {}, [0])
    assert not watch.settled()
    assert judge(watch, 11.0, lambda: [], _no_stacks) is not None  # rank 1 never joined
    watch.observe(2.0, {0: 0, 1: 0}, {}, [1])
    assert watch.settled() and judge(watch, 100.0, lambda: [], _no_stacks) is None
