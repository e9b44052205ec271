"""One attempt's part of a rank's log, and the lines ``Run.wait`` prints as attempts start and end.

A rank's log holds every attempt of its run (or of its SLURM job), each starting with a marker:

- local: ``=== attempt K started <ctime> ===``, written by the supervisor before each attempt's
  ranks start (K: the run's attempt, from 1, as status and ``<run>/recovery.json`` count);
- SLURM: ``[launcher] rank R/W (local L) on HOST, job J attempt A, master ...``, the rank's first
  line (``orchestrator.backends.slurm.node.slurm_rank``), A being the job's attempt (from 0: ``SlurmJob.attempt``, one more
  per requeue and per restart inside the job). Attempt A of job J is
  the run's attempt ``first[J] + A``, ``first[J]`` being the first attempt ``recovery.json``
  records for job J (a spec submitted again goes on counting), else 1 (attempt A + 1).

What comes before a log's first marker belongs to the first attempt the log holds; a log with no
marker at all is attempt 1's. An attempt stopped by the health gate started no rank, so no log
holds it. Standard library only (with ``orchestrator.core.recovery``).

The user's script writes to the same log, and may print a line that reads exactly like a marker
(its own banner, an old log echoed, a nested run's output). Such a line must not move where an
attempt starts, so a marker is trusted only when it agrees with what the script cannot change
(``MarkerReader``, with the run's ``MarkerRules``):

- order: markers only go forward (the supervisor and the agent append one per attempt, counting
  up), so a line claiming the attempt the log is in, or an earlier one, is the script's;
- identity (SLURM): every marker of a task's log names the job and the rank of its first marker
  (the launcher's line, written before any of the script's);
- time (local): the supervisor's marker carries the time it was written, which falls between the
  attempt's start and its ranks' start as ``recovery.json`` records them (``Attempt.started``,
  ``times["ranks_at"]``); read modulo a quarter hour, which no time zone or summer time changes.

What is left: a script that prints a marker of the next attempt, with the time to the second, in
the second or two before that attempt starts (the markers hold no secret the script cannot
know: that takes a marker written with a per-run nonce, by the supervisor and the launcher).
A log, or a history, written before these rules is read as before: without a history, order alone.
"""

from __future__ import annotations

import calendar
import math
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Union

from orchestrator.core.errors import RunNotFoundError
from orchestrator.core.recovery import HISTORY_FILE, HISTORY_MAX_BYTES, Attempt, History

LOCAL_MARK = re.compile(r"=== attempt (\d+) started .*===")


def local_marker(attempt: int) -> str:
    """The line that starts attempt ``attempt`` in a local rank's log (``LOCAL_MARK`` reads it): the
    supervisor writes it before each attempt's ranks start, a rejoin before its new generation."""
    return f"=== attempt {attempt} started {time.ctime()} ===\n"
SLURM_MARK = re.compile(r"\[launcher\] rank (\d+/\d+) \(local \d+\) on \S+, job (\S+) attempt (\d+), master ")
#: The time in a local marker (``time.ctime()``: English names whatever the locale).
_CTIME = re.compile(r"=== attempt \d+ started \w{3} (\w{3}) +(\d{1,2}) (\d\d):(\d\d):(\d\d) (\d{4}) ===")
_MONTHS = {name: i for i, name in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct",
                                              "Nov", "Dec"), start=1)}
#: Every time zone's offset from UTC (summer time included) is a whole number of quarter hours.
ZONE_STEP_S = 900
#: A marker's time is cut to the second, and written a moment after the attempt's start is taken.
MARK_SLACK_S = 2.0
#: The beginnings a marker line can have: a partial line that could still become one is held back
#: until its end (``AttemptStream``).
_MARK_STARTS = ("=== attempt ", "[launcher] rank ")


class AttemptNotFoundError(RunNotFoundError):
    """The attempt asked for is not in the log; ``present`` lists the attempts the log holds."""

    def __init__(self, attempt: int, present: list[int], message: str = "") -> None:
        self.attempt, self.present = attempt, list(present)
        super().__init__(message or f"attempt {attempt} is not in the log: it holds {held(present)}")


