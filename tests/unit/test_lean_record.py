"""``orchestrator.core.lean_record``: the frozen records a rank imports before its entrypoint behave
as ``@dataclass(frozen=True)`` does, and what a rank imports stays free of dataclasses and typing."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import Optional

import pytest
from hypothesis import given, strategies as st

from orchestrator.core import lean_record
from orchestrator.core.lean_record import FrozenRecordError, record
from orchestrator.core.payload import Payload, PayloadError


@record
class Point:
    x: int
    label: str = "p"
    note: Optional[str] = None


@record
class Tagged(Point):
    tag: str = "t"


@dataclasses.dataclass(frozen=True)
class DataPoint:
    x: int
    label: str = "p"
    note: Optional[str] = None


@given(st.integers(), st.text(max_size=5), st.none() | st.text(max_size=5),
       st.integers(), st.text(max_size=5), st.none() | st.text(max_size=5))
def test_a_record_compares_hashes_and_shows_itself_as_the_frozen_dataclass_does(
        x: int, label: str, note: Optional[str], x2: int, label2: str, note2: Optional[str]) -> None:
    a, b = Point(x, label, note=note), Point(x2, label=label2, note=note2)
    da, db = DataPoint(x, label, note=note), DataPoint(x2, label=label2, note=note2)
    assert (a == b) == (da == db)
    assert (hash(a) == hash(b)) or a != b
    assert repr(a).replace("Point", "DataPoint", 1).split("(", 1)[1] == repr(da).split("(", 1)[1]
    assert lean_record.as_dict(a) == dataclasses.asdict(da)
    assert lean_record.replace(a, label=label2) == Point(x, label2, note)


def test_a_record_is_frozen_built_by_position_or_keyword_and_refuses_what_a_dataclass_refuses() -> None:
    p = Point(1)
    assert (p.x, p.label, p.note) == (1, "p", None)
    with pytest.raises(FrozenRecordError, match="lean_record.replace"):
        p.x = 2  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del p.label  # type: ignore[misc]
    with pytest.raises(TypeError, match="missing required argument: 'x'"):
        Point()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'y'"):
        Point(1, y=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="multiple values for argument 'x'"):
        Point(1, x=2)  # type: ignore[misc]
    with pytest.raises(TypeError, match="takes 3 arguments but 4"):
        Point(1, "a", "b", "c")  # type: ignore[call-arg]
    assert Point(1) != DataPoint(1) and Point(1) != (1, "p", None)


def test_a_subclass_adds_its_fields_after_its_bases_and_a_field_without_a_default_cannot_follow_one() -> None:
    t = Tagged(1, "q", None, "z")
    assert lean_record.field_names(Tagged) == ("x", "label", "note", "tag")
    assert lean_record.required_names(Tagged) == ("x",)
    assert t != Point(1, "q") and Tagged(1, "q", tag="z") == t
    with pytest.raises(TypeError, match="follows one with a default"):
        @record
        class Wrong:
            a: int = 0
            b: int


def test_a_payload_goes_through_json_unchanged_and_an_old_empty_extra_still_loads() -> None:
    from orchestrator.plan import plan
    from orchestrator.spec.loading import spec_from_dict

    payload = plan(spec_from_dict({"name": "lean", "entrypoint": "jobs.train:main", "executor": "slurm", "nodes": 2,
                                   "runs_dir": "/shared/runs", "container": None}), "slurm").payload
    again = Payload.from_dict(json.loads(payload.to_json()))
    assert again == payload and again.checkpoint == payload.checkpoint
    old = {**json.loads(payload.to_json()), "extra": {}}  # what payloads carried until 2026-12-06
    assert Payload.from_dict(old) == payload
    with pytest.raises(PayloadError, match="unknown: extra"):
        Payload.from_dict({**old, "extra": {"a": 1}})


def test_what_a_rank_imports_before_its_entrypoint_has_no_dataclasses_typing_or_socket() -> None:
    """64 ranks sharing a node's cores each pay these (the 64-node start-up benchmark): ~14 ms a
    rank of dataclasses, inspect, typing and the classes dataclasses generated."""
    probe = ("import sys\nimport orchestrator.backends.slurm.node.slurm_rank, orchestrator.node.launcher\n"
             "print(sorted(m for m in ('dataclasses', 'inspect', 'typing', 'socket', 'traceback')"
             " if m in sys.modules))\n")
    seen = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout == "[]\n"
