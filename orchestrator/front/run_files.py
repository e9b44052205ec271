"""What a run left in its folder, as ``Run`` reads it: the result, the live sweep point's folder,
and one attempt's part of a rank's log (``orchestrator.core.attempt_logs``), with the error that names
the attempts a log holds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.backends import backend
from orchestrator.core.errors import OrchestratorError, UsageError
from orchestrator.core.shell_words import command_line
from orchestrator.core.records import RunRecord
from orchestrator.core.run_folder import RunFolder

if TYPE_CHECKING:
    from orchestrator.core.recovery import History


def check_attempt(attempt: Any) -> int:
    """An attempt number as ``logs`` takes it: an int from 1."""
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise UsageError(f"attempt is counted from 1 (as 'orchestrator status' counts), not {attempt!r}: "
                         "e.g. .logs(rank=0, attempt=2)")
    return attempt


def live_folder(rec: RunRecord) -> Path:
    """Where the running ranks record themselves: the run folder, or in a sweep the folder of the
    point the current attempt reached (points run in order locally; on SLURM the newest task)."""
    from orchestrator.executors.base import current_point
    from orchestrator.core.records import point_dir

    return point_dir(rec.run_dir, current_point(rec)) if rec.sweep_size else Path(rec.run_dir)


def read_result(folder: Path) -> Any:
    path = RunFolder.of(folder).result
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("result")
    except FileNotFoundError:
        raise OrchestratorError(f"{path} is missing although the run COMPLETED: was it removed?") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
        raise OrchestratorError(f"{path} is unreadable ({type(exc).__name__}); the rank logs have the output") from None


def attempt_part(rec: RunRecord, text: str, attempt: int, rank: int, point: int | None, path: Path) -> str:
    """Attempt ``attempt``'s part of ``text``, rank ``rank``'s log at ``path``
    (``orchestrator.core.attempt_logs``); AttemptNotFoundError names the attempts it holds."""
    from orchestrator.core.attempt_logs import AttemptNotFoundError, attempt_text, held, marker_rules
    from orchestrator.core.fs_checks import shown

    history = log_history(rec, path, point)
    try:  # the markers the script printed itself are not trusted (marker_rules, from the history)
        return attempt_text(text, attempt, marker_rules(history))
    except AttemptNotFoundError as exc:
        known = {a.number: a for a in history.attempts} if history is not None else {}
        why = ""
        if attempt in known and known[attempt].outcome == "unhealthy":
            why = f"; attempt {attempt} was stopped by the health gate before any rank started"
        elif known and attempt > max(known):
            why = f"; {rec.run_id} has had {max(known)} attempt(s) so far"
        raise AttemptNotFoundError(attempt, exc.present,
                                   f"attempt {attempt} is not in rank {rank}'s log {shown(path)}: it holds "
                                   f"{held(exc.present)}{why} "
                                   f"({command_line('orchestrator', 'status', rec.run_id)} lists every attempt)") from None

def log_history(rec: RunRecord, path: Path, point: int | None = None) -> History | None:
    """The attempts (``recovery.History``, or None when there is none to read) of the run or
    sweep point whose rank log is ``path``."""
    from orchestrator.core.attempt_logs import job_of_log, read_history
    from orchestrator.core.records import point_dir

    if not backend(rec.executor).scheduled:  # the supervisor's logs: <folder>/logs/rank-N.log
        return read_history(path.parent.parent)  # <folder>/logs/rank-N.log
    if not rec.sweep_size:
        return read_history(rec.run_dir)
    if point is None:
        job = job_of_log(path)
        point = rec.job_ids.index(job) if job in rec.job_ids else None
    return read_history(point_dir(rec.run_dir, point)) if point is not None else None
