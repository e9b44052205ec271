"""The project's one host-list parser against the cluster's own ``scontrol show hostnames`` on
generated lists, multi-bracket ones included (no job: the cluster fixture only guarantees SLURM's
tools are installed and configured)."""

from __future__ import annotations

import os
import subprocess

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core import hostlist

_NAME = st.from_regex(r"[a-z][a-z0-9\-]{0,5}", fullmatch=True)
_RANGE = st.tuples(st.integers(0, 120), st.integers(0, 12), st.integers(1, 3))  # lo, length - 1, width
_BRACKET = st.lists(_RANGE, min_size=1, max_size=2).map(
    lambda rs: "[" + ",".join(f"{lo:0{w}d}" if n == 0 else f"{lo:0{w}d}-{lo + n}" for lo, n, w in rs) + "]")
# An item: a name, then one or two (literal, bracket) parts; a literal may be empty between brackets.
_ITEM = st.one_of(_NAME, st.tuples(_NAME, _BRACKET, st.lists(st.tuples(st.sampled_from(["", "-", "x"]), _BRACKET),
                                                             max_size=1))
                  .map(lambda t: t[0] + t[1] + "".join(lit + b for lit, b in t[2])))


@settings(max_examples=40, deadline=None, derandomize=os.environ.get("CI") == "true")
@given(st.lists(_ITEM, min_size=1, max_size=3))
def test_the_parser_agrees_with_scontrol(cluster: dict[str, str], items: list[str]) -> None:
    text = ",".join(items)
    out = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True, text=True, timeout=30,
                         check=True)
    assert hostlist.expand(text) == out.stdout.split(), text
