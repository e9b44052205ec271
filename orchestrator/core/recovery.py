"""Recovery: which failure restarts a job, which nodes it excludes, and when to give up.

One pure decision (``decide``) shared by the local supervisor, which restarts the ranks in place,
and the SLURM agent, which requeues the job with the blamed nodes excluded. What each attempt was
and how it ended is kept in ``<run>/recovery.json`` (``History``): status lists it, the next
attempt reads it (a restart count, the nodes excluded so far, the attempts in a row without
progress). One writer at a time: the attempt's own supervisor or agent.

Rules (the spec's ``recovery`` section):

- a failure restarts when its kind is in ``recovery.on`` and fewer than ``max_restarts``
  restarts were used; time-limit requeues (``slurm.max_requeues``) are counted apart;
- a node is blamed by the health gate, by a node failure, by a rank a hardware-like signal
  killed there (SIGBUS, SIGILL), or by a hung rank whose stack is not inside a collective; a
  Python traceback is the code's fault and blames nothing; blamed nodes are excluded from later
  attempts (``exclude_failed_nodes``);
- progress is a new or changed file under the checkpoint folder between an attempt's start and
  its end: after ``stop_without_progress`` failed attempts in a row without progress the job
  stops with reason "no progress" (an attempt the health gate stopped ran nothing and counts
  neither way). Never a loop. When no checkpoint ever appeared in that folder during the whole run,
  the verdict says so rather than "the failure repeats": the script may save its checkpoints elsewhere.

Standard library only: the agent imports it on a compute node.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from orchestrator.core.payload import RecoverySettings
from orchestrator.core.safe_read import Damaged, Unreadable, number, read_json
from orchestrator.core.states import Action, EndReason, FailureKind, Outcome

KINDS = tuple(FailureKind)
#: Signals that point at the machine rather than the code: a bus error (ECC, a dying disk behind
#: an mmap) or an illegal instruction (a CPU or a driver). A segfault or an OOM kill does not.
HARDWARE_SIGNALS = frozenset({"SIGBUS", "SIGILL", "Bus error", "Illegal instruction"})
#: The checkpoint folder is read at every attempt's start and end; a bound keeps a folder with
#: millions of files from stalling the agent (past it, progress is judged on the first files).
FINGERPRINT_MAX_FILES = 20_000
HISTORY_FILE = "recovery.json"
#: ``recovery.json`` is a few kilobytes; anything much larger is not one (and is not read).
HISTORY_MAX_BYTES = 8 << 20


def checkpoint_fingerprint(directory: str | Path) -> str:
    """A digest of the files under the checkpoint folder (path, size, mtime; hidden ones skipped):
    it changes when a checkpoint is written. '' when the folder is missing or empty."""
    root = Path(directory)
    entries: list[str] = []
    try:
        for base, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # hidden: the health gate's tokens
            for name in sorted(f for f in files if not f.startswith(".")):
                path = os.path.join(base, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                entries.append(f"{os.path.relpath(path, root)}\0{st.st_size}\0{st.st_mtime_ns}")
                if len(entries) >= FINGERPRINT_MAX_FILES:
                    break
            if len(entries) >= FINGERPRINT_MAX_FILES:
                break
    except OSError:
        return ""
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()[:16] if entries else ""


@dataclass
class Attempt:
    """One attempt of a run (of one sweep point): where it ran and how it ended."""

    number: int  # 1, 2, ...: the run's attempts, restarts and requeues alike
    started: float
    nodes: list[str] = field(default_factory=list)
    job: str = ""  # the SLURM job id ('' locally)
    checkpoint_at_start: str = ""
    checkpoint_dir: str = ""  # the folder its progress is looked for in (checkpoint.dir; '' in older records)
    ended: Optional[float] = None
    #: completed, crash, node_failure, hang, unhealthy, cancelled, timeout, requeued (time limit
    #: or preemption), lost (its supervisor or agent was killed before it recorded the end), or
    #: None while it runs
    outcome: Optional[str] = None
    why: str = ""
    blamed: list[str] = field(default_factory=list)
    progress: Optional[bool] = None
    action: str = ""  # restart, requeue, stop, or '' (the run ended)
    health: dict[str, str] = field(default_factory=dict)  # node -> what the health gate found wrong
    inside_job: bool = False  # its restart ran inside the same SLURM job (recovery.in_allocation), no requeue
    #: its moments (orchestrator.core.attempt_times): gate_s, ranks_at, joined_at, first_step_at, failed_at...
    times: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        """An attempt as recovery.json holds it; ValueError names the first field of the wrong type
        (every reader formats these fields, so a string where a number belongs must stop here)."""
        for key, (check, expected) in _ATTEMPT_FIELDS.items():
            if key in data and not check(data[key]):
                raise ValueError(f"its {key!r} is {_what(data[key])}, not {expected}")
        missing = [key for key in ("number", "started") if key not in data]
        if missing:
            raise ValueError(f"it has no {missing[0]!r}")
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def _what(value: Any) -> str:
    """A wrong value, briefly: its JSON type, and the value when it is short."""
    name = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")
    text = json.dumps(value, default=str)
    return f"{name} {text}" if len(text) <= 40 else name


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


#: What recovery.json may hold for each field of an attempt (as ``History.save`` writes it), and
#: how a message names it. Times are finite: a NaN would print as "recovered in nans".
_ATTEMPT_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "number": (_is_int, "a whole number"), "started": (number, "a time in seconds"),
    "nodes": (_strings, "a list of node names"), "job": (_is_str, "a job id"),
    "checkpoint_at_start": (_is_str, "a fingerprint"), "checkpoint_dir": (_is_str, "a folder"),
    "ended": (_optional(number), "a time in seconds or null"),
    "outcome": (_optional(_is_str), "an outcome or null"), "why": (_is_str, "text"),
    "blamed": (_strings, "a list of node names"), "progress": (_optional(_is_bool), "true, false or null"),
    "action": (_is_str, "an action"), "inside_job": (_is_bool, "true or false"),
    "health": (lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
               "an object of node -> problem"),
    "times": (lambda v: isinstance(v, dict) and all(number(x) for x in v.values()),
              "an object of moment -> finite seconds"),
}


def _parse_history(data: Any) -> tuple[list[Attempt], list[str]]:
    """recovery.json's attempts and excluded nodes, checked; ValueError says what is wrong."""
    if not isinstance(data, dict):
        raise ValueError(f"it holds {_what(data)}, not an object with 'attempts'")
    raw, excluded = data.get("attempts", []), data.get("excluded", [])
    if not isinstance(raw, list):
        raise ValueError(f"its 'attempts' is {_what(raw)}, not a list")
    if not _strings(excluded):
        raise ValueError(f"its 'excluded' is {_what(excluded)}, not a list of node names")
    attempts = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ValueError(f"attempt entry {i + 1} is {_what(item)}, not an object")
        try:
            attempts.append(Attempt.from_dict(item))
        except ValueError as exc:
            raise ValueError(f"attempt entry {i + 1}: {exc}") from None
    return attempts, list(excluded)


