"""orchestrator.core.states: one typed set of lifecycle states that still reads and writes as the
plain strings records on disk, the CLI's output and users' comparisons have always used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.core.errors import RunNotFoundError
from orchestrator.core.records import RunRecord
from orchestrator.core.states import TERMINAL, State

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL",
         "OUT_OF_MEMORY", "REQUEUED", "UNKNOWN"]
ENDS = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY"}


def test_members_are_their_names() -> None:
    assert [s.value for s in State] == NAMES
    for name in NAMES:
        state = State(name)
        assert state == name and name == state and hash(state) == hash(name) and isinstance(state, str)
        assert str(state) == name and f"{state}" == name and f"{state:14}|" == f"{name:14}|"
        assert json.dumps({"state": state}) == json.dumps({"state": name})


def test_terminal() -> None:
    assert {s.value for s in State if s.terminal} == ENDS
    assert TERMINAL == ENDS
    assert "FAILED" in TERMINAL and "RUNNING" not in TERMINAL and "NONE" in TERMINAL | {"NONE"}


def test_parse() -> None:
    assert State.parse("TIMEOUT") is State.TIMEOUT and State.parse(State.TIMEOUT) is State.TIMEOUT
    for bad in ("", "completed", "BOGUS", None, 3):
        with pytest.raises(ValueError, match="unknown state .*known: PENDING, RUNNING"):
            State.parse(bad)


def test_records_hold_states_and_write_the_same_json(tmp_path: Path) -> None:
    rec = RunRecord(run_id="r", run_dir=str(tmp_path), executor="slurm", point_states={"0": "COMPLETED"})
    assert rec.state is State.PENDING and rec.point_states["0"] is State.COMPLETED
    rec.update(state="RUNNING", point_states={"0": "RUNNING", "1": State.FAILED})
    assert rec.state is State.RUNNING and rec.point_states == {"0": State.RUNNING, "1": State.FAILED}
    rec.state = "TIMEOUT"  # type: ignore[assignment]  (a plain assignment is typed too)
    assert rec.state is State.TIMEOUT
    rec.save()
    data = json.loads((tmp_path / "record.json").read_text())
    assert data["state"] == "TIMEOUT" and data["point_states"] == {"0": "RUNNING", "1": "FAILED"}
    assert '"state": "TIMEOUT"' in (tmp_path / "record.json").read_text()
    again = RunRecord.load(tmp_path)
    assert again.state is State.TIMEOUT and again.state.terminal and again.point_states["1"] is State.FAILED
    with pytest.raises(ValueError, match="unknown state 'DONE'"):
        rec.update(state="DONE")


@pytest.mark.parametrize("field,value,problem", [
    ("state", "DONE", "has an unknown state 'DONE'"),
    ("state", "completed", "has an unknown state 'completed'"),
    ("point_states", {"0": "DONE"}, "has a malformed 'point_states'"),
    ("point_states", {"0": 1}, "has a malformed 'point_states'"),
])
def test_a_record_with_a_bad_state_is_named_damaged(tmp_path: Path, field: str, value: object, problem: str) -> None:
    RunRecord(run_id="r", run_dir=str(tmp_path), executor="local").save()
    data = json.loads((tmp_path / "record.json").read_text())
    data[field] = value
    (tmp_path / "record.json").write_text(json.dumps(data))
    with pytest.raises(RunNotFoundError, match=f"record.json is damaged \\({problem}\\)"):
        RunRecord.load(tmp_path)


def test_a_record_without_a_state_is_pending(tmp_path: Path) -> None:
    (tmp_path / "record.json").write_text(json.dumps({"run_id": "r", "run_dir": str(tmp_path), "executor": "local"}))
    assert RunRecord.load(tmp_path).state is State.PENDING


def test_states_without_enum_strenum() -> None:
    """Ranks may run an older Python than 3.11 (slurm.python): State behaves the same without StrEnum."""
    code = ("import enum, json\ndel enum.StrEnum\n"
            "from orchestrator.core.states import State, TERMINAL\n"
            "s = State.FAILED\n"
            "assert s == 'FAILED' and str(s) == 'FAILED' and f'{s:8}|' == 'FAILED  |' and s.terminal\n"
            "assert json.dumps(s) == '\"FAILED\"' and 'FAILED' in TERMINAL and not State.PENDING.terminal\n"
            "assert State.parse('RUNNING') is State.RUNNING and type(State).__name__ == 'EnumType'\n"
            "assert not hasattr(enum, 'StrEnum')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr


def test_states_are_standard_library_only() -> None:
    code = ("import sys\nbefore = set(sys.modules)\nimport orchestrator.core.states\n"
            "print(sorted(m for m in set(sys.modules) - before if not m.startswith('orchestrator')\n"
            "             and m.split('.')[0] not in sys.stdlib_module_names))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
