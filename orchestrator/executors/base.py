"""The interface every executor implements, and the run-folder set-up they share."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Iterator, Protocol

from orchestrator import ownership, procs
from orchestrator.errors import SubmissionError
from orchestrator.plan import LaunchPlan
from orchestrator.run_folder import RunFolder
from orchestrator.records import RunRecord, register, write_json_atomic, write_text_atomic
from orchestrator.states import State


class Executor(Protocol):
    """What every executor does. Waiting for a run is no executor's business: ``api.Run.wait``
    polls ``refresh``, whatever the executor."""

    def submit(self, launch: LaunchPlan) -> RunRecord:
        """Start the run and return its record once it is under way (queued by the scheduler, or
        its detached supervisor has recorded itself; the debug executor, which has no supervisor
        to detach, runs it to its end first)."""
        ...

    def refresh(self, records: list[RunRecord]) -> list[RunRecord]:
        """The records brought up to date, all of them in one look (one scheduler query)."""
        ...

    def cancel(self, record: RunRecord) -> RunRecord:
        """Stop the run; return its record once it has ended."""
        ...

    def log_path(self, record: RunRecord, rank: int, point: int | None = None) -> Path:
        """Where a rank's log is (or will be)."""
        ...


class ForegroundExecutor(Executor, Protocol):
    """An executor that can also run in this process's foreground (local, debug; not slurm)."""

    def run(self, launch: LaunchPlan) -> RunRecord:
        """Run to the end, echoing the ranks' output; return the ended record."""
        ...


#: A cancel waits for the ranks' stop_grace_s plus this (the supervisor's or agent's next look,
#: SIGKILL, the clean-up of what the ranks left).
CANCEL_SLACK_S = 30.0


def stop_grace_s(run_dir: str | Path) -> float:
    """The run's stop_grace_s, from its payload (the spec's default when it cannot be read: a
    run planned by another version, or one whose folder is damaged)."""
    from orchestrator.payload import Defaults, Payload, PayloadError

    try:
        return Payload.load(RunFolder.of(run_dir).payload).stop_grace_s
    except (OSError, PayloadError):
        return Defaults.STOP_GRACE_S


def refresh_by_supervisor(rec: RunRecord) -> RunRecord:
    """For runs supervised by a process of ours (local, debug): is the attempt still alive?

    Liveness comes from the run's lock (held by its supervisor for the whole attempt, dropped
    by the kernel however it dies) and, across hosts, from the lease it renews, never from a
    PID alone. A run whose lock is free and whose lease has run out has no supervisor: what is
    left of its ranks on this host is stopped, and the attempt is recorded FAILED. A copy of a
    run folder, or a run on another host whose lease is still fresh, is only read."""
    if rec.state.terminal:
        return rec
    folder = rec.run_dir
    if ownership.is_held(folder):
        return rec
    if ownership.copy_reason(rec.folder_id, folder):
        return rec  # a copy: never rewritten, and never a reason to act on the original
    if alive_elsewhere(folder):
        return rec  # its host says it is alive; only the lock is not shared with us
    if rec.host in (None, ownership.this_host()) and procs.same_process(rec.supervisor_pid, rec.supervisor_start):
        return rec  # alive without the lock: only a run started by an older version
    latest = RunRecord.load(folder)  # the supervisor may have recorded its end meanwhile
    if latest.state.terminal or ownership.is_held(folder):
        return latest
    return end_orphaned(latest)


def alive_elsewhere(run_dir: str | Path) -> bool:
    """A fresh lease from another host: its supervisor lives, whatever our view of the lock."""
    held = ownership.lease(run_dir)
    return held is not None and held.fresh() and held.host != ownership.this_host()


def end_orphaned(rec: RunRecord) -> RunRecord:
    """Record the end of an attempt whose supervisor is gone, after stopping what is left of its
    ranks (on this host only: a rank elsewhere stops with its own supervisor's processes)."""
    stopped = 0
    if ownership.foreign_reason(rec.host, rec.folder_id, rec.run_dir) is None:
        for pid, start in zip(rec.rank_pids, rec.rank_starts):
            stopped += procs.signal_session(pid, start, signal.SIGKILL)
    if rec.supervisor_pid:
        why = (f"its supervisor (pid {rec.supervisor_pid} on {ownership.host_name(rec.host)}) ended without "
               "recording an end state (killed?)")
    else:
        why = "the run never started (its starter ended before a supervisor took over)"
    if stopped:
        why += f"; {stopped} process(es) it left were stopped"
    return rec.update(state=State.FAILED, ended=time.time(), error=rec.error or why)


def _point_dirs(run_dir: Path) -> Iterator[RunFolder]:
    run = RunFolder(run_dir)
    yield run
    points = run.points
    if points.is_dir():
        yield from (RunFolder(p) for p in sorted(points.iterdir()) if p.is_dir())


def current_point(record: RunRecord) -> int:
    """The sweep point the current attempt reached: the latest one whose ranks have recorded
    themselves in this attempt (an attempt forgets every point's rank records before it starts),
    else the latest one with a log, else 0."""
    run = RunFolder.of(record.run_dir)
    for marker in (lambda i: run.point(i).ranks, lambda i: run.point(i).log(0)):
        for index in reversed(range(record.sweep_size)):
            if marker(index).exists():
                return index
    return 0


def rank_log_path(record: RunRecord, rank: int, point: int | None = None) -> Path:
    """``<run>/logs/rank-N.log``; in a sweep, that of the point asked for, else of the point the
    current attempt reached (``current_point``)."""
    run = RunFolder.of(record.run_dir)
    if not record.sweep_size:
        return run.log(rank)
    return run.point(current_point(record) if point is None else point).log(rank)


