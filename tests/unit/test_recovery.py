"""orchestrator.core.recovery: the pure decision (restart or stop), the attempts' history, and the
checkpoint fingerprint that tells progress. Sequences of failures, generated: whatever happens,
the job stops within max_restarts restarts, never loops without progress, and never excludes
so many nodes that it cannot run."""

from __future__ import annotations

import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.payload import RecoverySettings
from orchestrator.core.recovery import KINDS, Failure, History, checkpoint_fingerprint, decide, describe


def _settings(**over: object) -> RecoverySettings:
    base = dict(max_restarts=3, on=KINDS, exclude_failed_nodes=True, health_check=True, node_check=None,
                stop_without_progress=2)
    base.update(over)
    return RecoverySettings(**base)  # type: ignore[arg-type]


failures = st.tuples(st.sampled_from(KINDS), st.booleans(), st.lists(st.sampled_from(["n1", "n2", "n3", "n4"]),
                                                                     max_size=2))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 5), st.integers(1, 4), st.lists(failures, min_size=1, max_size=12), st.integers(1, 3))
def test_a_sequence_of_failures_always_stops_within_the_bounds(tmp_path_factory, max_restarts: int, streak: int,
                                                              seq: list, needed: int) -> None:
    tmp = tmp_path_factory.mktemp("h")
    cfg = _settings(max_restarts=max_restarts, stop_without_progress=streak)
    history = History(tmp / "recovery.json")
    restarts = 0
    for number, (kind, progressed, blamed) in enumerate(seq, start=1):
        attempt = history.begin(number, ["n1"], tmp / "ckpt")
        d = decide(cfg, history, Failure(kind, "x", tuple(blamed)), progressed, needed, 4 - len(history.excluded))
        history.finish(attempt, kind, "x", progress=progressed, action="restart" if d.restart else "stop",
                       blamed=blamed, exclude=d.exclude)
        if not d.restart:
            assert d.reason in (kind, "no_progress", "not_enough_nodes")
            break
        restarts += 1
        assert restarts <= max_restarts
        assert 4 - len(history.excluded) >= needed  # a restart never excludes the job out of the partition
        assert history.failures_without_progress() < streak
    assert history.restarts() == restarts <= max_restarts


def test_off_by_default_and_by_kind() -> None:
    h = History(Path("/nonexistent/recovery.json"))
    assert not decide(_settings(max_restarts=0), h, Failure("crash", "x"), True).restart
    d = decide(_settings(on=("crash",)), h, Failure("hang", "x"), True)
    assert not d.restart and "recovery.on does not list hang" in d.message


def test_no_progress_counts_failures_in_a_row_and_skips_the_health_gate(tmp_path: Path) -> None:
    h = History(tmp_path / "recovery.json")
    a = h.begin(1, [], tmp_path)
    h.finish(a, "crash", progress=False, action="restart")
    a = h.begin(2, [], tmp_path)
    h.finish(a, "unhealthy", action="restart")  # ran nothing: neither progress nor its lack
    h.begin(3, [], tmp_path)
    d = decide(_settings(), h, Failure("crash", "boom"), progressed=False)
    assert (d.restart, d.reason) == (False, "no_progress") and "2 attempt(s) in a row" in d.message
    assert decide(_settings(), h, Failure("crash", "boom"), progressed=True).restart


def test_a_traceback_blames_nothing_and_blamed_nodes_are_excluded_once(tmp_path: Path) -> None:
    h = History(tmp_path / "recovery.json", excluded=["n2"])
    assert decide(_settings(), h, Failure("crash", "traceback"), True).exclude == ()
    d = decide(_settings(), h, Failure("node_failure", "lost", ("n2", "n3")), True, nodes_needed=2, nodes_available=4)
    assert d.restart and d.exclude == ("n3",) and "excluding n3" in d.message
    d = decide(_settings(exclude_failed_nodes=False), h, Failure("node_failure", "lost", ("n3",)), True)
    assert d.restart and d.exclude == ()
    d = decide(_settings(), h, Failure("unhealthy", "gate", ("n3",)), True, nodes_needed=2, nodes_available=2)
    assert (d.restart, d.reason) == (False, "not_enough_nodes")


def test_the_fingerprint_changes_with_a_new_checkpoint_only(tmp_path: Path) -> None:
    assert checkpoint_fingerprint(tmp_path / "missing") == "" == checkpoint_fingerprint(tmp_path)
    (tmp_path / "ckpt-1.pt").write_bytes(b"1")
    first = checkpoint_fingerprint(tmp_path)
    assert first and first == checkpoint_fingerprint(tmp_path)
    time.sleep(0.01)
    (tmp_path / "ckpt-2.pt").write_bytes(b"22")
    assert checkpoint_fingerprint(tmp_path) != first


def test_history_survives_a_damaged_file_and_is_shown(tmp_path: Path) -> None:
    (tmp_path / "recovery.json").write_text("{not json")
    h = History.load(tmp_path)
    assert h.attempts == [] and describe(h) == []
    a = h.begin(1, ["node1"], tmp_path)
    h.finish(a, "unhealthy", "gate", action="restart", blamed=["node1"], exclude=["node1"])
    h.attempts[0].health = {"node1": "GPU 0 has ECC errors"}
    h.save()
    h.begin(2, ["node2"], tmp_path)
    lines = describe(History.load(tmp_path))
    assert lines[0].startswith("attempts: 2 (1 restart(s), 0 requeue(s)") and "excluded: node1" in lines[0]
    assert "attempt 1 on node1: unhealthy, restarted: gate; blamed: node1" in lines[1]
    assert "unhealthy node1: GPU 0 has ECC errors" in lines[2] and "attempt 2 on node2: running" in lines[3]


def test_an_attempt_whose_owner_was_killed_is_recorded_lost_not_running(tmp_path: Path) -> None:
    h = History(tmp_path / "recovery.json")
    h.begin(1, ["n1"], tmp_path)  # its supervisor (or agent) was SIGKILLed: no end recorded
    again = History.load(tmp_path)
    (lost,) = again.close_lost("the supervisor was killed")
    assert lost.number == 1 and History.load(tmp_path).attempts[0].outcome == "lost"
    again.begin(2, ["n1"], tmp_path)
    lines = describe(History.load(tmp_path))
    assert "attempt 1 on n1: lost: the supervisor was killed" in lines[1] and "attempt 2 on n1: running" in lines[2]
    assert History.load(tmp_path).close_lost("x") == [History.load(tmp_path).attempts[1]]
