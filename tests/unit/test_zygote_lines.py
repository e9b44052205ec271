"""The zygote's reader of the supervisor's messages (zygote.Lines): whole lines only, however the
bytes arrive; what select reports is never hidden in a buffer; the end of input reads as done."""

from __future__ import annotations

import json
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.backends.local.zygote import Lines

MESSAGES = st.lists(st.fixed_dictionaries({"rank": st.integers(0, 99), "log": st.text(max_size=20)}),
                    max_size=6)


@settings(max_examples=60, deadline=None)
@given(messages=MESSAGES, cuts=st.lists(st.integers(1, 40), max_size=8))
def test_messages_come_out_whole_and_in_order_however_the_bytes_are_cut(messages: list[dict], cuts: list[int]) -> None:
    data = b"".join(json.dumps(m).encode() + b"\n" for m in messages) + b'{"go": true}\n'
    r, w = os.pipe()
    lines = Lines(r)
    got: list[dict] = []
    try:
        at = 0
        for cut in [*cuts, len(data)]:
            if at >= len(data):
                break
            os.write(w, data[at:at + cut])
            at += cut
            while lines.ready(0):
                got += lines.take()
                if got and got[-1].get("go"):
                    break
        os.close(w)
        w = -1
        while not got or not got[-1].get("done"):
            got.append(lines.next())
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    assert got == [*messages, {"go": True}, {"done": True}]


def test_a_message_already_read_is_seen_by_ready_without_a_new_read() -> None:
    r, w = os.pipe()
    try:
        os.write(w, b'{"rank": 0}\n{"go": true}\n')
        lines = Lines(r)
        assert lines.next() == {"rank": 0}  # one read took both lines
        assert lines.ready(0) and lines.take() == [{"go": True}]
        assert not lines.ready(0)
    finally:
        os.close(r)
        os.close(w)
