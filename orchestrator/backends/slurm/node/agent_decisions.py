"""The SLURM job agent's decisions, as pure functions of what it knows (no process, no file, no
clock of their own): when a requeue is due and why, when a cancel's stop has run out of grace,
what an attempt's outcome is, the agent's exit code; and the readings of what SLURM says (srun's
line about a killed task, a preemption, time spent suspended). Standard library only.

Unit-tested without processes (tests/unit/test_agent_decisions.py); the agent's loop
(``orchestrator.backends.slurm.node.slurm_job``) gathers the facts and acts on the answers.
"""

from __future__ import annotations

import re
import signal
import time
from typing import Iterable, Mapping, Sequence

from orchestrator.backends.slurm.node.agent_state import Killed
from orchestrator.backends.slurm.node.agent_stop import Stop, cancel_asked
from orchestrator.core.states import Action, FailureKind, Outcome, Phase

#: The agent's exit code for a job that stopped early and was not requeued (SLURM: FAILED).
UNFINISHED_EXIT = 3
#: Under ``always``, the requeue waits for the ranks' clean-up at most until this much of the
#: margin is left (scontrol and the controller need a moment before the time limit ends the job).
REQUEUE_RESERVE_S = 15.0
ALWAYS, AUTO, NEVER = "always", "auto", "never"  # slurm.requeue's words

#: How srun names a task that a signal ended (its ``strsignal``); an exit code is not one.
SRUN_TASK_ENDED = re.compile(r"srun: error: (\S+): tasks? ((\d+)(?:[-,][\d,-]*)?): (.+?)\s*$")
#: srun's line about a node the step lost ("srun: error: Node failure on node2").
NODE_FAILURE = re.compile(r"Node failure on (\S+)")


def requeue_deadline(notice_at: float, margin_s: float) -> float:
    """When a requeue under ``always`` stops waiting for the ranks to end: the margin minus a
    reserve for scontrol (half the margin, for short margins)."""
    return notice_at + max(0.0, margin_s - min(REQUEUE_RESERVE_S, margin_s / 2))


def requeue_evidence(policy: str, notice_at: float | None, marker: bool) -> bool:
    """Whether the ranks stopped (or are stopping) for a requeue: under ``always`` the notice
    came; under ``auto`` the rank API checkpointed after a stop signal (its marker)."""
    return (policy == ALWAYS and notice_at is not None) or (policy == AUTO and marker)


def requeue_why(policy: str, notice_name: str, notice_at: float | None, marker: bool, ranks_ended: bool,
                now: float, margin_s: float) -> str | None:
    """Why the job is to be requeued now, or None (not due, or not yet: under ``always`` never in
    the middle of the ranks' clean-up, until the margin is nearly spent)."""
    if policy == ALWAYS and notice_at is not None:
        if ranks_ended or now >= requeue_deadline(notice_at, margin_s):
            return (f"{notice_name} (time limit or preemption), slurm.requeue: always"
                    + ("" if ranks_ended else "; the ranks had not ended with the margin nearly spent"))
        return None
    # The ranks may also have been signalled directly (scancel --signal=USR2 reaches the steps,
    # not the agent's shell): the rank API's checkpoint marker is the evidence either way.
    if policy == AUTO and marker:
        return "the ranks stopped on a signal and checkpointed, slurm.requeue: auto"
    return None


def requeues_used(history_requeues: int, restart_count: int, history_restarts: int) -> int:
    """Time-limit and preemption requeues so far: SLURM's restart count less recovery's restarts
    (recorded in the history); never fewer than the history's own count."""
    return max(history_requeues, restart_count - history_restarts)


def no_requeue_left(used: int, limit: int) -> str:
    """Why a requeue that is due cannot happen ('' when it can)."""
    return f"no requeues left ({used} of {limit} used; slurm.max_requeues)" if used >= limit else ""


def stacks_before_notice(stacks_on_failure: bool, policy: str, used: int, limit: int) -> bool:
    """A notice with no requeue to follow (``never``, or no requeues left) is the time limit ending
    the job: save where the ranks are first. ``auto`` may still requeue."""
    return stacks_on_failure and (policy == NEVER or used >= limit)


def cancelled(stop: Stop | None) -> bool:
    """The attempt was cancelled: ``orchestrator cancel`` asked, or a SIGTERM that the controller
    said is no preemption (scancel)."""
    return stop is not None and stop.cancelling


def grace_spent(stop: Stop | None, now: float, grace_s: float) -> bool:
    """``orchestrator cancel``'s stop_grace_s ran out before the ranks ended (and the job was not
    scancelled yet)."""
    return cancel_asked(stop) and stop is not None and not stop.sent and now >= stop.at + grace_s


def notice_at(stop: Stop | None) -> float | None:
    """When the time limit's notice (or a preemption) came, if it did: the requeue's clock."""
    return stop.notice_at if stop is not None else None


def a_failure(code: int, phase: Phase, cancelled_or_stopping: bool, notice_at: float | None) -> bool:
    """The ranks' end is a failure to classify and recover from: they failed (or the watchdog ended
    them), and nobody asked them to stop (no cancel, no notice, no decision taken)."""
    return (code != 0 or phase is Phase.ENDING) and phase in (Phase.RUNNING, Phase.ENDING) \
        and not cancelled_or_stopping and notice_at is None


def failed_exit(phase: Phase, code: int | None) -> int:
    """The exit code of an attempt that failed: the ranks' (as a shell reports a signal), 1 when
    that says nothing (a watchdog verdict, a gate, 0)."""
    if phase is Phase.ENDING or code in (None, 0):
        return 1
    assert code is not None
    return code if code > 0 else 128 - code


