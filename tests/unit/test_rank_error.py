"""errors/rank-N.json as one typed record (issue 52, item 2): what a failing rank writes is what
status, the local supervisor and the SLURM agent read; whatever else is found there (a rank's file
could hold anything) is no record, skipped, never a crash."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core import rank_error
from orchestrator.core.rank_error import RankError
from orchestrator.executors.base import first_error


def test_the_earliest_exception_of_the_run_is_the_one_said(tmp_path: Path) -> None:
    errors = tmp_path / "errors"
    rank_error.write(errors / "rank-2.json", RankError(2, 20.0, 0, "ValueError", "late", "tb2", "user tb2"))
    rank_error.write(errors / "rank-1.json", RankError(1, 10.0, 0, "RuntimeError", "first\nsecond line", "tb1"))
    (errors / "rank-3.json").write_text('{"rank": "3", "time": 1, "type": "X", "message": "m", "traceback": "t"}')
    err = first_error(tmp_path)
    assert err is not None and err.rank == 1  # rank 3's record is no record: its rank is text
    assert err.said() == "rank 1 raised RuntimeError: first\nsecond line\ntb1"  # no trimmed part: the full one
    assert err.headline() == "rank 1 raised RuntimeError: first"
    assert json.loads((errors / "rank-2.json").read_text())["user_traceback"] == "user tb2"  # the format kept


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["rank", "time", "attempt", "type", "message", "traceback",
                                         "user_traceback", "other"]), JSON) | JSON)
def test_anything_else_reads_as_no_record_or_as_a_sound_one(data: object) -> None:
    err = RankError.from_json(data)
    if err is not None:
        assert type(err.rank) is int and err.rank >= 0 and type(err.attempt) is int and isinstance(err.time, float)
        assert all(isinstance(t, str) for t in (err.type, err.message, err.traceback, err.user_traceback))
        assert RankError.from_json(json.loads(json.dumps(err.__dict__))) == err
