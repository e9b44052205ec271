"""Every recovery measured, and the run's goodput: the moments of an attempt (``Attempt.times``,
in <run>/recovery.json), the phases of the recovery between two attempts, and productive training
time over wall time.

A recovery's phases: ``teardown`` (the failure seen to the attempt's end: ranks ended, blame,
decision), ``wait`` (to the next attempt's start: a requeue's hold and the queue), ``gate`` (its
health gate), ``launch`` (the rest until its ranks start), ``start`` (to every rank joined: the
interpreter, imports, rendezvous), ``first step`` (to its first step: the resume, rank API only). The local supervisor and the SLURM job's agent record the moments; status and
report read them. Standard library only (the agent imports it on a compute node).

An attempt's moments (wall-clock seconds, each only when known):

- ``gate_s``: how long its health gate took;
- ``ranks_at``: its ranks were started (srun, or the local zygote's forks);
- ``joined_at``: its last rank joined the process group (the watchdog saw it; any script);
- ``first_step_at`` / ``first_step``: every rank had reported its first step of the attempt, and the
  lowest step reported first (the step it resumed from): the rank API's progress reports only;
- ``last_step_at`` / ``last_step``: its last report, and the slowest rank's step then;
- ``progress_at``: the last progress any rank showed the stall watchdog (a rank API report, new
  output, its join), any script: only with ``watchdog.stall_s`` (``progress_at``);
- ``failed_at``: the failure was seen (the ranks' srun ended, a rank exited non-zero, a watchdog verdict).

A failed attempt trained until its last step, else its last progress (``trained_until``): the rest,
to the failure seen (a hang's ``stall_s`` and its stacks, a crash's step in flight), is counted
as the recovery's, not as training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Protocol, Sequence, TypeVar, cast

from orchestrator.core.states import Action, Outcome


class Attempt(Protocol):
    """What is read of an attempt (``recovery.Attempt``, which status shows through this module)."""

    number: int
    started: float
    ended: Optional[float]
    action: str
    times: dict[str, float]
    outcome: Optional[str]
    why: str


A = TypeVar("A", bound=Attempt)

#: The phases of one recovery, in order, as status names them.
PHASES = ("teardown", "wait", "gate", "launch", "start", "first step")


def progress_marks(run_dir: str | Path, world_size: int, since: float) -> dict[str, float]:
    """The rank API's moments of the attempt that started at ``since``: first and last step (from
    each node's heartbeat file: O(nodes) reads, once per attempt). {} for a script without it."""
    from orchestrator.core.progress import read_progress

    reports = [r for r in read_progress(run_dir, world_size) if r is not None and r.time >= since]
    if not reports:
        return {}
    marks = {"last_step_at": max(r.time for r in reports), "last_step": float(min(r.step for r in reports))}
    firsts = [r for r in reports if r.first_time is not None and r.first_step is not None]
    kept = [r for r in reports if r.kept_time is not None and r.kept_step is not None]
    if kept:  # survivors that rejoined: the attempt before trained until their last step there
        marks["kept_last_step_at"] = max(r.kept_time for r in kept if r.kept_time is not None)
        marks["kept_last_step"] = float(min(r.kept_step for r in kept if r.kept_step is not None))
    if len(firsts) == world_size:  # every rank stepped: the attempt's first step is done
        marks["first_step_at"] = max(r.first_time for r in firsts if r.first_time is not None)
        marks["first_step"] = float(min(r.first_step for r in firsts if r.first_step is not None))
    return marks


class Progressing(Protocol):
    """What ``progress_at`` reads of the stall watchdog (``orchestrator.node.watchdog.Watch``)."""

    world_size: int
    stall_s: Optional[float]

    def last_progress(self, rank: int) -> float: ...


def progress_at(watch: Progressing) -> dict[str, float]:
    """When any rank last progressed as the stall watchdog saw it (a report, new output, a join; the
    ranks' start when none did): a failed attempt trained until then, whatever the script. {} without
    ``watchdog.stall_s``: the watchdog then stops looking once every rank has joined, and its last
    look says nothing of the training after it."""
    if not watch.stall_s or watch.world_size <= 0:
        return {}
    return {"progress_at": max(watch.last_progress(r) for r in range(watch.world_size))}


def joined_at(joined: Mapping[int, float], world_size: int) -> dict[str, float]:
    """When the watchdog saw the last rank join (its ``Watch.joined``), once every rank has."""
    return {"joined_at": max(joined.values())} if world_size > 0 and len(joined) >= world_size else {}


def back_at(attempt: Attempt) -> Optional[float]:
    """When the attempt was training: its first step, else every rank joined, else its ranks started."""
    t = attempt.times
    return t.get("first_step_at") or t.get("joined_at") or t.get("ranks_at")


