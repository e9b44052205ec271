"""What SLURM says about jobs: sacct's and squeue's states mapped onto ``State`` (one table,
``STATE_MAP``), at most two scheduler queries for any number of jobs (``sacct_states``), a
cluster without accounting (squeue alone), and the end a job's agent recorded for a job the
scheduler no longer knows (``end_from_agent``). The queries run through
``orchestrator.backends.slurm.node.slurm_controller``; ``executors.slurm`` re-exports these names.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from orchestrator.core import ownership
from orchestrator.core.errors import SubmissionError
from orchestrator.core.records import RunRecord, point_dir
from orchestrator.core.recovery import HISTORY_FILE, Attempt, History
from orchestrator.core.end_verdict import EndVerdict
from orchestrator.backends.slurm.node.slurm_controller import check_slurm_conf, controller_problem
from orchestrator.backends.slurm.node.slurm_controller import run as run_slurm
from orchestrator.core.states import Action, EndReason, Outcome, State
from orchestrator.executors.scheduler_pacing import FORGOTTEN

#: sacct/squeue state -> our state. One table, tested; nothing is folded into FAILED.
STATE_MAP: dict[str, State] = {
    "PENDING": State.PENDING, "CONFIGURING": State.PENDING, "REQUEUE_HOLD": State.PENDING,
    "REQUEUE_FED": State.PENDING,
    "RUNNING": State.RUNNING, "COMPLETING": State.RUNNING, "STAGE_OUT": State.RUNNING,
    "SUSPENDED": State.RUNNING, "RESIZING": State.RUNNING, "SIGNALING": State.RUNNING,
    "COMPLETED": State.COMPLETED,
    "FAILED": State.FAILED, "BOOT_FAIL": State.FAILED,
    "TIMEOUT": State.TIMEOUT, "DEADLINE": State.TIMEOUT,
    "CANCELLED": State.CANCELLED, "REVOKED": State.CANCELLED,
    "PREEMPTED": State.PREEMPTED, "NODE_FAIL": State.NODE_FAIL, "OUT_OF_MEMORY": State.OUT_OF_MEMORY,
    "REQUEUED": State.REQUEUED,
}


def map_state(raw: str) -> State:
    """'CANCELLED by 0' -> CANCELLED; unknown words -> UNKNOWN."""
    word = raw.split()[0].rstrip("+") if raw.strip() else ""
    return STATE_MAP.get(word, State.UNKNOWN)


def pairs(stdout: str) -> list[tuple[str, str]]:
    """'12|RUNNING' lines -> [('12', 'RUNNING')]."""
    return [tuple(part.strip() for part in line.split("|", 1)) for line in stdout.splitlines() if "|" in line]  # type: ignore[misc]


def queue_states(bases: list[str]) -> list[str] | None:
    """One squeue call: the states of the jobs it still lists (pending, running, completing...);
    [] once it lists none of them (ended, or purged from the controller: "Invalid job id"); None
    when squeue could not answer (missing, timed out, or another error): they may still be there."""
    out = run_slurm(["squeue", "-h", "-o", "%i|%T", "-j", ",".join(bases)])
    if out.returncode is None:
        return None
    if out.returncode != 0:
        problem = controller_problem("squeue", out.stderr)
        if problem:  # no cluster to ask: waiting would not change the answer
            raise SubmissionError(problem)
        return [] if "Invalid job id" in out.stderr else None
    return [line.split("|", 1)[1].strip() for line in out.stdout.splitlines() if "|" in line]


def squeue_states(bases: list[str], every_state: bool = True) -> dict[str, State]:
    """One squeue call for these jobs (array tasks listed one by one): {job or task id: state}.

    ``every_state`` (``-t all``): finished jobs too, for as long as the controller keeps them
    (MinJobAge after their end), with their end state; else only jobs still pending, running or
    completing. A job squeue does not know is left out ("Invalid job id", which squeue answers
    when the only job asked for is gone, is an empty answer, not an error)."""
    check_slurm_conf()
    out = run_slurm(["squeue", "-h", "-r", *(["-t", "all"] if every_state else []), "-o", "%i|%T",
                     "-j", ",".join(bases)])
    if out.returncode is None:
        raise SubmissionError(f"squeue could not run ({out.error}); run this on a SLURM login node")
    if out.returncode != 0:
        if "Invalid job id" in out.stderr:
            return {}
        raise SubmissionError(controller_problem("squeue", out.stderr) or
                              f"squeue failed ({out.stderr.strip()}); is SLURM_CONF set and the controller running?")
    return {jid: map_state(raw) for jid, raw in pairs(out.stdout)}


# ---- a cluster without accounting -----------------------------------------------------------

#: What sacct answers (exit 1) on a cluster with AccountingStorageType=accounting_storage/none.
ACCOUNTING_DISABLED = "accounting storage is disabled"
#: Clusters this process found without accounting: (SLURM_CONF, its mtime) -> why. Keyed by the
#: file's mtime too, because a cluster rebuilt at the same path (deploy/cluster.sh up) writes a new
#: slurm.conf and may have accounting again.
ACCOUNTING_OFF: dict[tuple[str, int], str] = {}


def _cluster_key() -> tuple[str, int]:
    """Which cluster this process talks to: SLURM_CONF (or the default path) and its mtime."""
    conf = os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    try:
        return conf, os.stat(conf).st_mtime_ns
    except OSError:
        return conf, 0


def accounting_off() -> str | None:
    """Why this cluster has no accounting to ask (sacct disabled or missing), once that was seen
    by this process; None while sacct has answered (or has not been asked yet)."""
    return ACCOUNTING_OFF.get(_cluster_key())


def sacct_unusable(returncode: int | None, stderr: str) -> str | None:
    """Whether sacct's answer says this cluster keeps no accounting; None for any other answer
    (a slurmdbd that is down is a problem to report, not a cluster without accounting).
    ``returncode`` None: sacct is not installed."""
    if returncode is None:
        return "sacct is not installed here"
    if returncode != 0 and ACCOUNTING_DISABLED in stderr.lower():
        return "sacct: Slurm accounting storage is disabled (AccountingStorageType=accounting_storage/none)"
    return None


def sacct_rows(bases: list[str]) -> list[tuple[str, str]] | None:
    """sacct's (job id, state) rows for these jobs; None when this cluster keeps no accounting
    (noted for the rest of the process: sacct is not asked again)."""
    check_slurm_conf()
    out = run_slurm(["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(bases)])
    if out.missing:
        ACCOUNTING_OFF[_cluster_key()] = sacct_unusable(None, "") or ""
        return None
    if out.returncode is None:
        raise SubmissionError(f"sacct could not run ({out.error}); run this on a SLURM login node")
    why = sacct_unusable(out.returncode, out.stderr)
    if why:
        ACCOUNTING_OFF[_cluster_key()] = why
        return None
    if out.returncode != 0:
        raise SubmissionError(controller_problem("sacct", out.stderr) or
                              f"sacct failed ({out.stderr.strip()}); is SLURM_CONF set and the controller "
                              "(and slurmdbd) running?")
    return pairs(out.stdout)


#: What an attempt's outcome (``recovery.Attempt.outcome``, written by the job's agent) says about
#: the job's end, for a job the scheduler no longer knows. An attempt that led to a restart or a
#: requeue did not end the job; "lost" (its agent was killed) and anything else say nothing.
OUTCOME_STATE: dict[str, State] = {
    Outcome.COMPLETED: State.COMPLETED, Outcome.CANCELLED: State.CANCELLED, Outcome.TIMEOUT: State.TIMEOUT,
    Outcome.PREEMPTED: State.PREEMPTED, Outcome.CRASH: State.FAILED, Outcome.HANG: State.FAILED,
    Outcome.UNHEALTHY: State.FAILED, Outcome.NODE_FAILURE: State.FAILED, Outcome.FAILED: State.FAILED,
    Outcome.NOT_REQUEUED: State.FAILED,
}


#: The words of the reason ``end_from_agent`` gives for an unknown end (refresh clears it once known).
UNKNOWN_END = f"{FORGOTTEN} SLURM"


def end_from_agent(job: str, attempts: Sequence[Attempt], end: EndVerdict | None,
                   cancel_requested: bool, history: str | Path) -> tuple[State, str]:
    """The end state of ``job`` from its run folder alone, for when the scheduler no longer lists it
    and there is no accounting to ask: (state, '') or (UNKNOWN, why, for status). ``history``:
    the recovery.json the attempts were read from (named in the reason).

    - Its last attempt (``attempts``, from recovery.json) ended and led to no restart or requeue:
      the outcome the agent recorded (OUTCOME_STATE). The agent takes the time limit's SIGTERM for
      a cancel; ``end`` (end.json) saying ``time_limit`` with no cancel asked makes it TIMEOUT.
    - Otherwise, ``orchestrator cancel`` asked for this submission (``cancel_requested``) and the
      job is gone: CANCELLED (a pending job never ran an agent).
    - Otherwise nothing tells: UNKNOWN, and why. Never COMPLETED without the agent's record."""
    mine = [a for a in attempts if a.job == job]
    last = mine[-1] if mine else None
    if last is not None and last.ended is not None and last.action not in (Action.RESTART, Action.REQUEUE):
        state = OUTCOME_STATE.get(last.outcome or "")
        if state == State.CANCELLED and not cancel_requested and end is not None and end.reason == EndReason.TIME_LIMIT:
            state = State.TIMEOUT
        if state is not None:
            return state, ""
    if cancel_requested:
        return State.CANCELLED, ""
    if last is None:
        seen = f"no attempt of it is recorded in {history} (it never started, or its agent could not write there)"
    elif last.ended is None:
        seen = f"its agent recorded attempt {last.number}'s start in {history} but not its end (killed, or its node lost)"
    elif last.action in (Action.RESTART, Action.REQUEUE):
        seen = f"its agent recorded a {last.action} after attempt {last.number} in {history}, and no later attempt"
    else:
        seen = f"attempt {last.number} is recorded as {last.outcome or 'ended'} in {history}"
        if last.why:
            seen += f" ({' '.join(last.why.split())[:200]})"
    return State.UNKNOWN, (f"job {job} {UNKNOWN_END} (squeue does not list it, and this cluster keeps no accounting "
                           f"for sacct) and {seen}, so how it ended is unknown; 'orchestrator logs RUN' shows what "
                           "its ranks printed")


