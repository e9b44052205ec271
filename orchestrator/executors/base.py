"""The interface every executor implements, and the run-folder set-up they share."""

from __future__ import annotations

import contextlib
import os
import sys
import shutil
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Protocol, Sequence

from orchestrator.core import ownership, procs
from orchestrator.backends import backend
from orchestrator.core.errors import OrchestratorError, SubmissionError
from orchestrator.plan import LaunchPlan
from orchestrator.executors.previous_attempt import PreviousAttempt
from orchestrator.core.run_folder import RunFolder
from orchestrator.core.records import RunRecord, register, write_json_atomic, write_text_atomic
from orchestrator.core.states import State

if TYPE_CHECKING:
    import subprocess

    from orchestrator.spec.models import JobSpec
    from orchestrator.core.rank_error import RankError


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


class SchedulerChaos(Protocol):
    """What ``orchestrator chaos`` asks of a scheduler (``ScheduledExecutor.chaos``): the run's
    job as the scheduler names it, a rank's node reached inside that job, a node taken down."""

    def job_id(self, recorded: str) -> str:
        """The id to reach the job by (UsageError when the scheduler names none)."""
        ...

    def signal(self, folder: Path, job: str, python: str, host: str, rank: int, name: str) -> str | None:
        """``orchestrator.node.chaos_node`` on ``host`` inside ``job``: None once sent, else why not."""
        ...

    def start(self, job: str, host: str, argv: Sequence[str]) -> subprocess.Popen:
        """``argv`` on ``host`` inside ``job``, in a session of its own, its output piped."""
        ...

    def jobs_on(self, node: str) -> list[str]:
        """The jobs on ``node`` now (UsageError when the scheduler does not answer)."""
        ...

    def set_down(self, node: str, reason: str) -> None:
        """Take ``node`` out of service (UsageError naming what it needs when refused)."""
        ...


class ScheduledExecutor(Executor, Protocol):
    """What a scheduled backend's executor (``Kind.scheduled``) answers beyond any executor's, so
    that the front asks it instead of importing a backend (``factory.scheduler``)."""

    def submit(self, launch: LaunchPlan, after: Sequence[tuple[str, Sequence[str]]] = ()) -> RunRecord:
        """Queue the run; ``after``: (when, job ids) it also waits for (a pipeline's edges)."""
        ...

    def queued(self, jobs: Sequence[str]) -> set[str]:
        """Which of ``jobs`` the scheduler still lists as pending, running, suspended or completing."""
        ...

    def array_limit(self) -> int:
        """The most tasks one array submission may hold on this cluster."""
        ...

    def check_against_cluster(self, spec: JobSpec) -> None:
        """Refuse (SubmissionError) a spec this cluster cannot run, naming the field."""
        ...

    def live_stacks(self, record: RunRecord, folder: Path, ranks: list[int] | None,
                    timeout: float) -> tuple[dict[int, str], str]:
        """Each live rank's fresh stack dump ('' for one that did not answer; all, or ``ranks``)
        and what the scheduler said when some did not answer."""
        ...

    def chaos(self) -> SchedulerChaos:
        """What ``orchestrator chaos`` asks of this scheduler."""
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
    from orchestrator.core.payload import Defaults, Payload, PayloadError

    try:
        return Payload.load(RunFolder.of(run_dir).payload).stop_grace_s
    except (OSError, PayloadError):
        return Defaults.STOP_GRACE_S


def refresh_by_supervisor(rec: RunRecord) -> RunRecord:
    """For runs supervised by a process of ours (local, debug): is the attempt still alive?

    Liveness comes from the run's lock (held by its supervisor for the whole attempt, dropped
    by the kernel however it dies) and, across hosts, from the lease it renews, never from a
    PID alone. A run whose lock is free and whose lease has run out has no supervisor: what is
    left of its ranks on this host is stopped, and the attempt is recorded FAILED (or, when even
    that cannot be written, a full disk, returned FAILED: never RUNNING). That holds even while the
    process that supervised it lives on (a notebook, a pipeline that ran it in the foreground): a
    supervisor that gave up released the lock. A copy of a run folder, or a run on another host
    whose lease is still fresh, is only read."""
    if rec.state.terminal:
        return rec
    folder = rec.run_dir
    if ownership.is_held(folder):
        return rec
    if ownership.copy_reason(rec.folder_id, folder):
        return rec  # a copy: never rewritten, and never a reason to act on the original
    if alive_elsewhere(folder):
        return rec  # its host says it is alive; only the lock is not shared with us
    if rec.host in (None, ownership.this_host()) and _unlocked_supervisor(folder, rec):
        return rec  # alive without the lock: only a run started by an older version
    latest = RunRecord.load(folder)  # the supervisor may have recorded its end meanwhile
    if latest.state.terminal or ownership.is_held(folder):
        return latest
    return end_orphaned(latest)