def held(present: list[int]) -> str:
    """``attempt 1``, ``attempts 1, 2, 4``, ``no attempt``."""
    if not present:
        return "no attempt"
    return f"attempt {present[0]}" if len(present) == 1 else "attempts " + ", ".join(map(str, present))


# ---- the markers ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MarkerRules:
    """What the run's history says a marker must agree with: each SLURM job's first attempt
    (``first_attempts``), and for each local attempt the moments its marker was written between
    (its start and its ranks' start, from recovery.json)."""

    first: Mapping[str, int] = field(default_factory=dict)
    windows: Mapping[int, tuple[float, float]] = field(default_factory=dict)


#: What the splitting functions take: the rules, or (as before) each SLURM job's first attempt alone.
Rules = Union[MarkerRules, Mapping[str, int], None]


def marker_rules(history: Optional[History]) -> MarkerRules:
    """The rules a log of the run (or sweep point) whose history is ``history`` is read with."""
    windows: dict[int, tuple[float, float]] = {}
    for a in history.attempts if history is not None else []:
        times = a.times if isinstance(a.times, dict) else {}
        ranks_at = times.get("ranks_at")
        if isinstance(a.started, (int, float)) and isinstance(ranks_at, (int, float)) and ranks_at >= a.started:
            windows[a.number] = (float(a.started), float(ranks_at))
    return MarkerRules(first_attempts(history), windows)


def _rules(rules: Rules) -> MarkerRules:
    return rules if isinstance(rules, MarkerRules) else MarkerRules(dict(rules or {}))


def _claim(line: str, first: Mapping[str, int]) -> Optional[tuple[int, Optional[str]]]:
    """(attempt, identity) a marker-like line claims; the identity of a SLURM marker is its job and
    rank (the same in every marker of one task's log), None for a local one."""
    if line.startswith("=== attempt "):
        m = LOCAL_MARK.fullmatch(line)
        return (int(m.group(1)), None) if m else None
    if line.startswith("[launcher] rank "):
        m = SLURM_MARK.match(line)
        if m:
            return first.get(m.group(2), 1) + int(m.group(3)), f"job {m.group(2)} rank {m.group(1)}"
    return None


def _written_at(line: str) -> Optional[int]:
    """A local marker's time as its writer's wall clock read it, in seconds as if that zone were
    UTC (``calendar.timegm``: no zone of this machine's is involved); None when it holds none."""
    m = _CTIME.fullmatch(line)
    if m is None or m.group(1) not in _MONTHS:
        return None
    try:
        return calendar.timegm((int(m.group(6)), _MONTHS[m.group(1)], int(m.group(2)), int(m.group(3)),
                                int(m.group(4)), int(m.group(5)), 0, 0, 0))
    except (ValueError, OverflowError):
        return None


def on_time(line: str, window: Optional[tuple[float, float]]) -> bool:
    """Whether a local marker's time fits the moments its attempt's marker was written between
    (``window``: its start, its ranks' start), whatever the writer's zone: the difference is
    read modulo ``ZONE_STEP_S``. True when there is nothing to compare with (no window: an older
    history, or an attempt the history does not hold yet) or the window is too wide to tell."""
    if window is None:
        return True
    start, end = window
    span = end - start
    if span + 2 * MARK_SLACK_S >= ZONE_STEP_S / 2:
        return True  # a health gate of minutes: every quarter hour would fit
    written = _written_at(line)
    if written is None:
        return False  # the supervisor's marker always holds its time
    offset = (written - math.floor(start)) % ZONE_STEP_S
    return offset <= span + MARK_SLACK_S or offset >= ZONE_STEP_S - MARK_SLACK_S


