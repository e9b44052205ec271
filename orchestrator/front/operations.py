"""status / list / logs / cancel as the CLI prints them, over the Python API (api.py).

Status for many runs asks each executor once for all its runs (``api.refresh_records``), so SLURM
status over N jobs costs one scheduler query, not N.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from orchestrator import api
from orchestrator.api import Run
from orchestrator.core.attempt_logs import AttemptStream, attempts_in, held, marker_rules
from orchestrator.core.errors import OrchestratorError, RunNotFoundError, UsageError
from orchestrator.core.fs_checks import errno_text, kind, read_file, shown
from orchestrator.core.shell_words import command_line, quoted_command
from orchestrator.core.records import RunRecord, no_permission, registered_runs
from orchestrator.core.recovery import History, describe
from orchestrator.front.run_files import attempt_part, log_history
from orchestrator.core.run_folder import RunFolder
from orchestrator.core.stacks import wait_lines
from orchestrator.core.states import State

#: `logs -f` on a run that has not started yet waits this long for its first line, then says so.
FOLLOW_START_TIMEOUT_S = 600.0
#: States whose recorded error and rank positions `status` does not show (none yet, or none that matters).
_QUIET = frozenset({State.COMPLETED, State.RUNNING, State.PENDING})


def _records(refs: list[str]) -> list[RunRecord]:
    """The runs' records, each read once. Explicit refs must all resolve; over the whole
    registry, a damaged run is reported and skipped so the others are still listed."""
    if refs:
        return [Run.get(r).record for r in refs]
    found = []
    for entry in registered_runs():
        folder = Path(entry["run_dir"])
        record = RunFolder(folder).record
        try:
            mode = os.stat(record).st_mode  # a dangling link or a loop raises: reported below
            if not stat.S_ISREG(mode):  # a FIFO or a device is never opened; a folder is no record
                raise RunNotFoundError(f"{shown(record)} is {kind(mode)}, not a regular file: inspect the run's "
                                       f"other files, then remove or rename {shown(folder)}")
            found.append(RunRecord.load(folder))
            continue
        except OrchestratorError as exc:
            why = _one_line(exc)
        except PermissionError:  # another user's run folder, closed to us: nothing is wrong with it
            why = _one_line(no_permission(record))
        except OSError as exc:
            if not os.path.lexists(record):
                continue  # the folder was removed (or moved): nothing left to list
            why = (f"{shown(record)} cannot be read ({errno_text(exc)}): inspect the run's other files, then remove "
                   f"or rename {shown(folder)}")
        print(f"warning: skipping {entry['run_id'][:200]!r}: {why}", file=sys.stderr)
    return found


def _one_line(exc: BaseException | str) -> str:
    text = " ".join(str(exc).split())
    return text if text.isprintable() else ascii(text)[1:-1]


def status(refs: list[str], as_json: bool = False) -> int:
    unreachable: list[str] = []
    # A scheduler that cannot be asked (SLURM runs registered, and no cluster from here) hides no run:
    # its runs are shown as last recorded, with a warning; naming such a run makes the exit code 1.
    records = api.refresh_records(_records(refs), on_unreachable=lambda name, exc: unreachable.append(
        f"warning: could not ask the {name} scheduler ({_one_line(exc)}): its runs are shown as last recorded"))
    for line in unreachable:
        print(line, file=sys.stderr)
    code = 1 if unreachable and refs else 0
    if as_json:
        print(json.dumps([asdict(r) for r in records], indent=2, default=str))
        return code
    if not records:
        print("no runs registered yet; start one with 'orchestrator run SPEC'")
        return 0
    for rec in records:
        ids = ",".join(rec.job_ids) if len(rec.job_ids) <= 3 else f"{rec.job_ids[0]}..{rec.job_ids[-1]} ({len(rec.job_ids)})"
        print(f"{rec.run_id:40} {rec.state:14} {rec.executor:6} jobs={ids or '-'} ranks={rec.world_size}")
        if rec.state not in _QUIET and rec.error and rec.error.strip():
            print("    " + rec.error.strip().splitlines()[0])
        if rec.state not in _QUIET and rec.waits:
            for line in wait_lines(rec.waits):
                print(f"    {line}")
        if rec.warning:
            print(f"    warning: {rec.warning}")
        history, unreadable = History.shown(rec.run_dir)  # never blocks, never a traceback: one line
        if unreadable:
            print(f"    warning: {_one_line(unreadable)}")
        for line in describe(history):
            print(f"    {line}")
        if rec.state == State.RUNNING and rec.world_size > 1:  # a rank slower than the others (core.stragglers)
            from orchestrator.front.top import straggler_line

            straggler = straggler_line(rec.run_dir, rec.world_size)
            if straggler:
                print(f"    {straggler}")
        if len(history.attempts) > 1:  # where recoveries spent time: the run's goodput
            from orchestrator.core.attempt_times import goodput, with_live_marks

            attempts = with_live_marks(history.attempts, rec.run_dir, rec.world_size)  # the running one's too
            measured = goodput(attempts, rec.created, time.time())
            if measured is not None:
                print(f"    {measured.line()}")
        if rec.point_states:
            print_grid(rec, rec.point_states)
    return code


def print_grid(rec: RunRecord, points: dict[str, State]) -> None:
    """The sweep grid: counts by state, then each point's arguments and state."""
    print("    sweep: " + ", ".join(f"{n} {s}" for s, n in sorted(Counter(points.values()).items())))
    plan_path = RunFolder.of(rec.run_dir).plan
    try:
        data = read_file(plan_path, "the plan", "the sweep's points are not shown", RunNotFoundError)
        sweep = json.loads(data).get("sweep", []) if data is not None else []
        rows = [(int(p["index"]), " ".join(f"{k}={v}" for k, v in p["args"].items())) for p in sweep]
    except RunNotFoundError as exc:
        print(f"    ({exc})")
        return
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError, OverflowError):
        print(f"    ({shown(plan_path)} is damaged: the sweep's points are not shown)")
        return
    for index, args in rows:
        print(f"    {index:4d} {points.get(str(index), State.UNKNOWN):12} {args}")


