"""The warm zygote across sets of ranks (one set per attempt, issue 50), as generated sequences of
operations against a real zygote: sets of ranks that end in any order with any exit code, ranks
added while a set runs (a replacement beside survivors), the set ended by the supervisor. Every
rank's exit is reported once, in its own set, with its code; the zygote forks the next set, and
nothing outlives it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.backends.local.forked import ZygoteGroup
from orchestrator.core.interpreter import module_argv
from tests.integration.helpers import SCRIPTS, make_plan

RANK = st.tuples(st.sampled_from([0, 0, 1, 3]), st.sampled_from([0.0, 0.05, 0.2]))  # (exit code, seconds)
SET = st.tuples(st.lists(RANK, min_size=1, max_size=3), st.lists(RANK, max_size=2))  # (ranks, added later)


def _zygote() -> subprocess.Popen:
    """A zygote that preloads nothing heavy (json, not torch): the protocol is what is tested."""
    return subprocess.Popen(module_argv(sys.executable, "orchestrator.backends.local.zygote", "json",
                                        f"--parent={os.getpid()}"),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sets=st.lists(SET, min_size=1, max_size=3))
def test_sets_of_ranks_end_in_their_own_set_and_the_zygote_serves_the_next(
        tmp_path_factory, sets: list[tuple[list[tuple[int, float]], list[tuple[int, float]]]]) -> None:
    tmp = tmp_path_factory.mktemp("sets")
    launch = make_plan(tmp, entrypoint=str(SCRIPTS / "exit_as_told.py"), nodes=1, cpu_ranks_per_node=1)
    payload = tmp / "payload.json"
    launch.payload.write(payload)
    group = ZygoteGroup(_zygote())
    children: list[int] = []

    def msg(rank: int, code: int, seconds: float) -> dict:
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "1", "LOCAL_RANK": "0", "T_CODE": str(code),
               "T_SLEEP": str(seconds), "ORCH_RUN_DIR": launch.run_dir}
        return {"rank": rank, "env": env, "payload": str(payload), "log": str(tmp / f"rank-{rank}.log"),
                "fresh": False}

    try:
        for ranks, added in sets:
            started = group.start([msg(r, code, s) for r, (code, s) in enumerate(ranks)])
            children += [p.pid for p in started]
            expected = {r: code for r, (code, _) in enumerate(ranks)}
            for rank, (code, s) in enumerate(added[:len(ranks)]):  # each replaces a rank of the set once it has ended
                started[rank].wait(timeout=60)
                assert started[rank].poll() == expected[rank]
                started[rank] = group.add(msg(rank, code, s))
                children.append(started[rank].pid)
                expected[rank] = code
            codes = {p.rank: p.wait(timeout=60) for p in started}
            assert codes == expected
            assert group.end_set(), group.lost
            assert group.leftovers == []
        zygote = group.proc.pid
    finally:
        group.close()
    assert group.proc.returncode == 0
    assert not psutil.pid_exists(zygote)
    assert not [pid for pid in children if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


def test_a_stop_sent_the_moment_a_rank_is_forked_is_never_lost(tmp_path) -> None:
    """A Ctrl-C just after the ranks start: the supervisor's SIGTERM may reach a rank before it
    leads its own session (its group does not exist yet) or has its own handlers. It is sent to
    the pid then, and the zygote holds it across the fork: the rank ends at once, every time,
    instead of running on until the SIGKILL at the end of stop_grace_s (30 s by default)."""
    launch = make_plan(tmp_path, entrypoint=str(SCRIPTS / "exit_as_told.py"), nodes=1, cpu_ranks_per_node=1)
    payload = tmp_path / "payload.json"
    launch.payload.write(payload)
    group = ZygoteGroup(_zygote())
    try:
        for attempt in range(12):
            env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "T_CODE": "0", "T_SLEEP": "60",
                   "ORCH_RUN_DIR": launch.run_dir}
            rank = group.start([{"rank": 0, "env": env, "payload": str(payload), "log": str(tmp_path / "rank.log"),
                                 "fresh": attempt % 2 == 1}])[0]  # forked, and forked then exec'd
            rank.signal(signal.SIGTERM)
            assert rank.wait(timeout=15) != 0, f"try {attempt}: the rank did not end on its SIGTERM"
            assert group.end_set(), group.lost
    finally:
        group.close()