@dataclass
class History:
    """``<run>/recovery.json``: every attempt, and the nodes excluded so far."""

    path: Path
    attempts: list[Attempt] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, run_dir: str | Path) -> History:
        """The history, checked (what ``status``, ``list`` and ``report`` show): empty when there is
        no recovery.json yet. A FIFO, a device or a link there is never opened blocking, nor read
        past ``HISTORY_MAX_BYTES``; it, bad JSON, NaN or a field of the wrong type raise
        ``safe_read.Damaged``, and a file this user may not read ``safe_read.NoPermission``: one
        line each (``Unreadable.line``), so the caller shows the rest of the run."""
        path = Path(run_dir) / HISTORY_FILE
        data = read_json(path, HISTORY_MAX_BYTES)
        if data is None:
            return cls(path)
        try:
            attempts, excluded = _parse_history(data)
        except ValueError as exc:
            raise Damaged(path, str(exc)) from None
        return cls(path, attempts, excluded)

    @classmethod
    def load(cls, run_dir: str | Path) -> History:
        """``read``, with an unreadable history taken as none: the attempt's owner then starts a
        new one (and rewrites the file), and a reader that only counts attempts counts none."""
        try:
            return cls.read(run_dir)
        except Unreadable:
            return cls(Path(run_dir) / HISTORY_FILE)

    @classmethod
    def shown(cls, run_dir: str | Path) -> tuple[History, Optional[str]]:
        """What ``status`` and ``report`` show: the history, and, when it cannot be read, an empty
        one with the one line that says why (damaged, or no permission to read it) and what to do."""
        try:
            return cls.read(run_dir), None
        except Damaged as exc:
            return cls(Path(run_dir) / HISTORY_FILE), (
                exc.line(f"{HISTORY_FILE} in {Path(run_dir)}") + "; its attempts are not shown: move it aside to keep "
                "it (the run's next attempt writes a new one)")
        except Unreadable as exc:
            return cls(Path(run_dir) / HISTORY_FILE), exc.line()

    def save(self) -> None:
        from orchestrator.core.atomic_files import write_json_atomic

        write_json_atomic(self.path, {"attempts": [asdict(a) for a in self.attempts], "excluded": self.excluded})

    # -- what the decision reads ---------------------------------------------------------------
    def restarts(self) -> int:
        return sum(1 for a in self.attempts if a.action == Action.RESTART)

    def restarts_by_requeue(self) -> int:
        """Restarts that requeued the SLURM job (those inside the job need no requeue)."""
        return sum(1 for a in self.attempts if a.action == Action.RESTART and not a.inside_job)

    def requeues(self) -> int:
        return sum(1 for a in self.attempts if a.action == Action.REQUEUE)

    def failures_without_progress(self) -> int:
        """Failed attempts in a row, most recent last, that wrote no new checkpoint (an attempt the
        health gate stopped ran nothing and is skipped)."""
        streak = 0
        for a in reversed(self.attempts):
            if a.outcome is None or a.outcome == Outcome.UNHEALTHY:  # the attempt being decided on, or a gate's
                continue
            if a.outcome in KINDS and a.progress is False:
                streak += 1
            else:
                break
        return streak

    def checkpoints_never_seen(self) -> bool:
        """No attempt ever saw a checkpoint: each one started with the checkpoint folder empty or
        missing, and none recorded progress. Then "no progress" cannot tell a failure that repeats
        from a script that saves its checkpoints somewhere else."""
        return all(not a.checkpoint_at_start and a.progress is not True for a in self.attempts)

    def checkpoint_dir(self) -> str:
        """The checkpoint folder the latest attempt looked in ('' when no record names one)."""
        return next((a.checkpoint_dir for a in reversed(self.attempts) if a.checkpoint_dir), "")

    # -- what the owner of an attempt writes -------------------------------------------------------
    def begin(self, number: int, nodes: Iterable[str], checkpoint_dir: str | Path, job: str = "") -> Attempt:
        """Record an attempt's start (replacing a record of the same number: the same attempt
        started again, e.g. after its agent was restarted by the controller)."""
        self.attempts = [a for a in self.attempts if a.number != number]
        attempt = Attempt(number=number, started=time.time(), nodes=list(nodes), job=job,
                          checkpoint_at_start=checkpoint_fingerprint(checkpoint_dir),
                          checkpoint_dir=str(checkpoint_dir))
        self.attempts.append(attempt)
        self.attempts.sort(key=lambda a: a.number)
        self.save()
        return attempt

    def close_lost(self, why: str) -> list[Attempt]:
        """Attempts that never recorded their end (their supervisor or agent was killed) are
        recorded as lost, never left 'running'. Returns them."""
        lost = [a for a in self.attempts if a.ended is None]
        for a in lost:
            a.ended, a.outcome, a.why = time.time(), Outcome.LOST, why
        if lost:
            self.save()
        return lost

    def progressed(self, attempt: Attempt, checkpoint_dir: str | Path) -> bool:
        now = checkpoint_fingerprint(checkpoint_dir)
        return bool(now) and now != attempt.checkpoint_at_start

    def finish(self, attempt: Attempt, outcome: str, why: str = "", *, progress: Optional[bool] = None,
               action: str = Action.NONE, blamed: Iterable[str] = (), exclude: Iterable[str] = ()) -> None:
        attempt.ended, attempt.outcome, attempt.why, attempt.action = time.time(), outcome, why, action
        attempt.progress, attempt.blamed = progress, sorted(set(blamed))
        self.excluded = sorted(set(self.excluded) | set(exclude))
        self.save()


