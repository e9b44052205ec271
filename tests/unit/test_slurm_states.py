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


def test_pending_array_ids_expand() -> None:
    from orchestrator.executors.slurm import expand_array_id

    assert expand_array_id("12_[3-5,9%4]") == ["12_3", "12_4", "12_5", "12_9"]
    assert expand_array_id("12_7") == ["12_7"] and expand_array_id("13") == ["13"]


def test_submission_env_is_cleaned_but_keeps_slurm_conf(monkeypatch) -> None:
    import os

    from orchestrator.executors.slurm import clean_submission_env

    monkeypatch.setenv("SLURM_JOB_ID", "17")
    monkeypatch.setenv("SBATCH_PARTITION", "old")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    with clean_submission_env():
        assert "SLURM_JOB_ID" not in os.environ and "SBATCH_PARTITION" not in os.environ
        assert os.environ["SLURM_CONF"] == "/etc/slurm/slurm.conf"
    assert os.environ["SLURM_JOB_ID"] == "17"
