"""end.json as one typed record (issue 52, item 2): what the agent writes is what status reads, and
whatever else is found there (anyone who can write the run folder could have put it) reads as no
verdict or as the fields that have the right type, never as a crash."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.end_verdict import EndVerdict
from orchestrator.core.states import EndReason
from orchestrator.node import forensics


def test_what_the_agent_writes_is_what_status_reads(tmp_path: Path) -> None:
    forensics.write_end(tmp_path, reason=EndReason.STALL, failed_rank=3, error="rank 3 stalled",
                        waits={"0": "all_reduce", "3": "train.py:12"})
    end = forensics.read_end(tmp_path)
    assert end is not None and end.reason == "stall" and end.failed_rank == 3 and end.error == "rank 3 stalled"
    assert dict(end.waits) == {"0": "all_reduce", "3": "train.py:12"} and end.time > 0 and end.warning == ""
    on_disk = json.loads((tmp_path / "end.json").read_text())
    assert on_disk["reason"] == "stall" and on_disk["failed_rank"] == 3  # the format status has always read


def test_a_file_that_is_no_verdict_reads_as_none(tmp_path: Path) -> None:
    assert forensics.read_end(tmp_path) is None
    for text in ("[]", '"stalled"', "{}", '{"reason": 3}', "not json", '{"reason": null}'):
        (tmp_path / "end.json").write_text(text)
        assert forensics.read_end(tmp_path) is None, text


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(reason=st.text(max_size=30), fields=st.dictionaries(
    st.sampled_from(["time", "error", "failed_rank", "waits", "warning", "unhealthy", "other"]), JSON))
def test_each_field_of_the_wrong_type_reads_as_absent(reason: str, fields: dict) -> None:
    end = EndVerdict.from_json({**fields, "reason": reason})
    assert end is not None and end.reason == reason
    assert isinstance(end.error, str) and isinstance(end.warning, str) and isinstance(end.time, float)
    assert end.failed_rank is None or (type(end.failed_rank) is int and end.failed_rank >= 0)
    assert all(isinstance(k, str) and isinstance(v, str) for m in (end.waits, end.unhealthy) for k, v in m.items())
    assert EndVerdict.from_json(end.to_json()) == end  # what is kept survives being written again