def prepare_run_dir(launch: LaunchPlan) -> tuple[RunRecord, ownership.RunLock]:
    """Take the run folder's lock, then create (or reuse, to resume) the folder and write what
    it will run. Returns the new record and the lock, which the caller holds for the attempt
    (a local supervisor) or releases once the scheduler has the job (SLURM).

    Two starts of one spec never both get here: the second finds the lock taken and is refused,
    naming the live attempt. A folder whose previous attempt lost its supervisor (the lock is
    free but the record never ended) is taken over: the old attempt is recorded FAILED first.
    A SLURM run still queued or running is refused: its job, not a lock, is the live attempt.
    """
    from orchestrator.fs_checks import checked_dir

    run_dir = Path(launch.run_dir)
    run = RunFolder(run_dir)
    record = RunRecord(run_id=launch.run_id, run_dir=str(run_dir), executor=launch.executor,
                       world_size=launch.world_size, sweep_size=len(launch.sweep), host=ownership.this_host())
    # Nothing is created before both the runs folder and the registry are known to be usable: a
    # bad one is one line, and leaves no half-made run behind.
    checked_dir(run_dir.parent, "runs_dir", "set runs_dir to a folder you can write", SubmissionError, create=True)
    register(record)
    checked_dir(run_dir, "the run folder", "remove or rename whatever is there", SubmissionError, create=True)
    lock = ownership.take(run_dir)
    try:
        _start_attempt(launch, run_dir, run, record)
    except BaseException:
        lock.release()
        raise
    lock.renew()
    return record, lock


def _start_attempt(launch: LaunchPlan, run_dir: Path, run: RunFolder, record: RunRecord) -> None:
    attempts = 1
    if run.record.exists() or run.record.is_symlink():
        old = RunRecord.load(run_dir)
        if not old.state.terminal and old.executor == "slurm":
            raise SubmissionError(
                f"run {launch.run_id} is still {old.state} in {run_dir}; follow it with "
                f"'orchestrator status {launch.run_id}' or stop it with 'orchestrator cancel {launch.run_id}'"
            )
        if not old.state.terminal and old.host in (None, ownership.this_host()) and \
                procs.same_process(old.supervisor_pid, old.supervisor_start):
            raise SubmissionError(f"run {launch.run_id} is still {old.state} under supervisor pid {old.supervisor_pid} "
                                  f"(started by an older version); stop it with 'orchestrator cancel {launch.run_id}'")
        if not old.state.terminal:
            held = ownership.lease(run_dir)
            if old.host not in (None, ownership.this_host()) and held is not None and held.fresh():
                raise SubmissionError(
                    f"run {launch.run_id} was last supervised on host {ownership.host_name(old.host)} and its "
                    f"lease is {time.time() - held.time:.0f}s old; try again in "
                    f"{ownership.LEASE_TTL_S:.0f}s, or see 'orchestrator status {launch.run_id}' there")
            end_orphaned(old)
        attempts = old.attempts + 1
    import yaml

    _store_code(launch)
    ownership.forget_requests(run_dir)
    write_text_atomic(run.spec, yaml.safe_dump(launch.spec, sort_keys=False))
    write_json_atomic(run.plan, launch.model_dump(mode="json"))
    write_json_atomic(run.payload, launch.payload.to_dict())
    if launch.code is not None:
        write_json_atomic(run.code, launch.code)
    else:
        run.code.unlink(missing_ok=True)
    for folder in _point_dirs(run_dir):  # a rerun must never report an earlier attempt's outcome
        folder.forget_attempt()  # nor look at an earlier attempt's ranks (stacks, logs, joins)
        folder.result.unlink(missing_ok=True)
        for err in folder.error_files():
            err.unlink()
    record.attempts, record.folder_id = attempts, ownership.folder_id(run_dir)
    record.save()


def _store_code(launch: LaunchPlan) -> None:
    """Freeze the code the ranks will import (``orchestrator.snapshot.store``), before anything of
    the attempt is written: a store that fails leaves the run as it was."""
    if launch.snapshot is None:
        return
    from orchestrator.snapshot import store

    try:
        store(launch.snapshot)
    except OSError as exc:
        raise SubmissionError(f"cannot store the code snapshot in {launch.snapshot.store_dir}: {exc}; set runs_dir to "
                              "a folder you can write, or code.snapshot: false to run the live files") from None


def first_error(run_dir: str | Path) -> dict | None:
    """The earliest traceback written by a failing rank of the run or of any sweep point."""
    errors = []
    for folder in _point_dirs(Path(run_dir)):
        for path in folder.error_files():
            try:
                err = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                continue
            if isinstance(err, dict) and isinstance(err.get("rank"), int):
                errors.append(err)
    return min(errors, key=lambda e: e.get("time", 0) if isinstance(e.get("time"), (int, float)) else 0) if errors else None


def move_aside(run_dir: str | Path) -> Path | None:
    """Rename an existing, finished run folder to <run_dir>.<n> so a fresh run can start."""
    src = Path(run_dir)
    if not src.exists():
        return None
    if ownership.is_held(src) or (RunFolder(src).record.is_file() and not RunRecord.load(src).state.terminal):
        raise SubmissionError(f"{src} belongs to a run that is still active; cancel it first")
    n = 1
    while (dst := src.with_name(f"{src.name}.{n}")).exists():
        n += 1
    src.rename(dst)
    return dst