class MarkerReader:
    """The markers of one log, in order, that its writer made (the module's doc: order, identity,
    time); any other marker-like line is the script's output, and plain text."""

    def __init__(self, rules: Rules = None) -> None:
        self.rules = _rules(rules)
        self.current: Optional[int] = None  # the attempt of the last trusted marker
        self.identity: Optional[str] = None  # a SLURM log's job and rank, from its first marker (None: local)

    def read(self, line: str) -> Optional[int]:
        """The attempt ``line`` (without its newline) starts, or None: not a marker, or not trusted."""
        claim = _claim(line, self.rules.first)
        if claim is None:
            return None
        number, identity = claim
        if self.current is not None and number <= self.current:
            return None  # markers only go forward
        if self.current is not None and identity != self.identity:
            return None  # another job's or rank's line echoed, or the other backend's kind of marker
        if identity is None and not on_time(line, self.rules.windows.get(number)):
            return None  # not written when that attempt started
        self.current, self.identity = number, identity
        return number


def _lines(text: str) -> list[str]:
    """The lines of ``text``, each with its newline (only ``\\n`` ends a line: a ``\\r`` of a
    progress bar does not)."""
    *complete, last = text.split("\n")
    return [line + "\n" for line in complete] + ([last] if last else [])


def _strip(line: str) -> str:
    return line[:-1] if line.endswith("\n") else line


def split_attempts(text: str, first: Rules = None) -> list[tuple[int, str]]:
    """The log cut at its trusted markers (``MarkerReader``; ``first``: the run's ``MarkerRules``,
    or each SLURM job's first attempt): (attempt, its text) in the log's order, the marker line
    included. What precedes the first marker goes with the first attempt; no marker: attempt 1."""
    segments: list[tuple[int, str]] = []
    current: Optional[int] = None
    buf: list[str] = []
    markers = MarkerReader(first)
    for line in _lines(text):
        number = markers.read(_strip(line))
        if number is None:
            buf.append(line)
            continue
        if current is not None:
            segments.append((current, "".join(buf)))
            buf = []
        current = number
        buf.append(line)
    segments.append((1 if current is None else current, "".join(buf)))
    return segments


def attempts_in(text: str, first: Rules = None) -> list[int]:
    """The attempts a log holds, in order."""
    return sorted({n for n, _ in split_attempts(text, first)})


def attempt_text(text: str, attempt: int, first: Rules = None) -> str:
    """Attempt ``attempt``'s part of a log (from its marker to the next attempt's). Raises
    AttemptNotFoundError, naming the attempts the log holds, when it holds no such attempt."""
    segments = split_attempts(text, first)
    parts = [part for n, part in segments if n == attempt]
    if not parts:
        raise AttemptNotFoundError(attempt, sorted({n for n, _ in segments}))
    return "".join(parts)


class AttemptStream:
    """``attempt_text`` for a log that grows (``logs -f --attempt K``, K the latest attempt): feed
    it what the log gained, get back what of it belongs to attempt K. ``done`` once a later
    attempt's marker came (attempt K's part has ended). A partial last line is passed on at once
    unless it may still become a marker."""

    def __init__(self, attempt: int, first: Rules = None) -> None:
        self.attempt, self.markers = attempt, MarkerReader(first)
        self.current: Optional[int] = None  # the attempt the log is in; None before its first marker
        self.found = False  # attempt K's text (or, for attempt 1, the log's start) was seen
        self.done = False
        self.present: list[int] = []
        self._held: list[str] = []  # lines before the first marker, while the attempt they belong to is unknown
        self._partial = ""  # the start of a line that may be a marker
        self._midline = False  # a partial line was passed on: the rest of that line is no marker either

    def feed(self, text: str) -> str:
        out: list[str] = []
        for piece in _lines(text):
            if self.done:
                break
            complete = piece.endswith("\n")
            if self._midline:
                self._plain(piece, out)
                self._midline = not complete
                continue
            line, self._partial = self._partial + piece, ""
            if complete:
                self._line(line, out)
            elif any(s.startswith(line) or line.startswith(s) for s in _MARK_STARTS):
                self._partial = line
            else:
                self._plain(line, out)
                self._midline = True
        return "".join(out)

    def finish(self) -> str:
        """The log has ended: what is left (a last line without its newline)."""
        out: list[str] = []
        if self._partial and not self.done:
            self._line(self._partial, out)
        self._partial = ""
        if self.current is None and self.attempt == 1:
            self.found = True  # a log with no marker is attempt 1's
        return "".join(out)

    def _plain(self, text: str, out: list[str]) -> None:
        if self.current is None:
            if self.attempt == 1:  # the log's start is attempt 1's until a marker says otherwise
                self.found = True
                out.append(text)
            else:
                self._held.append(text)
        elif self.current == self.attempt:
            out.append(text)

    def _line(self, line: str, out: list[str]) -> None:
        number = self.markers.read(_strip(line))
        if number is None:
            self._plain(line, out)
            return
        if number not in self.present:
            self.present.append(number)
        if number != self.attempt and (self.current == self.attempt or (self.current is None and self.found)):
            self.done = True  # attempt K (or, for attempt 1, the log's start) has ended
            return
        if self.current is None and number == self.attempt:
            out.extend(self._held)  # what preceded the first marker goes with the first attempt
        self._held = []
        self.current = number
        if number == self.attempt:
            self.found = True
            out.append(line)


