from orchestrator.executors.slurm import combine, map_state

DISTINCT = ["PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL",
            "OUT_OF_MEMORY", "REQUEUED"]


def test_states_stay_distinct() -> None:
    assert [map_state(s) for s in DISTINCT] == DISTINCT
    assert map_state("CANCELLED by 0") == "CANCELLED"
    assert map_state("WEIRD") == "UNKNOWN"


def test_combined_state_of_an_array() -> None:
    assert combine(["COMPLETED", "COMPLETED"]) == "COMPLETED"
    assert combine(["COMPLETED", "RUNNING"]) == "RUNNING"
    assert combine(["COMPLETED", "NODE_FAIL", "FAILED"]) == "NODE_FAIL"
