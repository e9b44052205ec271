"""tests/cluster/streams.py names cluster tests by hand: each name must still be a test, or a renamed
test would silently move to another session (stream a instead of b, or beside the other stream
instead of alone)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.cluster import streams

CLUSTER = Path(__file__).resolve().parents[1] / "cluster"


def _tests() -> set[str]:
    found = set()
    for module in CLUSTER.glob("test_*.py"):
        found.add(module.name)
        for node in ast.parse(module.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                found.add(f"{module.name}::{node.name}")
    return found


def test_every_named_test_exists() -> None:
    named = set().union(*streams.WAITING.values()) | streams.SERIAL_TESTS | streams.SHAREABLE_TESTS | streams.SERIAL_MODULES | {streams.LAST_MODULE}
    assert named - _tests() == set()


def test_the_sessions_of_a_few_tests() -> None:
    waits = "tests/cluster/test_user_scripts.py::test_a_script_without_a_usr2_handler_runs_to_its_time_limit"
    assert streams.stream_of(waits) == "b"
    assert set(streams.WAITING) <= set(streams.PARALLEL[1:]), "stream a is the rest: no test is named for it"
    assert streams.stream_of("tests/cluster/test_remote_slurm.py::test_status_is_one_ssh_session") == \
        streams.stream_of("tests/cluster/test_benchmarks_smoke.py::test_bench_remote_runs_one_round_through_the_login_node")
    assert streams.stream_of("tests/cluster/test_slurm.py::test_single_node_two_ranks") == "a"
    assert streams.stream_of("tests/cluster/test_slurm.py::test_lost_node_ends_the_job") == streams.SERIAL
    assert streams.stream_of("tests/cluster/test_preemption.py::test_a_suspended_job_is_not_called_stalled_and_completes[x]") == "b"
    assert streams.stream_of("tests/cluster/test_no_accounting.py::test_sacct_is_disabled_on_this_cluster") == streams.LAST