@dataclass(frozen=True)
class Failure:
    """What ended an attempt, as the supervisor or the agent saw it."""

    kind: FailureKind
    why: str
    blamed: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    restart: bool
    #: why not, as end.json's reason: the failure's own kind, no_progress, not_enough_nodes
    reason: EndReason
    message: str  # one line for the user: what happens and why
    exclude: tuple[str, ...] = ()


def decide(settings: RecoverySettings, history: History, failure: Failure, progressed: bool,
           nodes_needed: int = 0, nodes_available: Optional[int] = None) -> Decision:
    """Restart or stop after ``failure`` (pure: reads the history, changes nothing).

    ``nodes_available``: on SLURM, how many nodes of the job's partition could still run it
    before this failure's exclusions (None: not known, or local)."""
    kind = EndReason(failure.kind)
    if settings.max_restarts == 0:
        return Decision(False, kind, "")
    if kind not in settings.on:
        return Decision(False, kind, f"recovery.on does not list {kind}: no restart")
    used = history.restarts()
    if used >= settings.max_restarts:
        return Decision(False, kind, f"no restarts left ({used} of {settings.max_restarts} used; "
                                     "recovery.max_restarts)")
    if kind != EndReason.UNHEALTHY:
        streak = history.failures_without_progress() + (0 if progressed else 1)
        if streak >= settings.stop_without_progress:
            return Decision(False, EndReason.NO_PROGRESS, no_progress_message(settings, history, streak, progressed))
    exclude = tuple(sorted(set(failure.blamed) - set(history.excluded))) if settings.exclude_failed_nodes else ()
    if nodes_available is not None and nodes_available - len(exclude) < nodes_needed:
        left = nodes_available - len(exclude)
        return Decision(False, EndReason.NOT_ENOUGH_NODES,
                        f"only {max(left, 0)} node(s) of the partition are left once "
                        f"{', '.join(sorted(set(history.excluded) | set(exclude)))} are excluded, and the job needs "
                        f"{nodes_needed}: no restart")
    where = f"; excluding {', '.join(exclude)}" if exclude else ""
    return Decision(True, kind, f"{kind}: {failure.why}; restart {used + 1} of {settings.max_restarts}{where}",
                    exclude)


