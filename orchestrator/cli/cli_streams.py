"""The CLI process's own output and its one-line errors: stdout and stderr written so that a
reader that goes away (``orchestrator status | head -1``) costs nothing but the lines it did not
read, text that is not UTF-8 written as its bytes, and an ``OSError`` that escaped a subcommand
told as one line naming the path and the fix."""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import sys
from typing import Any, Iterator

#: What to do about an errno, after the path and the errno's meaning.
_ERRNO_FIX = {
    "EACCES": "check its owner and permissions (ls -ld), or use a location you can write",
    "EPERM": "check its owner and permissions (ls -ld), or use a location you can write",
    "ENOSPC": "the filesystem is full: free space there (df -h), or use another location",
    "EDQUOT": "your disk quota there is used up: free space, or use another location",
    "EROFS": "that filesystem is mounted read-only: use a writable location (the registry: ORCHESTRATOR_HOME; "
             "run folders: runs_dir in the spec)",
    "ENAMETOOLONG": "a name on that path is too long for the filesystem: use a shorter spec name, runs_dir or "
                    "ORCHESTRATOR_HOME",
    "ELOOP": "a symbolic link on that path points back to itself: fix or remove the link",
    "ENOTDIR": "a file stands where a folder belongs: remove or rename it",
    "EISDIR": "a folder stands where a file belongs: remove or rename it",
    "EMFILE": "too many open files: raise the limit (ulimit -n)",
    "ENFILE": "the system has too many open files: try again later",
    "EIO": "the disk or network filesystem reported an I/O error: check it (dmesg)",
}


def os_error_line(exc: OSError) -> str:
    """One line for an OSError that escaped a subcommand: the path(s), the errno's meaning, the fix."""
    import errno

    from orchestrator.core.fs_checks import cwd_gone, errno_text, shown

    names = [f for f in (exc.filename, exc.filename2) if f is not None]
    if exc.errno == errno.ENOENT and cwd_gone() and not any(isinstance(f, (str, bytes)) and os.path.isabs(f)
                                                            for f in names):
        return ("the current folder no longer exists (it was deleted or moved): cd to an existing folder "
                "and run the command again")
    where = " -> ".join(shown(f) for f in names)
    fix = _ERRNO_FIX.get(errno.errorcode.get(exc.errno, "") if isinstance(exc.errno, int) else "", "")
    text = " ".join(errno_text(exc).split())
    line = f"{where}: {text}" if where else text
    return f"{line}; {fix}" if fix else line


def not_utf8_line() -> str:
    from orchestrator.core.fs_checks import shown

    try:
        cwd = os.getcwd()
    except OSError:
        cwd = ""
    if any("\udc80" <= c <= "\udcff" for c in cwd):  # os.getcwd() escapes bytes that are not UTF-8 so
        return (f"the current folder's name is not valid UTF-8 ({shown(cwd)}), and the run's files record it "
                "as text: run from a folder whose name is UTF-8")
    return ("a path or name here is not valid UTF-8 and cannot be written as JSON: rename it, or run from a folder "
            "whose name is UTF-8")


class _PipeEnd(io.RawIOBase):
    """fd 1 or 2 for the CLI's own output. When the reader goes away (``orchestrator status |
    head -1``), the write that meets EPIPE and every later one go to /dev/null and
    ``reader_gone`` is set, so the command runs to its end and exits with its own code,
    instead of a BrokenPipeError in whatever print() happened to meet it."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        self.gone = False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: Any) -> int:
        if self.gone:
            return len(data)
        try:
            view, done = memoryview(data).cast("B"), 0
            while done < len(view):  # all of it: without a buffer above (python -u), nobody retries the rest
                done += os.write(self._fd, view[done:])
            return done
        except BrokenPipeError:
            self.gone = True
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._fd)
            os.close(null)
            return len(data)


class _Text(io.TextIOWrapper):
    @property
    def reader_gone(self) -> bool:
        raw = getattr(self.buffer, "raw", self.buffer)
        return bool(getattr(raw, "gone", False))


def _wrapped(stream: Any) -> Any:
    """The process's stdout or stderr behind a _PipeEnd, and text that is not UTF-8 (a folder's
    name, surrogate-escaped by Python) written as its own bytes instead of raising
    UnicodeEncodeError; None when it is not a plain file descriptor stream."""
    try:
        fd = stream.fileno()
        encoding, errors = stream.encoding, stream.errors
    except (AttributeError, OSError, ValueError):
        return None
    if errors == "strict":
        errors = "surrogateescape" if codecs.lookup(encoding).name == "utf-8" else "backslashreplace"
    stream.flush()
    raw = _PipeEnd(fd)
    unbuffered = not isinstance(getattr(stream, "buffer", None), io.BufferedWriter)  # python -u, PYTHONUNBUFFERED
    buffer: Any = raw if unbuffered else io.BufferedWriter(raw)  # a raw end is a buffer to TextIOWrapper (-u)
    return _Text(buffer, encoding=encoding, errors=errors,
                 line_buffering=stream.line_buffering, write_through=unbuffered or stream.write_through)


@contextlib.contextmanager
def process_streams() -> Iterator[None]:
    """While main() runs as the process itself (its stdout and stderr are the process's own, not
    a test's StringIO), write them through _wrapped."""
    saved = sys.stdout, sys.stderr
    new = [_wrapped(s) if s is not None and s is real else None
           for s, real in ((sys.stdout, sys.__stdout__), (sys.stderr, sys.__stderr__))]
    sys.stdout, sys.stderr = (mine if mine is not None else old for mine, old in zip(new, saved))
    try:
        yield
    finally:
        for stream in new:
            if stream is not None:
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
        sys.stdout, sys.stderr = saved