def show_plan(launch: object, as_json: bool = False, node: int | None = None, rank: int | None = None) -> None:
    """``orchestrator plan``'s output on stdout: every rank as JSON, or the human view (one node
    or rank in full), with the identity lines (new run, or which run it resumes). One function for
    the CLI here and for the login node answering ``plan --remote``, so both print the same."""
    from orchestrator.plan import LaunchPlan

    assert isinstance(launch, LaunchPlan)
    if as_json:
        try:
            text = launch.model_dump_json(indent=2)
        except ValueError as exc:  # pydantic refuses text that is not UTF-8: a folder's name, from os.getcwd()
            if "surrogates not allowed" not in str(exc):
                raise
            text = json.dumps(launch.model_dump(mode="json"), indent=2)  # \udcXX escapes: the name's own bytes
        print(text)
        return
    from orchestrator.front.display import print_plan
    from orchestrator.spec.identity import plan_lines

    print_plan(launch, node=node, rank=rank, run_lines=plan_lines(launch))


def list_runs(as_json: bool = False) -> int:
    return status([], as_json=as_json)


def logs(ref: str, rank: int, follow: bool, point: int | None = None,
         start_timeout_s: float = FOLLOW_START_TIMEOUT_S, attempt: int | None = None) -> int:
    """A rank's log, or only attempt ``attempt``'s part of it (counted from 1, as status counts)."""
    run = Run.get(ref)
    if attempt is not None:
        api.check_attempt(attempt)
    path = run.log_path(rank, point)
    if not follow:
        data = _read_log(path, rank)
        if data is None:
            print(f"no log for rank {rank} yet at {shown(path)}", file=sys.stderr)
            return 1
        text = data.decode(errors="replace")
        sys.stdout.write(text if attempt is None else attempt_part(run.record, text, attempt, rank, point, path))
        sys.stdout.flush()
        return 0
    stream = _attempt_stream(run, path, rank, point, attempt) if attempt is not None else None
    return _follow(run, path, rank, point, start_timeout_s, stream)