def trained_until(attempt: Attempt, now: float) -> float:
    """When the attempt's training ended: its last step (the rank API's); for a failed attempt without
    steps, its last progress the stall watchdog saw (``progress_at``, never after the failure seen), else
    the failure seen; else its end, or ``now`` while it runs."""
    t = attempt.times
    if t.get("last_step_at"):
        return t["last_step_at"]
    failed = t.get("failed_at")
    if failed and t.get("progress_at"):
        return min(t["progress_at"], failed)
    return failed or attempt.ended or now


def recovery_phases(before: Attempt, after: Attempt) -> Optional[dict[str, float]]:
    """The recovery from ``before``'s failure (or requeue) to ``after``'s training, phase by phase
    (seconds), with ``total``: the failure seen to the first new step (or join). None when ``before``
    was not followed by a recovery (it completed, or the run was started again), or not measured."""
    if before.action not in (Action.RESTART, Action.REQUEUE):  # it ended (or was stopped): no recovery followed
        return None
    failed, back = before.times.get("failed_at") or before.ended, back_at(after)
    if failed is None or before.ended is None or back is None or back < failed:
        return None
    a = after.times
    ranks_at = a.get("ranks_at", after.started)
    joined = a.get("joined_at", ranks_at)
    gate = a.get("gate_s", 0.0)
    phases = {"teardown": before.ended - failed, "wait": max(0.0, after.started - before.ended), "gate": gate,
              "launch": max(0.0, ranks_at - after.started - gate), "start": max(0.0, joined - ranks_at),
              "first step": max(0.0, a["first_step_at"] - joined) if "first_step_at" in a else 0.0}
    phases["total"] = back - failed
    if not all(math.isfinite(v) for v in phases.values()):
        return None  # times so far apart that their difference overflows: no measure ("recovered in infs")
    return phases


def trained(attempt: Attempt) -> bool:
    """Whether the attempt is known to have trained: a step reported, every rank joined, or progress
    the stall watchdog saw after its ranks started (``back_at`` falls back on the ranks' start, all
    that a script without the rank API or a process group shows)."""
    t = attempt.times
    ranks_at = t.get("ranks_at")
    return bool(t.get("first_step_at") or t.get("last_step_at") or t.get("joined_at")) or \
        (ranks_at is not None and t.get("progress_at", ranks_at) > ranks_at)


def recovery_shown(before: Attempt, after: Attempt) -> Optional[dict[str, float]]:
    """``recovery_phases`` as status and the report show them ("recovered in ..."): None also for an
    attempt cancelled before it trained, whose restart recovered nothing. Goodput still counts that
    time as the recovery's (``goodput`` reads ``recovery_phases``): it went to recovering."""
    if after.outcome == Outcome.CANCELLED and not trained(after):
        return None
    return recovery_phases(before, after)


def phases_line(phases: Mapping[str, float], after: Optional[int] = None) -> str:
    """'recovered in 8.9s from attempt 1 (teardown 0.6, gate 0.5, ...)': the phases over 0.05 s."""
    parts = ", ".join(f"{name} {phases[name]:.1f}" for name in PHASES if phases.get(name, 0.0) >= 0.05)
    return (f"recovered in {phases['total']:.1f}s" + (f" from attempt {after}" if after is not None else "")
            + (f" ({parts})" if parts else ""))


