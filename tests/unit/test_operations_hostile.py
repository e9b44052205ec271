"""Operations over damaged run folders and registries, and signals only to our own processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.core import procs
from orchestrator.core.records import RunRecord, home

from tests.unit.test_hostile_input import SETTINGS, anything, cli

RUN_ID = "victim-0123abcd"


def _register(run_dir: Path, line: str | None = None) -> None:
    reg = home() / "registry.jsonl"
    reg.parent.mkdir(parents=True, exist_ok=True)
    with open(reg, "a", encoding="utf-8") as fh:
        fh.write((line if line is not None else json.dumps({"run_id": RUN_ID, "run_dir": str(run_dir)})) + "\n")


def _assert_clean(code: int, err: str) -> None:
    assert code in (0, 1, 2), err
    assert "Traceback" not in err


record_contents = st.one_of(
    st.binary(max_size=200),
    anything.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"run_id": st.just(RUN_ID), "run_dir": st.text(max_size=20),
                           "executor": st.one_of(st.sampled_from(["local", "slurm", "debug", "k8s", ""]), st.integers()),
                           "state": st.one_of(st.sampled_from(["RUNNING", "COMPLETED", "PENDING", "weird"]), st.none()),
                           "rank_pids": st.one_of(st.lists(st.integers()), st.text(max_size=3)),
                           "job_ids": st.one_of(st.lists(st.text(max_size=5)), st.integers())},
                          optional={"supervisor_pid": st.one_of(st.integers(), st.text(max_size=3)),
                                    "created": st.one_of(st.floats(), st.text(max_size=3))})
    .map(lambda d: json.dumps(d).encode()),
)


@SETTINGS
@given(content=record_contents, registry_junk=st.lists(st.text(max_size=40), max_size=3))
def test_damaged_records_and_registries_give_errors_not_tracebacks(tmp_path_factory: pytest.TempPathFactory,
                                                                    content: bytes, registry_junk: list[str]) -> None:
    os.environ["ORCHESTRATOR_HOME"] = str(tmp_path_factory.mktemp("home"))
    run_dir = tmp_path_factory.mktemp("run")
    (run_dir / "record.json").write_bytes(content)
    for junk in registry_junk:
        _register(run_dir, junk.replace("\n", " "))
    _register(run_dir)
    for argv in (["status"], ["list"], ["status", RUN_ID], ["status", str(run_dir)], ["logs", RUN_ID],
                 ["cancel", str(run_dir)], ["status", "--json"]):
        code, _, err, seconds = cli(*argv)
        _assert_clean(code, err)
        assert seconds < 5


@pytest.mark.parametrize("ref", ["", " ", "\t"])
def test_empty_run_reference_matches_nothing(tmp_path: Path, ref: str) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    RunRecord(run_id=RUN_ID, run_dir=str(run_dir), executor="local", state="COMPLETED").save()
    _register(run_dir)
    for command in ("status", "cancel", "logs"):
        code, _, err, _ = cli(command, ref)
        assert code == 1 and "no run given" in err, err


def test_cancel_of_a_stale_record_never_signals_a_reused_pid(tmp_path: Path) -> None:
    """The recorded PIDs now belong to an unrelated process (same number, other start time)."""
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        start = procs.start_time(stranger.pid)
        assert start is not None
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        RunRecord(run_id=RUN_ID, run_dir=str(run_dir), executor="local", state="RUNNING",
                  supervisor_pid=stranger.pid, supervisor_start=start - 1,
                  rank_pids=[stranger.pid], rank_starts=[start - 1]).save()
        _register(run_dir)
        code, out, err, _ = cli("cancel", RUN_ID)
        assert code == 0, err
        time.sleep(0.2)
        assert stranger.poll() is None, "cancel signalled a process that was not the run's"
        assert RunRecord.load(run_dir).state in ("CANCELLED", "FAILED")
    finally:
        stranger.kill()
        stranger.wait(timeout=10)


def test_a_run_whose_supervisor_pid_was_reused_is_failed_not_running(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    me = os.getpid()
    RunRecord(run_id=RUN_ID, run_dir=str(run_dir), executor="local", state="RUNNING",
              supervisor_pid=me, supervisor_start=(procs.start_time(me) or 0) - 1).save()
    _register(run_dir)
    code, out, err, _ = cli("status", RUN_ID)
    assert code == 0 and "FAILED" in out, out + err
    assert "ended without recording an end state" in (RunRecord.load(run_dir).error or "")


def test_logs_follow_of_a_run_that_never_started_returns(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    RunRecord(run_id=RUN_ID, run_dir=str(run_dir), executor="local", state="PENDING",
              created=time.time() - 3600).save()
    _register(run_dir)
    code, _, err, seconds = cli("logs", "-f", RUN_ID)
    assert code == 1 and seconds < 5, err
    assert "FAILED" in err and "never started" in (RunRecord.load(run_dir).error or "")