def _attempt_stream(run: Run, path: Path, rank: int, point: int | None, attempt: int) -> AttemptStream:
    """``logs -f --attempt K``: only the latest attempt is still written to, so only it can be
    followed (the run's latest by recovery.json, else the latest the log holds, else 1)."""
    history = log_history(run.record, path, point)
    rules = marker_rules(history)  # which marker-like lines the supervisor or the launcher wrote
    if history is not None:
        latest = history.attempts[-1].number
    else:
        data = _read_log(path, rank)
        latest = attempts_in(data.decode(errors="replace"), rules)[-1] if data is not None else 1
    if attempt != latest:
        raise UsageError(f"--attempt {attempt} cannot be followed: only the latest attempt ({latest}) is still being "
                         f"written; print attempt {attempt} without -f/--follow, or follow attempt {latest} "
                         f"({command_line('orchestrator', 'logs', '-f', run.id, '--rank', rank, '--attempt', latest)})")
    return AttemptStream(attempt, rules)


def _read_log(path: Path, rank: int, offset: int = 0) -> bytes | None:
    """A rank's log from ``offset`` on; None while it does not exist. A log that is a folder, a
    FIFO or a device (never opened blocking), or a ``logs`` that is a file, is one error."""
    return read_file(path, f"rank {rank}'s log", "remove or rename it (the run's other files are untouched)",
                     RunNotFoundError, offset=offset)


def _reader_gone() -> bool:
    """Whoever read our stdout has gone (``logs -f RUN | head``): the CLI's stdout saw a broken
    pipe, or the pipe has no reader left (POLLERR), which shows before anything is written."""
    if getattr(sys.stdout, "reader_gone", False):
        return True
    try:
        import select

        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)  # only POLLERR / POLLHUP / POLLNVAL are reported
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, ValueError, OSError):  # not a real file (tests), or no poll
        return False


def _follow(run: Run, path: Path, rank: int, point: int | None, start_timeout_s: float,
            stream: AttemptStream | None = None) -> int:
    """Print the log (or, with ``stream``, one attempt's part of it) as it grows until the run
    ends (``Run.tail``); give up if it never starts, and stop when nobody reads any more."""
    started = api._now()
    seen = False
    for state, text in run.tail(rank, point):
        seen = seen or text is not None
        if stream is not None:
            text = stream.feed(text or "") + (stream.finish() if state.terminal else "")
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()
        if stream is not None and stream.done:
            later = stream.present[-1]
            follow = command_line("orchestrator", "logs", "-f", run.id, "--rank", rank, "--attempt", later)
            print(f"attempt {stream.attempt} of {run.id} has ended and attempt {later} started; follow it with: "
                  f"{follow}", file=sys.stderr)
            return 0
        if state.terminal:
            if not seen:
                print(f"{run.id} ended {state} without a log for rank {rank} at {shown(path)}", file=sys.stderr)
                return 1
            if stream is not None and not stream.found:
                print(f"{run.id} ended {state}, and rank {rank}'s log {shown(path)} holds no attempt {stream.attempt} "
                      f"(it holds {held(sorted(stream.present) or [1])})", file=sys.stderr)
                return 1
            return 0
        if _reader_gone():
            return 0
        if not seen and api._now() - started > start_timeout_s:
            print(f"{run.id} is {state} and rank {rank} has written nothing in {start_timeout_s:.0f}s; "
                  f"try again later, or check {quoted_command('orchestrator', 'status', run.id)}", file=sys.stderr)
            return 1
        api._sleep(0.3)  # a look at the log; the scheduler is asked only as the pacing allows (Run.tail)
    return 0


def cancel(ref: str) -> int:
    run = Run.get(ref)
    print(f"{run.id}: {run.cancel()}")
    return 0