def _unlocked_supervisor(run_dir: str | Path, rec: RunRecord, had_lock: bool | None = None) -> bool:
    """The record's supervisor is alive and supervises without a lock: a run started by an older
    version, which made no lock file. Where this version took the lock (the file is there, or was
    before this caller took it: ``had_lock``), a free lock means the supervisor let the run go,
    alive or not."""
    if had_lock is None:
        had_lock = os.path.lexists(RunFolder.of(run_dir).lock)
    return not had_lock and procs.same_process(rec.supervisor_pid, rec.supervisor_start)


def alive_elsewhere(run_dir: str | Path) -> bool:
    """A fresh lease from another host: its supervisor lives, whatever our view of the lock."""
    held = ownership.lease(run_dir)
    return held is not None and held.fresh() and held.host != ownership.this_host()


def end_orphaned(rec: RunRecord) -> RunRecord:
    """Record the end of an attempt whose supervisor is gone, after stopping what is left of its
    ranks (on this host only: a rank elsewhere stops with its own supervisor's processes). Where
    the record cannot be written (a full or read-only disk) the FAILED record is returned all the
    same, saying so: every look then reaches the same verdict, until one can write it."""
    from orchestrator.core.records import disk_note, disk_trouble

    stopped = 0
    if ownership.foreign_reason(rec.host, rec.folder_id, rec.run_dir) is None:
        for pid, start in zip(rec.rank_pids, rec.rank_starts):
            stopped += procs.signal_session(pid, start, signal.SIGKILL)
    disk = disk_note(rec.run_dir)
    if rec.supervisor_pid:
        guess = f"{disk}: it could not write there?" if disk else "it gave the run up" if _alive(rec) else "killed?"
        why = (f"its supervisor (pid {rec.supervisor_pid} on {ownership.host_name(rec.host)}) ended without "
               f"recording an end state ({guess})")
    else:
        why = "the run never started (its starter ended before a supervisor took over)"
        why += f"; {disk}" if disk else ""
    if stopped:
        why += f"; {stopped} process(es) it left were stopped"
    try:
        return rec.update(state=State.FAILED, ended=time.time(), error=rec.error or why)
    except OSError as exc:
        trouble = disk_trouble(exc, rec.run_dir) or f"{exc.strerror or exc}"
        rec.error = f"{rec.error or why}\n(not recorded in {rec.path}: {trouble})"
        return rec


def _alive(rec: RunRecord) -> bool:
    return rec.host in (None, ownership.this_host()) and procs.same_process(rec.supervisor_pid, rec.supervisor_start)


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


#: An executor's ``refresh``: records as their scheduler states them now.
Refresh = Callable[[list[RunRecord]], list[RunRecord]]


def prepare_run_dir(launch: LaunchPlan, refresh: Refresh | None = None) -> tuple[RunRecord, ownership.RunLock]:
    """``prepare_attempt`` for an executor whose attempt has started once the folder is written
    (a local supervisor holds the lock for it): the previous attempt is forgotten at once."""
    record, lock, previous = prepare_attempt(launch, refresh)
    previous.drop()
    return record, lock


