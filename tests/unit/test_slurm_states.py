from orchestrator.backends.slurm.executor import PRIORITY, STATE_MAP, combine, map_state
from orchestrator.core.states import State

DISTINCT = ["PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL",
            "OUT_OF_MEMORY", "REQUEUED"]


def test_states_stay_distinct() -> None:
    assert [map_state(s) for s in DISTINCT] == DISTINCT
    assert map_state("CANCELLED by 0") == "CANCELLED"
    assert map_state("WEIRD") == "UNKNOWN"
    assert map_state("") is State.UNKNOWN and map_state("COMPLETED+") is State.COMPLETED


def test_slurm_words_map_onto_states() -> None:
    """One table: every value a State, every State but UNKNOWN reachable from SLURM's own word."""
    assert all(type(v) is State for v in STATE_MAP.values())
    assert all(type(map_state(word)) is State for word in [*STATE_MAP, "WEIRD"])
    assert {State(name) for name in DISTINCT} == set(STATE_MAP.values()) == set(State) - {State.UNKNOWN}
    assert all(STATE_MAP[s.value] is s for s in State if s is not State.UNKNOWN)


def test_combined_state_of_an_array() -> None:
    assert combine(["COMPLETED", "COMPLETED"]) == "COMPLETED"
    assert combine(["COMPLETED", "RUNNING"]) == "RUNNING"
    assert combine(["COMPLETED", "NODE_FAIL", "FAILED"]) == "NODE_FAIL"
    assert combine([State.COMPLETED, State.PREEMPTED]) is State.PREEMPTED
    assert combine([]) is State.UNKNOWN and type(combine(["RUNNING"])) is State


def test_every_state_has_a_priority() -> None:
    assert sorted(PRIORITY) == sorted(State) and len(PRIORITY) == len(set(PRIORITY))


def test_pending_array_ids_expand() -> None:
    from orchestrator.backends.slurm.executor import expand_array_id

    assert expand_array_id("12_[3-5,9%4]") == ["12_3", "12_4", "12_5", "12_9"]
    assert expand_array_id("12_7") == ["12_7"] and expand_array_id("13") == ["13"]
