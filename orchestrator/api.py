"""The Python API: what the CLI does, from a notebook or a sweep script.

    from orchestrator import JobSpec, Run, load_spec, run, submit

    spec = JobSpec(name="digits", entrypoint="jobs.train:main", nodes=2, cpu_ranks_per_node=2)
    r = run(spec)                       # local, in the foreground; wait=False detaches
    r.state, r.result(), r.logs(rank=3)
    s = submit(load_spec("job.yaml", overrides=["nodes=4"]))   # SLURM
    s.wait(timeout=3600)
    Run.get("digits-1a2b3c4d")          # any run, by id, unique id prefix or folder

Nothing here imports torch. pydantic comes in with the first spec, submitit with the first
SLURM submission. Every error is an ``OrchestratorError`` (see errors.py) whose message names
the fix; the CLI prints the same messages.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence, cast

from orchestrator.backends import BACKENDS, backend
from orchestrator.core.errors import (JobFailedError, OrchestratorError, RunNotFinishedError, RunNotFoundError, UsageError,
                                 WaitTimeoutError)
from orchestrator.front.planning import SpecLike, array_limit, as_spec, load_spec, plan_for, planned, scan_code
from orchestrator.core.records import RunRecord, registered_runs, resolve_run
from orchestrator.front.run_files import attempt_part, check_attempt, live_folder, read_result
from orchestrator.core.run_folder import RunFolder
from orchestrator.core.states import State

if TYPE_CHECKING:
    import subprocess

    from orchestrator.core.attempt_logs import AttemptWatch
    from orchestrator.executors.base import Executor, ForegroundExecutor
    from orchestrator.executors.console import Follower
    from orchestrator.executors.scheduler_pacing import SchedulerPacing
    from orchestrator.plan import LaunchPlan

#: Defined in ``orchestrator.front.planning`` (specs in, plans out) and ``orchestrator.front.run_files``
#: (what a run left), and part of this module's API.
__all__ = ["SpecLike", "array_limit", "as_spec", "load_spec", "plan_for", "planned", "scan_code", "check_attempt",
           "run", "submit", "Run", "RunFacts", "StateWatch", "refresh", "registered", "POLL_S"]

#: How often ``Run.wait`` looks at the run. A look at a local run reads its folder (cheap). A look
#: at a SLURM run is a few ``stat`` calls on its folder; the scheduler itself is asked only when
#: ``executors.slurm.SchedulerPacing`` says so (at most once per 10 s, backing off to 60 s).
POLL_S = {name: b.poll_s for name, b in BACKENDS.items()}

#: The clock and the sleep of every waiting loop here (tests replace them with a fake clock).
_now = time.monotonic
_sleep = time.sleep


# ---- starting runs -------------------------------------------------------------------------
def run(spec: SpecLike, wait: bool = True, *, executor: str | None = None, fresh: bool = False,
        zygote: subprocess.Popen | None = None, on_moved: Callable[[Path], None] | None = None,
        on_plan: Callable[[LaunchPlan], None] | None = None) -> Run:
    """Run on this machine: ``nodes x ranks`` processes (``executor="local"``), or rank 0 alone
    in this process (``executor="debug"``, for pdb). Default: the spec's executor.

    ``wait=True`` runs in the foreground, echoing the ranks' output, and returns the ended run
    (its state may be FAILED: check ``.state``, or let ``.result()`` raise). ``wait=False``
    starts a detached supervisor and returns once it has recorded itself. The same spec always
    maps to the same run folder, so running it again resumes from its checkpoints;
    ``fresh=True`` moves that folder aside first (nothing is deleted), and calls
    ``on_moved(new_place)`` if there was one to move (the CLI prints it); a ``checkpoint.dir``
    outside the run folder is moved aside too (to ``<dir>.<n>``, said in one line on stderr), so
    the fresh run finds no checkpoint; either is refused while a run still active uses it.

    ``zygote``: a launcher started early with ``executors.forked.start_zygote()``, so torch
    imports while the spec is still being loaded (the CLI does this); optional. ``on_plan(plan)``
    is called once the plan is made, before anything starts (the CLI prints whether it resumes).
    """
    launch = planned(spec, executor, stage_for=("local",))[0]
    if on_plan is not None:
        on_plan(launch)
    if not backend(launch.executor).foreground:
        raise UsageError("'run' is for the local and debug executors: submit to SLURM with 'orchestrator submit' "
                         "(Python: submit(spec)), or pass --executor local (Python: executor='local') "
                         "for a local dry run")
    if launch.spec.after:  # a local run does not wait: the runs it names must have ended as asked
        from orchestrator.spec.after import check_local

        check_local(launch, lambda records: [r.record for r in refresh([Run(x) for x in records])])
    if fresh:  # nothing of an earlier attempt may be found: its folder, nor its checkpoints wherever they are
        from orchestrator.executors.base import start_over

        moved, moved_checkpoints = start_over(launch.run_dir, launch.payload.checkpoint.dir)
        if moved and on_moved is not None:
            on_moved(moved)
        if moved_checkpoints is not None:
            import sys

            print(f"[orchestrator] moved the previous checkpoints ({launch.payload.checkpoint.dir}, outside the run "
                  f"folder) to {moved_checkpoints}", file=sys.stderr, flush=True)
    chosen = _executor(launch.executor, zygote)  # local or debug (slurm was refused above): wait in the foreground
    return Run(cast("ForegroundExecutor", chosen).run(launch) if wait else chosen.submit(launch))


def submit(spec: SpecLike, *, executor: str = "slurm", on_plan: Callable[[LaunchPlan], None] | None = None) -> Run:
    """Submit to SLURM (one job, or one job array for a sweep) and return at once: the handle's
    state is PENDING. Follow it with ``.status()``, ``.wait(timeout=...)`` and ``.logs()``.
    The project's code is frozen first (``orchestrator.code.snapshot``): edits made after this call
    never reach the job, requeues included. ``on_plan`` as for ``run``."""
    backend(executor).preflight()  # a cluster that cannot take the job is said before the snapshot is stored
    launch = planned(spec, executor, stage_for=("slurm", "local"))[0]
    if on_plan is not None:
        on_plan(launch)
    return Run(_executor(launch.executor).submit(launch))


def _executor(name: str, zygote: subprocess.Popen | None = None) -> Executor:
    """The executor for ``name``; ``zygote`` (a launcher that imported torch early) serves a run
    whose ranks are processes started on this machine (the local executor's)."""
    from orchestrator.backends.factory import get_executor

    return get_executor(name, zygote)


# ---- runs ----------------------------------------------------------------------------------
class RunFacts:
    """What a run is, as its folder says (no scheduler query): ``Run``'s read side."""

    def __init__(self, record: RunRecord) -> None:
        self._record = record

    def __repr__(self) -> str:
        return f"Run({self.id!r}, state={self._record.state.value!r}, executor={self.executor!r}, run_dir='{self.run_dir}')"

    @property
    def id(self) -> str:
        return self._record.run_id

    @property
    def run_dir(self) -> Path:
        return Path(self._record.run_dir)

    @property
    def executor(self) -> str:
        return self._record.executor

    @property
    def job_ids(self) -> list[str]:
        return list(self.record.job_ids)

    @property
    def record(self) -> RunRecord:
        """The record as the run folder holds it now (no scheduler query)."""
        self._record = RunRecord.load(self._record.run_dir)
        return self._record

    @property
    def state(self) -> State:
        """The state last recorded in the run folder. A local run's supervisor keeps it
        current; a SLURM run's is refreshed by ``.status()`` and ``.wait()``."""
        return self.record.state

    @property
    def error(self) -> str | None:
        """The first failure (rank and traceback), once the run has failed."""
        return self.record.error


class Run(RunFacts):
    """A handle on one run: its folder, and for SLURM its job ids. It holds no process, so it
    can be dropped and found again with ``Run.get``. ``.state`` reads the run folder;
    ``.status()`` also asks the scheduler (one query)."""

    @classmethod
    def get(cls, ref: str | Path) -> Run:
        """A run by folder, id, or unique prefix of an id (as ``orchestrator status`` takes)."""
        return cls(RunRecord.load(resolve_run(str(ref))))

    # -- the scheduler ---------------------------------------------------------------------------
    def status(self) -> State:
        """Refresh from the scheduler (one query; none once the run has ended) and return the state."""
        refresh([self])
        return self._record.state

    def wait(self, timeout: float | None = None, *, follow: bool = False, attempts: bool = True) -> State:
        """Block until the run ends and return its state (COMPLETED, FAILED, CANCELLED...).

        With ``timeout`` (seconds, >= 0; None or ``math.inf``: no limit), raise WaitTimeoutError (a
        TimeoutError) when it runs out; the run goes on. ``follow=True`` prints rank 0's log as it
        grows, under the live progress line. ``attempts=True`` prints a line to stderr whenever an
        attempt starts or ends while it waits (``[orchestrator] attempt 1 ended: crash (...);
        restarting (recovery)``), and once when a SLURM job pends again after a requeue
        (``<run>/recovery.json``, read at most once a look; ``attempts=False``: quiet).
        """
        import numbers

        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
                raise UsageError(f"timeout is seconds (a number) or None for no limit, not {type(timeout).__name__}: "
                                 "e.g. .wait(timeout=600)")
            timeout = float(timeout)
            if not timeout >= 0:  # NaN too
                raise UsageError(f"timeout is {timeout}; give seconds >= 0 (e.g. .wait(timeout=600)), or None or "
                                 "math.inf to wait without a limit")
        deadline = _now() + (float("inf") if timeout is None else timeout)
        poll = POLL_S.get(self.executor, 1.0)
        follower = None
        if follow:
            from orchestrator.executors.console import Follower

            follower = Follower(max(1, self.record.world_size))
        watch = None
        if attempts:
            from orchestrator.core.attempt_logs import AttemptWatch

            watch = AttemptWatch(slurm=backend(self.executor).scheduled)
        try:
            return self._wait(deadline, timeout, poll, follower, watch)
        finally:
            if follower is not None:
                follower.close()

    def _wait(self, deadline: float, timeout: float | None, poll: float, follower: Follower | None,
              watch: AttemptWatch | None = None) -> State:
        states = StateWatch(self)
        looks = self._tail(0, None, states) if follower is not None else None
        while True:
            live = None
            if looks is not None and follower is not None:
                state, text = next(looks)
                if text:
                    follower.write(text)
                live = live_folder(self._record)
                follower.progress(live)
            else:
                state = states.look()
            if watch is not None:  # "pending again" only from the scheduler's own answer, never a stale state
                self._say_attempts(watch, state, live, fresh=states.asked)
            if state.terminal or (state == State.UNKNOWN and states.asked and _forgotten(self._record)):
                return state
            left = deadline - _now()
            if left <= 0:
                raise WaitTimeoutError(f"{self.id} is still {state} after {timeout:g}s; it goes on: wait again, or "
                                       f"stop it with .cancel() (CLI: orchestrator cancel {self.id})")
            _sleep(min(poll, left))

    def _say_attempts(self, watch: AttemptWatch, state: State, live: Path | None, fresh: bool = True) -> None:
        """One look at recovery.json (the run's, or the live sweep point's): print what changed."""
        import sys

        rec = self._record
        folder = live if live is not None else live_folder(rec)
        where = f"point {int(folder.name)}: " if rec.sweep_size and folder.name.isdigit() else ""
        for line in watch.look(folder, state == State.PENDING and fresh, list(rec.job_ids)):
            try:
                print(f"[orchestrator] {where}{line}", file=sys.stderr, flush=True)
            except (OSError, ValueError):  # stderr closed or gone: the history keeps it
                return

    def cancel(self) -> State:
        """Stop the run (local ranks checkpoint together first) and return the state it ended in."""
        return _executor(self.executor).cancel(self.record).state

    # -- what it left ------------------------------------------------------------------------------
    def result(self) -> Any:
        """What rank 0's entrypoint returned (``<run>/result.json``); for a sweep, a list with one
        result per point. Raises RunNotFinishedError while the run is going, JobFailedError if it
        ended any other way than COMPLETED."""
        state = self.status()
        if not state.terminal:
            raise RunNotFinishedError(f"{self.id} is still {state}: call .wait() first")
        if state != State.COMPLETED:
            rec = self._record
            why = (rec.error or "no error was recorded").strip().splitlines()[0]
            rank = rec.failed_rank if rec.failed_rank is not None else 0
            raise JobFailedError(f"{self.id} ended {state}, so it has no result: {why}; "
                                 f"see .logs(rank={rank}) (CLI: orchestrator logs {self.id} --rank {rank})")
        if self._record.sweep_size:
            from orchestrator.core.records import point_dir

            return [read_result(point_dir(self.run_dir, i)) for i in range(self._record.sweep_size)]
        return read_result(self.run_dir)

    def log_path(self, rank: int = 0, point: int | None = None) -> Path:
        """Where a rank's log is (or will be): the latest sweep point's, unless ``point`` is given."""
        rec = self.record
        _check_rank(rec, rank)
        if point is not None and not 0 <= point < max(1, rec.sweep_size):
            raise RunNotFoundError(f"point {point} is not in {rec.run_id}"
                                   + (f" (points 0-{rec.sweep_size - 1})" if rec.sweep_size else " (it is not a sweep)"))
        return _executor(rec.executor).log_path(rec, rank, point)

    def tail(self, rank: int = 0, point: int | None = None) -> Iterator[tuple[State, str | None]]:
        """Follow a rank's log, one look per ``next()``: the run's state, then what the log gained
        since the last look ("" when nothing; None while the log does not exist). The last item is
        the run's end state with the log's rest, since the log is read after the state. The caller
        paces the looks (``wait(follow=True)`` and ``orchestrator logs -f``); a SLURM job's state
        comes from its run folder, and the scheduler is asked only as ``executors.slurm.SchedulerPacing`` allows
        (``StateWatch``), however often the caller looks."""
        return self._tail(rank, point, StateWatch(self))

    def _tail(self, rank: int, point: int | None, states: StateWatch) -> Iterator[tuple[State, str | None]]:
        from orchestrator.core.fs_checks import read_file

        path = self.log_path(rank, point)
        offset = 0
        while True:
            state = states.look()
            chunk = read_file(path, f"rank {rank}'s log", "remove or rename it (the run's other files are untouched)",
                              RunNotFoundError, offset=offset)
            if chunk is not None:
                offset += len(chunk)
            yield state, None if chunk is None else chunk.decode(errors="replace")
            if state.terminal:
                return

    def logs(self, rank: int = 0, point: int | None = None, attempt: int | None = None) -> str:
        """The text of a rank's log so far: every attempt, or only attempt ``attempt`` (counted
        from 1, as status counts them). Raises RunNotFoundError if that rank has written nothing
        yet, or (an AttemptNotFoundError) if its log does not hold that attempt, naming those it holds."""
        from orchestrator.core.fs_checks import read_file

        if attempt is not None:
            check_attempt(attempt)
        path = self.log_path(rank, point)
        data = read_file(path, f"rank {rank}'s log", "remove or rename it", RunNotFoundError)
        if data is None:
            raise RunNotFoundError(f"no log for rank {rank} yet at {path} ({self.id} is {self._record.state})")
        text = data.decode(errors="replace")
        return text if attempt is None else attempt_part(self._record, text, attempt, rank, point, path)

    def stacks(self, rank: int | None = None, timeout: float = 5.0, native: bool = False) -> str:
        """The Python stack of every thread of every live rank (or of ``rank``), as the ranks are
        now; they keep running. Each rank dumps its own stacks on a signal (faulthandler, set up
        by the launcher), which works while it is blocked inside a C++ collective; on SLURM the
        request reaches every node through ``srun --overlap``. A run that has ended shows the
        stacks saved at its end, if any. ``native=True`` (local runs) asks py-spy instead, for the
        C/C++ frames too; it needs ptrace permission. (``orchestrator.front.run_stacks`` does the work.)"""
        from orchestrator.front import run_stacks

        if native:
            spy = run_stacks.py_spy(self.executor)
            return run_stacks.native_text(self.id, spy, live_folder(self.record), rank)
        self.status()
        _check_rank(self._record, rank)
        if self._record.state.terminal:
            return run_stacks.saved_text(self._record, rank)
        return run_stacks.live_text(self._record, live_folder(self._record), rank, timeout)

    def report(self) -> str:
        """Write ``<run>/report/`` (PNG plots of loss, accuracy and throughput) and return the
        text summary. Needs matplotlib, and metrics from the rank API."""
        from orchestrator.front.report import write_report

        return write_report(str(self.run_dir))


def _check_rank(record: RunRecord, rank: int | None) -> None:
    world = max(1, record.world_size)
    if rank is not None and not 0 <= rank < world:
        raise RunNotFoundError(f"rank {rank} is not in {record.run_id} (ranks 0-{world - 1})")


def _forgotten(record: RunRecord) -> bool:
    """The scheduler no longer knows the job and nothing on record tells how it ended (a cluster
    without accounting, an agent that could not write its end): no later look can change that, so
    a wait ends with UNKNOWN and the record's reason instead of waiting forever."""
    from orchestrator.executors.scheduler_pacing import FORGOTTEN

    return FORGOTTEN in (record.error or "")


class StateWatch:
    """A waiting client's view of a run's state, one ``look()`` at a time (``Run.wait``,
    ``Run.tail``, so ``submit --wait``, ``--follow`` and ``logs -f``). A local run's look reads
    its folder (``Run.status``). A SLURM run's look is a few ``stat`` calls on its folder: the
    scheduler is asked only when ``executors.slurm.SchedulerPacing`` says so, and early when the folder shows
    news: the job's agent rewrites ``recovery.json`` as an attempt starts and ends and writes
    ``end.json`` with its verdict (of the run, or of up to WATCHED_POINTS sweep points); a
    ``record.json`` that another client wrote with an end state is taken as it is, unasked."""

    def __init__(self, run: Run, pacing: SchedulerPacing | None = None) -> None:
        self.run = run
        self.pacing: SchedulerPacing | None = None
        if backend(run.executor).scheduled:
            from orchestrator.executors.scheduler_pacing import SchedulerPacing

            self.pacing = pacing or SchedulerPacing()
        self.seen: tuple | None = None
        self.asked = False  # whether the last look's state is the scheduler's answer (a local run's: always)

    def look(self) -> State:
        self.asked = True
        if self.pacing is None:
            return self.run.status()
        now = _now()
        seen = self._signature()
        if self.seen is not None and seen != self.seen:
            if seen[0] != self.seen[0]:  # record.json: another client refreshed the run (or cancelled it)
                ended = self._ended_record()
                if ended is not None:
                    self.seen = seen
                    return ended
            if seen[1:] != self.seen[1:]:  # the agent's files; never another client's record (no ping-pong)
                self.pacing.folder_changed(now)
        self.seen = seen
        if not self.pacing.due(now):
            self.asked = False
            return self.run._record.state
        state = self.run.status()
        self.pacing.answered(_now(), state)
        self.seen = self._signature()  # our own write of record.json is no news
        return state

    def _ended_record(self) -> State | None:
        try:
            rec = RunRecord.load(self.run._record.run_dir)
        except (OrchestratorError, OSError):
            return None
        if not rec.state.terminal:
            return None  # ours may be newer (a user who cannot write the record keeps it in memory)
        self.run._record = rec
        return rec.state

    def _signature(self) -> tuple:
        from orchestrator.executors.scheduler_pacing import file_stat, folder_news

        rec = self.run._record
        return (file_stat(RunFolder.of(rec.run_dir).record), *folder_news(rec))


# ---- many runs ---------------------------------------------------------------------------------
def refresh(runs: Sequence[Run]) -> list[Run]:
    """Refresh every run from its scheduler, asking each executor once for all of its runs (so
    SLURM status over any number of jobs is one or two scheduler calls, not one per job)."""
    for r, rec in zip(runs, refresh_records([r.record for r in runs])):
        r._record = rec
    return list(runs)


def refresh_records(records: Sequence[RunRecord],
                    on_unreachable: Callable[[str, OrchestratorError], None] | None = None) -> list[RunRecord]:
    """``refresh`` for records just read from their folders (read again by nobody: status over a
    thousand runs reads each record once), in their order. ``on_unreachable``: an executor whose
    scheduler cannot be asked (no SLURM cluster from this laptop) is handed to it with the error,
    and its runs are returned as last recorded; without it, the error is raised."""
    by_executor: dict[str, list[RunRecord]] = defaultdict(list)
    for rec in records:
        by_executor[rec.executor].append(rec)
    fresh: dict[str, RunRecord] = {}
    for name, group in by_executor.items():
        try:
            refreshed = _executor(name).refresh(group)
        except OrchestratorError as exc:
            if on_unreachable is None:
                raise
            on_unreachable(name, exc)
            refreshed = group
        fresh.update((rec.run_dir, rec) for rec in refreshed)
    return [fresh[rec.run_dir] for rec in records]


def registered(on_damaged: Callable[[str, OrchestratorError | OSError], None] | None = None) -> list[Run]:
    """Every registered run whose folder still holds a record, oldest first (not refreshed).
    A damaged record is skipped and handed to ``on_damaged(run_id, error)`` (default: ignored),
    so one bad folder never hides the others."""
    found = []
    for entry in registered_runs():
        folder = Path(entry["run_dir"])
        try:
            if RunFolder(folder).record.exists() or RunFolder(folder).record.is_symlink():
                found.append(Run(RunRecord.load(folder)))
        except (OrchestratorError, OSError) as exc:
            if on_damaged is not None:
                on_damaged(entry["run_id"], exc)
    return found