# ---- recovery.json ----------------------------------------------------------------------------------
def history_signature(folder: str | Path) -> Optional[tuple[int, int, int]]:
    """What changes when ``<folder>/recovery.json`` is rewritten (it is replaced whole); None when
    it is missing, not a regular file of its own (a FIFO would block the read; a link is another
    file's) or too large to be one."""
    try:
        st = os.lstat(Path(folder) / HISTORY_FILE)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size > HISTORY_MAX_BYTES:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def read_history(folder: str | Path) -> Optional[History]:
    """The attempts in ``<folder>/recovery.json``; None when it is missing, damaged or empty."""
    if history_signature(folder) is None:
        return None
    try:
        history = History.load(folder)
    except (OSError, ValueError, TypeError, AttributeError, RecursionError):
        return None
    good = [a for a in history.attempts if isinstance(a.number, int) and not isinstance(a.number, bool)]
    if not good:
        return None
    history.attempts = sorted(good, key=lambda a: a.number)
    return history


def first_attempts(history: Optional[History]) -> dict[str, int]:
    """Each SLURM job's first attempt in the history (its SLURM_RESTART_COUNT 0)."""
    first: dict[str, int] = {}
    for a in history.attempts if history is not None else []:
        job = getattr(a, "job", "")
        if isinstance(job, str) and job and (job not in first or a.number < first[job]):
            first[job] = a.number
    return first


def job_of_log(path: str | Path) -> Optional[str]:
    """The job of a SLURM task log ``<job>_<task>_log.out`` (``<array>_<index>`` in an array)."""
    name = Path(path).name
    if not name.endswith("_log.out") or "_" not in name[:-len("_log.out")]:
        return None
    return name[:-len("_log.out")].rsplit("_", 1)[0]


# ---- what changed between two looks at recovery.json ----------------------------------------------------
_NODES_SHOWN = 8
_WHY_MAX = 300


def _nodes(a: Attempt) -> str:
    nodes = [str(n) for n in a.nodes] if isinstance(a.nodes, list) else []
    if not nodes:
        return ""
    if len(nodes) > _NODES_SHOWN:
        return f" on {','.join(nodes[:_NODES_SHOWN])},... ({len(nodes)} nodes)"
    return f" on {','.join(nodes)}"


def _one_line(text: object) -> str:
    lines = str(text or "").strip().splitlines()
    line = " ".join(lines[0].split()) if lines else ""
    return line if len(line) <= _WHY_MAX else line[:_WHY_MAX - 3] + "..."


_ACTIONS = {"restart": "restarting (recovery)", "requeue": "requeued for the time limit or a preemption",
            "stop": "not restarted"}