def prepare_attempt(launch: LaunchPlan, refresh: Refresh | None = None) \
        -> tuple[RunRecord, ownership.RunLock, PreviousAttempt]:
    """Take the run folder's lock, then create (or reuse, to resume) the folder and write what
    it will run. Returns the new record, the lock, which the caller holds for the attempt (a local
    supervisor) or releases once the scheduler has the job (SLURM), and the previous attempt, put
    aside: the caller drops it once the new attempt is the scheduler's, or restores it if the
    scheduler refuses the new one (``orchestrator.executors.previous_attempt``).

    Two starts of one spec never both get here: the second finds the lock taken and is refused,
    naming the live attempt. A folder whose previous attempt lost its supervisor (the lock is
    free but the record never ended) is taken over: the old attempt is recorded FAILED first.
    A SLURM run still queued or running is refused: its job, not a lock, is the live attempt.
    """
    from orchestrator.core.fs_checks import ElsewhereFix, checked_dir

    run_dir = Path(launch.run_dir)
    run = RunFolder(run_dir)
    record = RunRecord(run_id=launch.run_id, run_dir=str(run_dir), executor=launch.executor,
                       world_size=launch.world_size, sweep_size=len(launch.sweep), host=ownership.this_host())
    # Nothing is created before both the runs folder and the registry are known to be usable: a
    # bad one is one line, and leaves no half-made run behind.
    checked_dir(run_dir.parent, "runs_dir", ElsewhereFix("set runs_dir to a folder you can write"), SubmissionError,
                create=True)
    register(record)
    created = not os.path.lexists(run_dir)
    checked_dir(run_dir, "the run folder", "remove or rename whatever is there", SubmissionError, create=True)
    had_lock = os.path.lexists(run.lock)  # made by this version: a free lock means no live supervisor
    lock = ownership.take(run_dir)
    previous: list[PreviousAttempt] = []
    try:
        _start_attempt(launch, run_dir, run, record, had_lock, refresh, previous)
    except BaseException:
        for aside in previous:  # a start that failed half-way (a full disk) leaves the previous attempt as it was
            aside.restore()
        lock.release()
        if created and not os.path.lexists(run.record):  # a refused first start leaves no half-made run
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    lock.renew()
    return record, lock, previous[0]


def _start_attempt(launch: LaunchPlan, run_dir: Path, run: RunFolder, record: RunRecord, had_lock: bool,
                   refresh: Refresh | None, previous: list[PreviousAttempt]) -> None:
    attempts = 1
    if run.record.exists() or run.record.is_symlink():
        old = RunRecord.load(run_dir)
        scheduled = backend(old.executor).scheduled
        if not old.state.terminal and scheduled and refresh is not None:
            # As its scheduler states it now (``refresh``: the submitting executor's): the record says
            # what the last look saw (PENDING at submission), and a job that ended since, with nobody
            # asking, must not refuse the next submission of its spec. As recorded when it cannot be asked.
            with contextlib.suppress(OrchestratorError):
                old = refresh([old])[0]
        if not old.state.terminal:
            if scheduled:
                raise SubmissionError(
                    f"run {launch.run_id} is still {old.state} in {run_dir}; follow it with "
                    f"'orchestrator status {launch.run_id}' or stop it with 'orchestrator cancel {launch.run_id}'")
            if old.host in (None, ownership.this_host()) and _unlocked_supervisor(run_dir, old, had_lock):
                raise SubmissionError(f"run {launch.run_id} is still {old.state} under supervisor pid "
                                      f"{old.supervisor_pid} (started by an older version); stop it with "
                                      f"'orchestrator cancel {launch.run_id}'")
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
    # a rerun must never report an earlier attempt's outcome, nor look at its ranks (stacks, logs, joins)
    previous.append(PreviousAttempt.put_aside(run_dir, list(_point_dirs(run_dir))))
    write_text_atomic(run.spec, yaml.safe_dump(launch.spec.model_dump(mode="json"), sort_keys=False))
    write_json_atomic(run.plan, launch.model_dump(mode="json"))
    launch.payload.write(run.payload)
    if launch.code is not None:
        write_json_atomic(run.code, launch.code)
    else:
        run.code.unlink(missing_ok=True)
    record.attempts, record.folder_id = attempts, ownership.folder_id(run_dir)
    record.save()


def _store_code(launch: LaunchPlan) -> None:
    """Freeze the code the ranks will import (``orchestrator.code.snapshot.store``), before anything of
    the attempt is written: a store that fails leaves the run as it was."""
    if launch.snapshot is None:
        return
    from orchestrator.code.snapshot import store

    for warning in launch.snapshot.warnings:
        print(f"[orchestrator] code snapshot: {warning}", file=sys.stderr, flush=True)
    try:
        store(launch.snapshot)
    except OSError as exc:
        raise SubmissionError(f"cannot store the code snapshot in {launch.snapshot.store_dir}: {exc}; set runs_dir to "
                              "a folder you can write, or code.snapshot: false to run the live files") from None


def first_error(run_dir: str | Path) -> RankError | None:
    """The earliest exception recorded by a failing rank of the run or of any sweep point."""
    from orchestrator.core import rank_error

    return rank_error.earliest(path for folder in _point_dirs(Path(run_dir)) for path in folder.error_files())


