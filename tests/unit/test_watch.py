"""orchestrator.node.watchdog.Watch and judge: when a job is judged, and when there is nothing left to
judge (the supervisors then stop reading the ranks' files). Generated sequences of looks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.node.watchdog import Watch, judge

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
    if not stall and (init is None or world == 1 or all(watch.past_start(r) for r in range(world))):
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


@given(world=st.integers(2, 8), stall=st.floats(1, 30), init=st.floats(1, 600), seq=looks)
def test_the_stall_clock_runs_only_once_every_rank_joined(world: int, stall: float, init: float,
                                                         seq: list[tuple[float, list[int]]]) -> None:
    """A slow start (imports on a busy node, data read before init_process_group) is the init
    deadline's to judge: no stall verdict while a rank has not joined, and once all have, none
    sooner than stall_s after the last join."""
    watch = Watch(world, 0.0, stall, init)
    now = 0.0
    for step, joined in seq:
        now += step
        watch.observe(now, {r: 0 for r in range(world)}, {}, [r for r in joined if r < world])
        verdict = judge(watch, now, lambda: [], _no_stacks)
        if len(watch.joined) < world:
            assert not watch.stalled(now)
            assert verdict is None or verdict.reason.name == "INIT_DEADLINE"
        elif watch.stalled(now):
            assert now - max(watch.joined.values()) >= stall


def test_a_single_rank_and_a_job_without_an_init_deadline_are_watched_from_the_start() -> None:
    assert Watch(1, 0.0, 5.0, 10.0).stalled(6.0)  # one rank waits for no peer: no deadline to defer to
    assert Watch(2, 0.0, 5.0, None).stalled(6.0)
    assert not Watch(2, 0.0, 5.0, 10.0).stalled(6.0)  # the init deadline (10 s) watches the start


@given(world=st.integers(2, 8), stall=st.floats(1, 30), init=st.floats(31, 600),
       seq=st.lists(st.tuples(st.floats(0, 20), st.lists(st.integers(0, 7), max_size=8)), max_size=12))
def test_ranks_that_report_progress_without_a_group_are_watched_for_a_stall(
        world: int, stall: float, init: float, seq: list[tuple[float, list[int]]]) -> None:
    """Heartbeats but no process group (issue 51, item 5): a rank that reported is past its start,
    so once every rank has, the job is judged stalled stall_s after the last report, long before
    the init deadline, and the deadline never blames a rank that reports."""
    watch = Watch(world, 0.0, stall, init)
    now = 0.0
    for step, reporting in seq:
        now += step
        watch.observe(now, {}, {r: now for r in reporting if r < world}, [])
        verdict = judge(watch, now, lambda: [], _no_stacks)
        if all(r in watch.heartbeat for r in range(world)):
            assert watch.stalled(now) == (now - max(watch.heartbeat.values()) >= stall)
            assert verdict is None or verdict.reason.name == "STALL"
        elif verdict is not None:
            assert verdict.reason.name == "INIT_DEADLINE" and verdict.rank not in watch.heartbeat


def test_a_stalled_job_of_heartbeats_and_no_group_is_stopped_at_stall_s_not_at_the_deadline() -> None:
    watch = Watch(64, 0.0, 60.0, 300.0)
    watch.observe(5.0, {}, {r: 5.0 for r in range(64)}, [])  # 16 x 4 ranks reported once, then stopped
    assert judge(watch, 64.0, lambda: [], _no_stacks) is None
    verdict = judge(watch, 65.5, lambda: [], _no_stacks)
    assert verdict is not None and verdict.reason.name == "STALL"