def started_line(a: Attempt) -> str:
    return f"attempt {a.number} started{_nodes(a)}"


def ended_line(a: Attempt) -> str:
    """``attempt 1 ended: crash (rank 1 raised RuntimeError: boom); restarting (recovery)``."""
    why = _one_line(a.why) if a.outcome != "completed" else ""
    line = f"attempt {a.number} ended: {a.outcome}" + (f" ({why})" if why else "")
    blamed = [str(n) for n in a.blamed] if isinstance(a.blamed, list) else []
    if blamed:
        line += f"; blamed: {', '.join(blamed)}"
    if a.action in _ACTIONS:
        line += f"; {_ACTIONS[a.action]}"
    return line


def history_changes(old: Optional[History], new: History) -> list[str]:
    """What ``new`` adds to ``old`` (None: nothing seen before), one line each: every attempt
    that started (again: its start time changed) and every attempt that ended. An attempt that
    vanished is not news."""
    before = {a.number: a for a in old.attempts} if old is not None else {}
    lines: list[str] = []
    for a in sorted(new.attempts, key=lambda a: a.number):
        seen = before.get(a.number)
        if seen is None or seen.started != a.started:
            lines.append(started_line(a))
            seen = None
        if a.outcome is not None and (seen is None or seen.outcome is None):
            lines.append(ended_line(a))
    return lines


#: The accounting daemon learns that a job started a few seconds after its agent has recorded the
#: attempt: until then sacct still answers PENDING. An attempt still running after this long while
#: the scheduler says PENDING was ended with its job (a node failure under --requeue kills the agent
#: before it records anything).
SCHEDULER_LAG_S = 60.0


def requeued(last: Attempt, now: float) -> bool:
    """Whether a PENDING answer for a job whose latest attempt is ``last`` means SLURM requeued it:
    the attempt ended (requeue, restart, preemption), or it started long enough ago that the
    scheduler's lag cannot explain it. A PENDING that arrives just after the attempt started is
    sacct not knowing yet, never a requeue."""
    if last.ended is not None or last.outcome is not None:
        return True
    started = last.started if isinstance(last.started, (int, float)) else now
    return now - started >= SCHEDULER_LAG_S


def pending_line(job: str) -> str:
    return f"job {job} is pending again (requeued); waiting for an allocation"


class AttemptWatch:
    """What ``Run.wait`` says about attempts, look by look: ``look(folder, state, job_ids)``
    returns the lines to print. recovery.json is read at most once a look, and only when its
    stat changed; a missing or damaged one says nothing. The first look only takes note (what
    happened before the wait is not news), except that a SLURM job pending after an attempt
    says so once per attempt."""

    def __init__(self, slurm: bool) -> None:
        self.slurm = slurm
        self.folder: Optional[Path] = None
        self.signature: Optional[tuple[int, int, int]] = None
        self.history: Optional[History] = None
        self.started = False
        self.pending_said: Optional[int] = None

    def look(self, folder: str | Path, pending: bool, job_ids: list[str], now: Optional[float] = None) -> list[str]:
        """``now``: wall-clock time (the attempts' own clock); defaults to ``time.time()``."""
        now = time.time() if now is None else now
        folder = Path(folder)
        lines: list[str] = []
        if folder != self.folder:  # another sweep point: its own history
            self.folder, self.signature, self.history, self.pending_said = folder, None, None, None
        signature = history_signature(folder)
        if signature is not None and signature != self.signature:
            self.signature = signature
            new = read_history(folder)
            if new is not None:
                if self.started:
                    lines.extend(history_changes(self.history, new))
                self.history = new
        self.started = True
        if self.slurm and pending and self.history is not None and self.history.attempts:
            last = self.history.attempts[-1]
            job = getattr(last, "job", "") or ""
            if (not job or job in job_ids) and self.pending_said != last.number and requeued(last, now):
                self.pending_said = last.number
                lines.append(pending_line(job or ", ".join(job_ids[:3]) or "?"))
        return lines
