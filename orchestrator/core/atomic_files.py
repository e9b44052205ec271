"""Files replaced atomically: a reader (another node, status, the agent) sees the old file or the
new one, never half of one. Standard library only, and nothing else: every rank and every health
gate task writes with these, and importing the run records (``orchestrator.core.records``: typing,
enum, the states) for them cost each of those interpreters ~7 ms.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _temp_beside(path: Path) -> tuple[int, str]:
    """A new file next to ``path`` for an atomic replace (tempfile's mkstemp, without importing
    tempfile on every rank): unique per process and call, created exclusively. Its mode is 0o666
    less the umask, as any file the user creates (0o644 under the usual 022, 0o664 under a group's
    002), and the rename keeps it: the group's members can read a run folder its umask lets them."""
    while True:
        tmp = str(path.parent / f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


def write_json_atomic(path: str | Path, data: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, default=str)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    path = Path(path)
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:  # a full disk must not be left fuller by a half-written temp file
        Path(tmp).unlink(missing_ok=True)
        raise