def while_cancelled(error: str) -> str:
    """The error of a cancelled run's rank: a rank that fails as the cancel stops its peers (a
    connection its stopped peer closed) is a bystander, so the record says the cancel first."""
    return f"cancelled; while the ranks stopped, {error}"


def start_over(run_dir: str | Path, checkpoint_dir: str | Path | None = None) -> tuple[Path | None, Path | None]:
    """Move aside everything an earlier attempt left that a fresh run would find (``run --fresh``):
    the run folder, and the checkpoint folder when it is not inside the run folder (an explicit
    ``checkpoint.dir``: a sweep's points have theirs under it), each to <path>.<n>; nothing is
    deleted. Returns where each went (None: there was nothing to move).

    Everything is checked before anything moves: a folder that a run still active uses (its own
    attempt, or any registered run whose checkpoint folder is, holds or lies inside this one) is
    refused naming that run, as is a checkpoint folder that holds the run folder itself."""
    src = Path(run_dir)
    if os.path.lexists(src) and _active_state(src) is not None:
        raise SubmissionError(f"{src} belongs to a run that is still active; cancel it first")
    ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if ckpt is not None and (not os.path.lexists(ckpt) or _inside(ckpt, src)):
        ckpt = None  # nothing there, or it goes with the run folder
    if ckpt is not None:
        if _inside(src, ckpt):
            raise SubmissionError(f"checkpoint.dir {ckpt} holds the run folder {src}, so a fresh run cannot move its "
                                  "checkpoints aside: give checkpoint.dir a folder of its own (or leave it unset for "
                                  "<run folder>/checkpoints)")
        user = next(_active_users(ckpt, src), None)
        if user is not None:
            rec, state = user
            raise SubmissionError(f"checkpoint.dir {ckpt} is used by run {rec.run_id}, which is still active ({state}, "
                                  f"{rec.run_dir}); cancel it first (orchestrator cancel {rec.run_id}), or give this "
                                  "run a checkpoint.dir of its own")
    moved = rename_aside(src) if os.path.lexists(src) else None
    try:
        moved_ckpt = rename_aside(ckpt) if ckpt is not None else None
    except BaseException:
        if moved is not None:  # all or nothing: a fresh run never starts beside the old checkpoints
            moved.rename(src)
        raise
    return moved, moved_ckpt


def rename_aside(src: Path) -> Path:
    """Move ``src`` to the first free <src>.<n> (n from 1); returns where it went."""
    n = 1
    while os.path.lexists(dst := src.with_name(f"{src.name}.{n}")):
        n += 1
    src.rename(dst)
    return dst


def _inside(path: Path, folder: Path) -> bool:
    """``path`` is ``folder`` or lies under it (symbolic links followed)."""
    p, f = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    return p == f or f in p.parents


def _active_state(run_dir: Path) -> State | None:
    """The state of the run in this folder while it is still active (its lock is held, or its
    record has not ended), else None. A local run whose supervisor is gone is recorded FAILED
    first (``refresh_by_supervisor``): only a live attempt, or a SLURM job not ended, is active."""
    record = RunFolder(run_dir).record
    if not record.is_file():
        return State.RUNNING if ownership.is_held(run_dir) else None
    rec = RunRecord.load(run_dir)
    if not rec.state.terminal and not backend(rec.executor).scheduled:
        rec = refresh_by_supervisor(rec)
    if not rec.state.terminal:
        return rec.state
    return rec.state if ownership.is_held(run_dir) else None  # ending: its supervisor is still at work


def _active_users(ckpt: Path, own_run_dir: Path) -> Iterator[tuple[RunRecord, State]]:
    """The registered runs still active (other than ``own_run_dir``'s) whose checkpoint folder
    (from their payload) is, holds or lies inside ``ckpt``."""
    from orchestrator.core.payload import Payload, PayloadError
    from orchestrator.core.records import registered_runs

    for entry in registered_runs():
        folder = Path(entry["run_dir"])
        if _inside(folder, own_run_dir) and _inside(own_run_dir, folder):
            continue
        try:
            if not RunFolder(folder).record.is_file():
                continue
            rec = RunRecord.load(folder)
            if rec.state.terminal and not ownership.is_held(folder):
                continue
            used = Path(Payload.load(RunFolder(folder).payload).checkpoint.dir)
        except (OrchestratorError, PayloadError, OSError):
            continue
        if not (_inside(used, ckpt) or _inside(ckpt, used)):
            continue
        state = _active_state(folder)
        if state is not None:
            yield rec, state