def agent_end(rec: RunRecord, index: int, job: str) -> tuple[State, str]:
    """``end_from_agent`` for the ``index``-th job of a run (a sweep's array task: its point's folder)."""
    from orchestrator.node.forensics import read_end

    folder = point_dir(rec.run_dir, index) if rec.sweep_size else Path(rec.run_dir)
    return end_from_agent(job, History.load(folder).attempts, read_end(folder),
                          ownership.cancel_requested(rec.run_dir), folder / HISTORY_FILE)


def expand_array_id(jid: str) -> list[str]:
    """sacct shows pending array tasks compressed: '12_[3-5,9%4]' -> ['12_3', '12_4', '12_5', '12_9']."""
    if "_[" not in jid:
        return [jid]
    base, ranges = jid.split("_[", 1)
    out = []
    for part in ranges.rstrip("]").split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        out += [f"{base}_{i}" for i in range(int(lo), int(hi or lo) + 1)]
    return out


def sacct_states(job_ids: list[str]) -> dict[str, State]:
    """At most two scheduler queries for any number of jobs: {job id (or array task id): state}.

    sacct knows every job, finished ones included, but learns of a new job a moment after
    sbatch returns; the jobs it does not know yet are asked of squeue in a second call. On a
    cluster without accounting (``accounting_off``) it is one squeue call, which lists finished
    jobs until MinJobAge after their end. A job no one lists is left out (``end_from_agent``).
    """
    if not job_ids:
        return {}
    bases = sorted({j.split("_")[0] for j in job_ids})
    rows = None if accounting_off() else sacct_rows(bases)
    if rows is None:
        return squeue_states(bases)
    states = {task: map_state(raw) for jid, raw in rows for task in expand_array_id(jid)}
    missing = [b for b in bases if b not in states and not any(k.startswith(b + "_") for k in states)]
    # A job SLURM requeues after a node failure (it asked --requeue) reads NODE_FAIL in sacct for a
    # moment before its next record exists, and a job that just started still reads PENDING there
    # (slurmdbd hears of the start later: `chaos` right after `submit` was refused as "PENDING" while
    # the ranks ran): squeue, which lists only jobs still queued or running, tells.
    # One squeue call asks both, with every state: a job that ended since sacct's record also
    # reads its end there (two calls, one per kind, made three queries in all).
    stale = {k.split("_")[0] for k, st in states.items() if st in (State.NODE_FAIL, State.PENDING)}
    again = sorted(stale | set(missing))
    if again:
        states.update(squeue_states(again))
    return states
