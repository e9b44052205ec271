"""SLURM host lists ('gpu[01-03,7],cpu1'): the project's one parser. Standard library only (the
job's agent and the ranks use it, inside containers too, where there is no scontrol).

It expands as ``scontrol show hostnames`` (22.05) does, checked against it in
tests/cluster/test_hostlist_scontrol.py:

- items are separated by commas outside brackets; empty items (a trailing comma) are skipped;
- a bracket holds numbers and ranges ``lo-hi``, padded to the width of ``lo`` (``n[01-10]``);
- brackets multiply, the first varying slowest (``gpu-[1-2]-[3-4]``: gpu-1-3 gpu-1-4 gpu-2-3
  gpu-2-4; ``n[1-2]x[3]``: n1x3 n2x3);
- text after the last closing bracket is refused (``n[1-2]a``), as SLURM refuses it, and so are
  backward ranges, letters in a range and unpaired brackets.
"""

from __future__ import annotations

import math
import re

#: More hosts than any job here may use (65,536 ranks): a list naming more is refused before it
#: is expanded, so 'n[0-999999]' costs nothing.
MAX_HOSTS = 100_000

_BRACKET = re.compile(r"([^\[\]]*)\[([^\[\]]*)\]")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def _items(text: str) -> list[str]:
    """The comma-separated items of a host list, commas inside brackets kept."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item for item in items if item]


def _ranges(body: str, text: str) -> list[tuple[str, str]]:
    """A bracket's ranges as (lo, hi) strings; ValueError naming the list for a bad one."""
    out = []
    for part in body.split(","):
        m = _RANGE.fullmatch(part)
        if not m:
            raise ValueError(f"{text!r}: {part!r} is not a number or a range lo-hi")
        lo, hi = m.group(1), m.group(2) if m.group(2) is not None else m.group(1)
        if int(lo) > int(hi):
            raise ValueError(f"{text!r}: the range {lo}-{hi} runs backwards")
        out.append((lo, hi))
    return out


def _parts(item: str, text: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """An item as (literal, ranges) pairs, one per bracket; [(item, [])] for a plain name."""
    if "[" not in item and "]" not in item:
        return [(item, [])]
    pos, parts = 0, []
    for m in _BRACKET.finditer(item):
        if m.start() != pos:
            break
        parts.append((m.group(1), _ranges(m.group(2), text)))
        pos = m.end()
    if pos != len(item):
        raise ValueError(f"{text!r} is not a SLURM host list ({item!r}: nothing may follow a range's closing "
                         "bracket, and brackets must pair)")
    return parts


def count(text: str) -> int:
    """How many hosts the list names, without expanding it; ValueError for an invalid list."""
    return sum(math.prod(sum(int(hi) - int(lo) + 1 for lo, hi in ranges) for _, ranges in _parts(item, text) if ranges)
               for item in _items(text))


def expand(text: str) -> list[str]:
    """Host names of a SLURM host list, in order, as ``scontrol show hostnames`` gives them.
    ValueError (naming the list and what is wrong) for an invalid one, or one naming more than
    MAX_HOSTS hosts."""
    if count(text) > MAX_HOSTS:
        raise ValueError(f"{text!r} names more than {MAX_HOSTS} hosts")
    hosts: list[str] = []
    for item in _items(text):
        names = [""]
        for literal, ranges in _parts(item, text):
            values = [str(n).zfill(len(lo)) for lo, hi in ranges for n in range(int(lo), int(hi) + 1)] or [""]
            names = [name + literal + value for name in names for value in values]
        hosts.extend(names)
    return hosts
