import pytest

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


def test_sacct_states_asks_the_scheduler_at_most_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Just after submission sacct knows some jobs (PENDING: its record may lag) and not others:
    one squeue call (every state) asks about both, not one call each (three queries were seen)."""
    import subprocess

    from orchestrator.backends.slurm import slurm_status
    from orchestrator.core.states import State

    calls: list[list[str]] = []
    monkeypatch.setattr(slurm_status, "accounting_off", lambda: False)
    monkeypatch.setattr(slurm_status, "check_slurm_conf", lambda: None)

    def sacct_rows(bases: list[str]) -> list[tuple[str, str]]:
        calls.append(["sacct", *bases])
        return [("10", "PENDING"), ("11", "RUNNING")]

    def run_slurm(cmd: list[str], *a: object, **k: object) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "10|RUNNING\n12|COMPLETED\n", "")

    monkeypatch.setattr(slurm_status, "sacct_rows", sacct_rows)
    monkeypatch.setattr(slurm_status, "run_slurm", run_slurm)
    states = slurm_status.sacct_states(["10", "11", "12"])
    assert len(calls) == 2, calls
    assert calls[1][:6] == ["squeue", "-h", "-r", "-t", "all", "-o"] and calls[1][-1] == "10,12"
    assert states == {"10": State.RUNNING, "11": State.RUNNING, "12": State.COMPLETED}
