"""Which run ``orchestrator chaos RUN`` breaks, and what it reads of it before it breaks anything.

- The target: a run, or one point of a sweep. A sweep's points are run folders of their own
  (``<run>/points/NNNN``: their ranks, their payload, their ``recovery.json``), so a point is
  named as its folder, by path or by run id: ``RUN/points/3``. The sweep itself is refused with
  the points that run now, since breaking "the sweep" would break whichever point runs.
- The files chaos decides on (the payload, the recovery history), read with one line for a file
  this user may not read or a damaged one: nothing has been broken yet, so a traceback there
  would only hide what to do.
- On SLURM, the numeric job id every srun, scancel and scontrol of chaos takes. A sweep's point
  is an array task, recorded as ``A_T`` (``record.json``'s ``job_ids``, ``recovery.json``'s
  ``Attempt.job``); SLURM 22.05's ``srun --jobid=A_T`` refuses it ("Invalid numeric value"), and
  no file of the run holds the task's own SLURM_JOB_ID, so the controller is asked
  (``scontrol show job A_T``'s JobId, else ``squeue -h -o %A -j A_T``).
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from orchestrator.backends import backend
from orchestrator.core import fs_checks
from orchestrator.core.errors import UsageError
from orchestrator.core.payload import Payload, PayloadError
from orchestrator.core.records import RunRecord, resolve_run
from orchestrator.core.recovery import HISTORY_FILE, History
from orchestrator.core.run_folder import RunFolder
from orchestrator.core.states import State

#: ``RUN/points/N``: one point of a sweep (RUN a run id or folder; N with or without leading zeros).
POINT_REF = re.compile(r"^(?P<run>.*[^/])/+points/+(?P<index>\d{1,9})/*$")
#: The most of a run file chaos reads (a payload is a few kB; a damaged file may be anything).
MAX_READ = 64 << 20

Refresh = Callable[[Sequence[RunRecord]], list]


@dataclass(frozen=True)
class Target:
    """The run (or sweep point) chaos breaks, as the scheduler states it now."""

    record: RunRecord  # the run's record; a sweep's covers every point
    folder: Path  # where its ranks record themselves: the run folder, or the point's
    point: Optional[int] = None

    @property
    def name(self) -> str:
        return self.record.run_id if self.point is None else f"{self.record.run_id} point {self.point}"

    @property
    def scheduled(self) -> bool:
        """Its ranks run on a scheduler's nodes (reached through it), not on this machine."""
        return backend(self.record.executor).scheduled

    @property
    def state(self) -> State:
        """The point's own state in a sweep (each point is a job of its own on SLURM; locally they
        run one after the other), else the run's."""
        return self.record.state if self.point is None else point_state(self.record, self.point)

    @property
    def payload_path(self) -> Path:
        """The payload the ranks run: a local point's is written when the point starts."""
        folder = RunFolder(self.folder)
        return folder.point_payload if self.point is not None and not self.scheduled else folder.payload

    @property
    def job(self) -> str:
        """The SLURM job as recorded ('A_T' for a sweep's array task); '' when there is none yet."""
        ids = self.record.job_ids
        if self.point is None:
            return ids[-1] if ids else ""
        return ids[self.point] if self.point < len(ids) else ""


def split_point(ref: str) -> tuple[str, Optional[int]]:
    """``RUN/points/N`` as (RUN, N); any other reference as (it, None)."""
    found = POINT_REF.match(ref)
    return (found["run"], int(found["index"])) if found else (ref, None)


def point_state(record: RunRecord, index: int) -> State:
    """One sweep point's state. SLURM: the scheduler's for its array task (``point_states``, set
    once the sweep has several points), else the run's. Locally the points run in order: those
    before the current one completed, those after it have not started."""
    if backend(record.executor).scheduled:
        return State.parse(record.point_states.get(str(index), record.state))
    if record.state != State.RUNNING:
        return record.state
    from orchestrator.executors.base import current_point

    now = current_point(record)
    return State.RUNNING if index == now else (State.COMPLETED if index < now else State.PENDING)


def running_points(record: RunRecord) -> list[int]:
    """The sweep's points that run now."""
    return [i for i in range(record.sweep_size) if point_state(record, i) == State.RUNNING]