def exit_code(phase: Phase, srun_code: int, stopped_early: bool) -> int | None:
    """The agent's exit code, which SLURM turns into the job's state; None: the job stopped early
    and was not requeued, which the agent reports as unfinished (``UNFINISHED_EXIT``)."""
    if phase is Phase.ENDING:
        return 1  # FAILED, with the watchdog's verdict in end.json
    if phase is Phase.REQUEUED:
        return 0  # the ranks' ends were the requeue's doing; SLURM runs the next attempt
    if srun_code == 0 and stopped_early:
        return None
    return srun_code if srun_code >= 0 else 128 - srun_code


def attempt_outcome(*, was_cancelled: bool, failure: FailureKind | None, action: Action, phase: Phase,
                    preempted: bool, code: int | None) -> Outcome:
    """How the attempt ended, for recovery.json."""
    if was_cancelled:
        return Outcome.CANCELLED
    if failure is not None and action in (Action.RESTART, Action.STOP):
        return Outcome.of_failure(failure)
    if phase is Phase.REQUEUED:
        return Outcome.REQUEUED
    if preempted:
        return Outcome.PREEMPTED
    if code == 0:
        return Outcome.COMPLETED
    if failure is not None:
        return Outcome.of_failure(failure)
    if code == UNFINISHED_EXIT:
        return Outcome.NOT_REQUEUED
    return Outcome.FAILED


def step_hosts(allocation: Sequence[str], avoid: Iterable[str], nodes: int) -> tuple[str, ...] | None:
    """The nodes of the ranks' next step: the first ``nodes`` of the allocation that are not to be
    avoided (excluded, blamed, lost), in the allocation's order; None when fewer are left (then
    only a requeue can restart the job)."""
    bad = set(avoid)
    left = [h for h in allocation if h not in bad]
    return tuple(left[:nodes]) if nodes > 0 and len(left) >= nodes else None


def attempt_in_job(numbers_of_job: Iterable[int], number: int) -> int:
    """The job's attempt (from 0) of the run's attempt ``number``: how many of the run's attempts in
    this SLURM job came before it (requeues and restarts inside the job alike)."""
    return number - min([*numbers_of_job, number])


def hang_blamed(rank: object, hosts: tuple[str, ...], ranks_per_node: int, straggler_outside: bool) -> tuple[str, ...]:
    """The node a hang is blamed on: the straggler's, when its stack is not inside a collective
    (stuck on its own); none otherwise."""
    if not isinstance(rank, int) or not hosts or not straggler_outside:
        return ()
    return (hosts[min(rank // max(1, ranks_per_node), len(hosts) - 1)],)


# ---- what SLURM says -------------------------------------------------------------------------
def srun_signal_death(line: str) -> Killed | None:
    """(host, first task, description) from srun's line about tasks a signal ended, else None."""
    m = SRUN_TASK_ENDED.search(line)
    if not m or m.group(4).startswith("Exited with exit code"):
        return None
    return m.group(1), int(m.group(3)), m.group(4)


def ended_tasks(line: str) -> dict[int, int]:
    """The tasks srun's line says ended badly, with their exit codes (a signal's death as 128 + its
    number, named as strsignal names it; an unknown one as 255): "srun: error: node2: tasks 0-1,3:
    Killed" -> {0: 137, 1: 137, 3: 137}."""
    m = SRUN_TASK_ENDED.search(line)
    if not m:
        return {}
    what = m.group(4)
    code = re.match(r"Exited with exit code (\d+)", what)
    value = int(code.group(1)) if code else 128 + _SIGNAL_NUMBERS.get(what.split()[0].rstrip(":").lower(), 127)
    tasks: list[int] = []
    for part in m.group(2).split(","):
        first, _, last = part.partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            tasks += range(int(first), int(last or first) + 1)
    return {task: value for task in tasks}


#: A signal by the first word of its description, as srun writes it (strsignal: "Killed", "Terminated",
#: "Segmentation fault"...).
_SIGNAL_NUMBERS = {(signal.strsignal(s) or "").split()[0].lower(): int(s) for s in reversed(sorted(signal.valid_signals()))
                   if signal.strsignal(s)}


def preempted(job: Mapping[str, str]) -> bool:
    """Whether the controller is preempting (or has preempted) the job."""
    return job.get("JobState") == "PREEMPTED" or job.get("PreemptTime", "None") not in ("None", "Unknown", "")


def _duration_s(text: str) -> float | None:
    """SLURM's ``[D-]HH:MM:SS`` (RunTime) in seconds; None for anything else."""
    days, _, clock = text.rpartition("-")
    parts = clock.split(":")
    if len(parts) != 3 or not all(p.isdigit() for p in parts) or (days and not days.isdigit()):
        return None
    h, m, sec = (int(p) for p in parts)
    return (int(days) if days else 0) * 86400 + h * 3600 + m * 60 + sec


def suspended_s(job: Mapping[str, str], now: float) -> float | None:
    """How long the job has spent suspended in all (``scontrol suspend``, a SUSPEND,GANG
    preemption): its age since StartTime less its RunTime, which SLURM counts without suspended
    time. None when the controller did not say (no answer, a job not started)."""
    run = _duration_s(job.get("RunTime", ""))
    try:
        start = time.mktime(time.strptime(job.get("StartTime", ""), "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None
    return None if run is None else max(0.0, now - start - run)