@dataclass(frozen=True)
class Goodput:
    """Productive training time over wall time from submit, and where the rest went."""

    wall_s: float
    productive_s: float  # training time, lost work taken out
    queue_s: float  # submit to the first attempt's start
    recovery_s: float  # a failed attempt's last progress to training again (restarts, requeue holds, the queue)
    lost_s: float  # steps done again after a resume (from the rank API's steps)
    startup_s: float  # the first attempt's start to its training

    @property
    def fraction(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    def line(self) -> str:
        return (f"goodput {self.fraction:.1%}: {self.productive_s:.0f}s training of {self.wall_s:.0f}s since submit "
                f"(queue {self.queue_s:.0f}s, start-up {self.startup_s:.0f}s, recovery {self.recovery_s:.0f}s, "
                f"lost work {self.lost_s:.0f}s)")


#: How far a node's clock may run behind the submitting host's (an attempt's start is the node's
#: time, the submission the submitting host's): an attempt that started this little before the
#: submission still belongs to it.
CLOCK_SKEW_S = 1.0


def goodput(history: Sequence[Attempt], submitted: float, now: float) -> Optional[Goodput]:
    """This submission's goodput (None before its first attempt trained). An attempt is productive
    from its training start (``back_at``) to the end of its training (``trained_until``: its last step
    or last progress, else its failure seen, or its end); a failed attempt's time after it (a hang's
    ``stall_s``) is the recovery's that follows; the steps an attempt resumed below the previous
    one's last step count as lost, at the previous one's pace.
    Only the attempts since ``submitted`` count: a run submitted again keeps its earlier
    submissions' attempts in its history (their training is not this submission's, and the time
    between them and the new submission is nobody's recovery)."""
    attempts = with_kept_steps([a for a in history if a.started and _of_this_submission(a, submitted)])
    trained = [a for a in attempts if back_at(a) is not None]
    if not trained:
        return None
    end = max((a.ended or now) for a in attempts)
    productive = lost = recovery = 0.0
    for i, a in enumerate(attempts):
        start = back_at(a)
        if start is None:
            if a.ended is None:  # running, not training yet: its recovery (or start) so far counts now
                before = attempts[i - 1] if i else None
                if before is not None and before.action in (Action.RESTART, Action.REQUEUE):
                    recovery += max(0.0, now - (before.times.get("failed_at") or before.ended or now)) \
                        + _unseen_s(before)
            continue
        productive += max(0.0, trained_until(a, now) - start)
        before = attempts[i - 1] if i else None
        if before is not None:
            phases = recovery_phases(before, a)
            recovery += phases["total"] + _unseen_s(before) if phases else 0.0
            lost += _lost_s(before, a)
    first = attempts[0]
    startup = max(0.0, (back_at(first) or first.started) - first.started)
    wall = max(0.0, end - min(submitted, first.started))  # the skew allowed: never less than its attempts
    if not all(math.isfinite(v) for v in (wall, productive, lost, recovery, startup)):
        return None  # a history whose times overflow measures nothing ("goodput nan%")
    return Goodput(wall_s=wall, productive_s=max(0.0, productive - lost), queue_s=max(0.0, first.started - submitted),
                   recovery_s=recovery, lost_s=lost, startup_s=startup)


def with_kept_steps(attempts: Sequence[A]) -> list[A]:
    """Each failed attempt's last step as its survivors saw it (the next attempt's ``kept_last_step_at``,
    recovery.survivors: keep) where that is later than its last report written and not after the
    failure: the time between is training, not recovery."""
    import dataclasses

    out = list(attempts)
    for i in range(len(out) - 1):
        t, after = out[i].times, out[i + 1].times
        kept_at, kept = after.get("kept_last_step_at"), after.get("kept_last_step")
        if kept_at is None or kept is None or kept_at <= t.get("last_step_at", -math.inf) \
                or kept_at > t.get("failed_at", math.inf) or kept_at < out[i].started:
            continue
        out[i] = dataclasses.replace(cast(Any, out[i]), times={  # a dataclass: recovery.Attempt
            **t, "last_step_at": kept_at, "last_step": max(kept, t.get("last_step", kept))})
    return out


def with_live_marks(attempts: Sequence[A], run_dir: str | Path, world_size: int) -> list[A]:
    """The attempts with the running one's moments read now from the ranks' progress files (its
    agent records them only when it ends): so that a running job's goodput counts its training,
    and the recovery that led to it, while it runs."""
    import dataclasses

    out = list(attempts)
    if out and out[-1].ended is None and isinstance(out[-1].times, dict):
        last = out[-1]
        since = last.times.get("ranks_at", last.started)
        try:
            marks = progress_marks(run_dir, world_size, since) if world_size > 0 else {}
        except (OSError, ValueError):
            marks = {}
        out[-1] = dataclasses.replace(cast(Any, last), times={**marks, **last.times})  # a dataclass: recovery.Attempt
    return out


def _of_this_submission(attempt: Attempt, submitted: float) -> bool:
    """Started at or after the submission; or just before it by the clocks' skew and not over by then
    (an earlier submission's last attempt ends before the next submission)."""
    if attempt.started >= submitted:
        return True
    return attempt.started >= submitted - CLOCK_SKEW_S and (attempt.ended is None or attempt.ended > submitted)


def _unseen_s(before: Attempt) -> float:
    """The failed attempt's time between the end of its training (``trained_until``: its last step or
    last progress) and its failure seen: a hang's stall_s and stacks, a crash's step in flight. No
    training, and before the recovery's clock starts."""
    failed, start = before.times.get("failed_at"), back_at(before)
    if not failed or start is None:
        return 0.0
    return max(0.0, failed - max(trained_until(before, failed), start))


def _lost_s(before: Attempt, after: Attempt) -> float:
    """The work ``after`` did again: the steps between its resume and ``before``'s last, at
    ``before``'s pace (rank API steps only; 0 when unknown)."""
    b, a = before.times, after.times
    if not {"first_step", "first_step_at", "last_step", "last_step_at"} <= set(b) or "first_step" not in a:
        return 0.0
    steps = b["last_step"] - b["first_step"]
    if steps <= 0 or b["last_step_at"] <= b["first_step_at"]:
        return 0.0
    per_step = (b["last_step_at"] - b["first_step_at"]) / steps
    return max(0.0, b["last_step"] - a["first_step"]) * per_step