def sweep_refusal(record: RunRecord, flag: str) -> str:
    """Why chaos does not break a sweep as a whole, and which point to name instead."""
    running = running_points(record)
    example = running[0] if running else 0
    now = (f"point(s) {', '.join(str(i) for i in running)} run now" if running
           else f"no point runs now ({record.state})")
    return (f"{record.run_id} is a sweep of {record.sweep_size} points, each a run of its own, and chaos breaks one: "
            f"name the point, e.g. 'orchestrator chaos {record.run_id}/points/{example:04d} {flag}' ({now})")


def find_target(ref: str, refresh: Refresh, flag: str) -> Target:
    """The run or sweep point ``ref`` names, its record refreshed. UsageError for a sweep named as
    a whole (``flag``: the injection, for the example), a point of a run that is no sweep, or one
    it does not have."""
    run_ref, point = split_point(ref)
    record = refresh([RunRecord.load(resolve_run(run_ref))])[0]
    if point is None:
        if record.sweep_size:
            raise UsageError(f"chaos refused: {sweep_refusal(record, flag)}")
        return Target(record, Path(record.run_dir))
    if not record.sweep_size:
        raise UsageError(f"chaos refused: {record.run_id} is not a sweep (it has no points): name the run itself, "
                         f"'orchestrator chaos {record.run_id} {flag}'")
    if not 0 <= point < record.sweep_size:
        raise UsageError(f"chaos refused: {record.run_id} has points 0-{record.sweep_size - 1}, not {point}")
    return Target(record, RunFolder.of(record.run_dir).point(point).root, point)


# ---- the run's files, read with one clear line -------------------------------------------------
def _refused(text: str) -> UsageError:
    return UsageError(f"chaos refused: {text}; nothing was broken")


def read_json(path: Path, what: str, fix: str) -> Optional[Any]:
    """The JSON of one run file; None when it does not exist. A file this user may not read, one
    that is not a regular file (never opened blocking) or not JSON raises UsageError naming it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if fs_checks.is_denied(exc):
            raise _refused(f"no permission to read {what} {fs_checks.shown(path)} "
                           f"({fs_checks.no_permission(path, 'read', exc)[1]})") from None
        raise _refused(f"{what} {fs_checks.shown(path)} cannot be opened ({fs_checks.errno_text(exc)})") from None
    try:
        with os.fdopen(fd, "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise _refused(f"{what} {fs_checks.shown(path)} is damaged (it is {fs_checks.kind(mode)}, not a "
                               f"regular file): {fix}")
            data = fh.read(MAX_READ)
    except OSError as exc:
        if fs_checks.is_denied(exc):
            raise _refused(f"no permission to read {what} {fs_checks.shown(path)}") from None
        raise _refused(f"{what} {fs_checks.shown(path)} cannot be read ({fs_checks.errno_text(exc)})") from None
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _refused(f"{what} {fs_checks.shown(path)} is damaged (not JSON: {fs_checks.shown(str(exc))}): "
                       f"{fix}") from None


def read_payload(target: Target) -> Payload:
    """The payload the target's ranks run (their number, recovery, watchdog, interpreter)."""
    path = target.payload_path
    fix = "chaos cannot tell what the run's recovery would do; inspect it, or submit the spec again"
    data = read_json(path, "the job payload", fix)
    if data is None:
        raise _refused(f"{target.name} has no job payload ({fs_checks.shown(path)}): it has not started yet, or its "
                       "folder is incomplete")
    try:
        return Payload.from_dict(data, where=f"the job payload {fs_checks.shown(path)}")
    except PayloadError as exc:
        raise _refused(str(exc)) from None


def read_history(target: Target) -> History:
    """The target's ``recovery.json``: the restarts used so far (none yet: an empty history)."""
    path = target.folder / HISTORY_FILE
    data = read_json(path, "the run's recovery history", "chaos cannot tell how many restarts the run has left; "
                                                           "let it go on, or inspect the file")
    damaged = _refused(f"the run's recovery history {fs_checks.shown(path)} is damaged (not a record of attempts): "
                       "chaos cannot tell how many restarts the run has left")
    if data is not None and not (isinstance(data, dict) and isinstance(data.get("attempts", []), list)):
        raise damaged
    history = History.load(target.folder)
    if data and data.get("attempts") and not history.attempts:  # load takes a file it cannot use for none
        raise damaged
    return history