def no_progress_message(settings: RecoverySettings, history: History, streak: int, progressed: bool) -> str:
    """Why the run stops for "no progress". A checkpoint folder that never held a checkpoint in the
    whole run is named with both ways out (the script may save its checkpoints elsewhere, or fail
    before its first); only after checkpoints were seen does the failure repeat."""
    keep = settings.survivors == "keep"
    rule = f"recovery.stop_without_progress: {settings.stop_without_progress}"
    if progressed or not history.checkpoints_never_seen():
        return (f"no progress: {streak} attempt(s) in a row failed before writing a new checkpoint"
                f"{' or training past the last step' if keep else ''} ({rule}); the failure repeats, so fix it "
                "and submit again")
    folder = history.checkpoint_dir()
    where = f"{folder} (checkpoint.dir; {rule})" if folder else f"checkpoint.dir ({rule})"
    every = min(settings.max_restarts + 1, 1000)  # past max_restarts the rule never stops a run
    return (f"no progress: {streak} attempt(s) in a row failed, and no checkpoint ever appeared in {where}"
            f"{' and no attempt trained past the last step' if keep else ''}: if the script saves its checkpoints "
            f"elsewhere, set checkpoint.dir to that folder (or recovery.stop_without_progress: {every} to use every "
            "restart regardless); if it fails before its first checkpoint, fix it and submit again")


def describe(history: History) -> list[str]:
    """Status's lines about the attempts: one per attempt (where, how it ended, what followed),
    and the nodes excluded. Nothing for a run whose only attempt is running or ended well."""
    attempts = history.attempts
    quiet = len(attempts) <= 1 and not history.excluded and all(
        a.outcome in (None, Outcome.COMPLETED) and not a.health for a in attempts)
    if quiet:
        return []
    lines = [f"attempts: {len(attempts)} ({history.restarts()} restart(s), {history.requeues()} requeue(s) "
             "for the time limit or a preemption)" + (f"; excluded: {', '.join(history.excluded)}"
                                                      if history.excluded else "")]
    from orchestrator.core.attempt_times import phases_line, recovery_shown

    followed: dict[str, str] = {action: action.done for action in Action if action.done}
    for i, a in enumerate(attempts):
        phases = recovery_shown(attempts[i - 1], a) if i and isinstance(a.times, dict) and \
            isinstance(attempts[i - 1].times, dict) else None
        recovered = [f"    {phases_line(phases, attempts[i - 1].number)}"] if phases is not None else []
        where = f" on {','.join(a.nodes)}" if a.nodes else ""
        if a.outcome is None:
            lines += [f"  attempt {a.number}{where}: running", *recovered]
            continue
        then = f", {followed[a.action]}" if a.action in followed else ""
        if a.action == Action.RESTART and a.inside_job:
            then = ", restarted inside the job"
        blamed = f"; blamed: {', '.join(a.blamed)}" if a.blamed else ""
        progress = "" if a.progress is None else ("; no new checkpoint" if not a.progress else
                                                  "; trained past the last attempt's step"
                                                  if isinstance(a.times, dict) and a.times.get("stepped") else
                                                  "; new checkpoint")
        why = f": {a.why}" if a.why and a.outcome != Outcome.COMPLETED else ""
        lines += [f"  attempt {a.number}{where}: {a.outcome}{then}{why}{blamed}{progress}", *recovered]
        for node, problem in sorted(a.health.items()):
            lines.append(f"    unhealthy {node}: {problem}")
    return lines
