"""A run folder's small records read as hostile input: never blocking, never unbounded, never
through a link, and never mistaken for valid. Standard library only (the SLURM agent and the
local supervisor read recovery.json through it too).

Anyone who can write a run folder (a teammate, a crashed writer, a script of the run itself) can
put a FIFO where ``recovery.json`` belongs (reading it would wait for a writer for ever), a link
to ``/dev/zero`` (a read that never ends) or to another run's file, a gigabyte of JSON, ``NaN``,
or a list where a dict belongs. Every command that reads a run folder (``status``, ``list``,
``report``, ``logs``, ``gc``) goes through ``read_json`` so that each of these is one line
naming the file and what to do, and the rest of its output still shows:

- ``Damaged``: the file is no record of ours (not a regular file, a link, too large, not UTF-8
  JSON, ``NaN`` or ``Infinity``, wrong types as the caller's check says);
- ``NoPermission``: nothing is wrong with the file, this user may not read it ("no permission to
  read <path>", never "damaged": the fix is its owner's).
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from pathlib import Path
from typing import Any, Optional

from orchestrator.core.fs_checks import kind, no_permission, shown

#: A record of the run folder (recovery.json, end.json, code.json) is kilobytes; past this it is
#: not one, and is not read further.
RECORD_MAX_BYTES = 8 << 20


class Unreadable(Exception):
    """A run folder's file that cannot be used: ``line()`` says which, why and what to do."""

    def __init__(self, path: str | os.PathLike, why: str) -> None:
        self.path, self.why = Path(path), why
        super().__init__(why)

    def line(self, what: Optional[str] = None) -> str:
        """One line for the user; ``what`` names the file ('recovery.json in run-x') instead of its path."""
        return f"{what or shown(self.path)} cannot be read: {self.why}"


class Damaged(Unreadable):
    """The file is there but is not a record of ours."""

    def line(self, what: Optional[str] = None) -> str:
        return f"{what or shown(self.path)} is damaged: {self.why}"


class NoPermission(Unreadable):
    """The file may be fine; this user may not read it (or search a folder above it)."""

    def line(self, what: Optional[str] = None) -> str:
        return f"no permission to read {shown(self.path)}: {self.why}"


def _denied(path: Path, exc: OSError) -> NoPermission:
    """Who owns what stands in the way, and what its owner can change (``fs_checks.no_permission``)."""
    why, fix = no_permission(path, "read", exc)
    detail = why.removeprefix("cannot be read: no permission") if why.startswith("cannot be read") else f"; {why}"
    return NoPermission(path, f"it cannot be read{detail}; {fix}")


def read_regular(path: str | os.PathLike, max_bytes: int = RECORD_MAX_BYTES, follow: bool = False) -> Optional[bytes]:
    """The bytes of ``path``, a regular file of its own; None when it does not exist. Opened with
    O_NONBLOCK (a FIFO never waits for a writer) and, unless ``follow``, O_NOFOLLOW (a link to
    another run's file, or to a device, is no record of this run); fstat must then say it is a
    regular file before a byte is read, and no more than ``max_bytes`` are read."""
    path = Path(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link (a dangling one too)
            what = "a symbolic link" if not follow else "a symbolic link that loops"
            raise Damaged(path, f"it is {what}, not a file of its own") from None
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise _denied(path, exc) from None
        if exc.errno == errno.ENOTDIR:
            return None  # a file where a folder above it belongs: nothing there to read
        raise Damaged(path, f"it cannot be opened ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Damaged(path, f"it is {kind(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise Damaged(path, f"it is {st.st_size} bytes, more than a record's {max_bytes}")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise _denied(path, exc) from None
        raise Damaged(path, f"it cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise Damaged(path, f"it grew past a record's {max_bytes} bytes while it was read")
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"it holds {name}, which is no number a record may hold")


def parse_json(data: bytes, path: str | os.PathLike) -> Any:
    """``data`` as strict JSON: UTF-8, no ``NaN``/``Infinity`` (nor a number too large to be
    finite, such as ``1e999``); anything else raises Damaged naming ``path``."""
    try:
        value = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise Damaged(path, f"it is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise Damaged(path, f"it is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise Damaged(path, "it is nested too deeply to be a record") from None
    except ValueError as exc:  # a NaN or Infinity (above), or an integer too long to convert
        raise Damaged(path, str(exc)) from None
    if not all_finite(value):
        raise Damaged(path, "it holds a number too large to be finite")
    return value


def read_json(path: str | os.PathLike, max_bytes: int = RECORD_MAX_BYTES, follow: bool = False) -> Optional[Any]:
    """A run folder's JSON record (``read_regular`` then ``parse_json``); None when it does not exist."""
    data = read_regular(path, max_bytes, follow)
    return None if data is None else parse_json(data, path)


def all_finite(value: Any) -> bool:
    """No float anywhere in ``value`` (parsed JSON) is NaN or infinite (json turns ``1e999`` into
    inf). A walk with its own stack: a deeply nested record costs no recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return False
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def number(value: Any) -> bool:
    """An int or a finite float, not a bool (JSON's true is no count and no time)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
