"""``orchestrator chaos RUN``: break one's own running job on purpose, to see the recovery its spec
asks for before a real failure does: end a rank (``--kill-rank N``, SIGKILL: a crash with no
traceback), freeze one (``--stop-rank N``, SIGSTOP: a hang the watchdog must find), or take a node
away (``--node-down NAME``, SLURM, where the caller may: ``scontrol update State=DOWN``). Each
injection is recorded in ``<run>/chaos.jsonl`` (when, what, which attempt), and the recovery that
follows is measured like any other (``orchestrator.core.attempt_times``: ``status`` shows it). A
sweep's point is a run of its own: ``RUN/points/N`` (``orchestrator.front.chaos_target``).

It refuses what would prove nothing or hurt someone else, before anything is broken: a run that is
not running, one that is not the caller's (another user's folder, another host's processes), one
whose recovery would not restart after the failure the injection causes (``recovery.max_restarts:
0``, restarts used up, the kind not in ``recovery.on``, the no-progress rule: ``refusal``), a
freeze the watchdog would never see (no ``watchdog.stall_s``), a rank or node that is not the
run's, a node that runs anyone else's job too (DOWN would kill it: ``node_down_refusal``), and a
``chaos.jsonl`` that is a link or not a regular file (``open_log``). Once the failure is injected
it succeeds, whatever happens after: the injection happened.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from orchestrator.node.chaos_node import SENT
from orchestrator.core import fs_checks, ownership
from orchestrator.core.errors import UsageError
from orchestrator.core.payload import Payload, RecoverySettings
from orchestrator.core.recovery import Failure, History, decide
from orchestrator.core.states import EndReason, FailureKind, State
from orchestrator.front.chaos_target import (Refresh, Target, find_target, read_history,
                                             read_payload)

if TYPE_CHECKING:
    from orchestrator.executors.base import SchedulerChaos

CHAOS_FILE = "chaos.jsonl"
#: srun --overlap has to create a step in the allocation; a busy controller takes its time.
SRUN_TIMEOUT_S = 30.0
#: The failure each injection causes, as recovery names it (what ``recovery.decide`` will decide on).
CAUSES = {"kill-rank": FailureKind.CRASH, "stop-rank": FailureKind.HANG, "node-down": FailureKind.NODE_FAILURE}
#: Not a failure: a rank made slower (a throttled GPU, a noisy neighbour); nothing recovers from it yet.
SLOW = "slow-rank"


@dataclass(frozen=True)
class Injection:
    """One failure to inject: what, and on which rank or node."""

    action: str  # kill-rank, stop-rank, node-down, slow-rank
    rank: Optional[int] = None
    node: Optional[str] = None
    factor: float = 4.0  # slow-rank: how many times slower
    seconds: float = 600.0  # slow-rank: for how long

    @property
    def kind(self) -> FailureKind:
        return CAUSES[self.action]

    @property
    def flag(self) -> str:
        """The injection as the command line gives it (for the examples in a refusal)."""
        return f"--{self.action} {self.node if self.action == 'node-down' else self.rank}" + \
            (f" --factor {self.factor:g}" if self.action == SLOW else "")


# ---- the refusals, pure but for the folder's owner and the checkpoint folder -------------------
def budget_refusal(name: str, settings: RecoverySettings, history: History, injection: Injection,
                   progressed: bool) -> Optional[str]:
    """Why the recovery would not restart after this injection's failure (None: it would), asked
    of ``recovery.decide`` itself, so chaos never predicts otherwise than the supervisor or the
    agent then decides: a run that ends FAILED proves nothing about its recovery."""
    kind = injection.kind
    if settings.max_restarts == 0:
        return (f"{name} has recovery.max_restarts: 0, so nothing would recover from the failure; set "
                "recovery.max_restarts (e.g. 2) and run it again")
    decision = decide(settings, history, Failure(kind, "orchestrator chaos"), progressed)
    if decision.restart:
        return None
    if kind not in settings.on:
        return (f"{name}'s recovery.on ({', '.join(settings.on)}) does not list {kind}, the failure {injection.flag} "
                f"causes, so the run would end FAILED; add {kind} to recovery.on and run it again")
    if decision.reason == EndReason.NO_PROGRESS:
        return _no_progress_refusal(name, settings, history)
    used = history.restarts()
    return (f"{name} has used {used} of its {settings.max_restarts} restart(s) (recovery.max_restarts), so the run "
            f"would end FAILED instead of recovering; to allow it, raise recovery.max_restarts (e.g. --set "
            f"recovery.max_restarts={used + 2}) and run it again")


def _no_progress_refusal(name: str, settings: RecoverySettings, history: History) -> str:
    """Why the no-progress rule would end the run. Waiting for a checkpoint helps only where one
    was ever seen; a folder that never held one is named, with the way out the no-progress
    verdict gives (``recovery.no_progress_message``)."""
    said = (f"{name} has written no new checkpoint in this attempt, after {history.failures_without_progress()} "
            "failed attempt(s) without one")
    rule = f"recovery.stop_without_progress ({settings.stop_without_progress}) would end it FAILED"
    if not history.checkpoints_never_seen():
        return f"{said}, so {rule}; wait for its next checkpoint and try again"
    folder = history.checkpoint_dir()
    where = f"{folder} (checkpoint.dir)" if folder else "checkpoint.dir"
    every = min(settings.max_restarts + 1, 1000)
    return (f"{said}, and no checkpoint ever appeared in {where}, so {rule}; waiting will not bring one: if the "
            "script saves its checkpoints elsewhere, set checkpoint.dir to that folder (or "
            f"recovery.stop_without_progress: {every} to use every restart regardless) and run it again")


def progressed_now(history: History, checkpoint_dir: str) -> bool:
    """Whether the attempt running now wrote a new checkpoint (what the no-progress rule will
    ask once the rank fails). True where the checkpoint folder cannot be seen from here (a
    node-local folder): chaos does not refuse on a guess."""
    current = next((a for a in reversed(history.attempts) if a.outcome is None), None)
    if current is None or not os.path.isdir(checkpoint_dir):
        return True
    return history.progressed(current, checkpoint_dir)


def refusal(target: Target, payload: Payload, history: History, injection: Injection, uid: int) -> Optional[str]:
    """Why this injection must not happen (None: it may)."""
    record, name = target.record, target.name
    if target.state != State.RUNNING:
        return f"{name} is {target.state}, not RUNNING: chaos breaks a running job"
    try:
        owner = os.stat(record.run_dir).st_uid
    except OSError as exc:
        return f"cannot read {record.run_dir} ({exc.strerror})"
    if uid != 0 and owner != uid:
        return f"{record.run_id} belongs to another user (uid {owner}): chaos breaks only your own jobs"
    if injection.action == "stop-rank" and payload.watchdog.stall_s is None:
        return ("a stopped rank is a hang, and this spec has no watchdog.stall_s to find it: its peers would wait "
                "forever; set watchdog.stall_s (e.g. 60)")
    world = max(1, payload.world_size)
    if injection.rank is not None and not 0 <= injection.rank < world:
        return f"rank {injection.rank} is not in {name} (ranks 0-{world - 1})"
    if injection.action == "node-down" and not target.scheduled:
        return "--node-down takes a SLURM node away; a local run has none: use --kill-rank or --stop-rank"
    if injection.action == SLOW and not (1 < injection.factor <= 100 and 0 < injection.seconds <= 86400):
        return "--factor must be over 1 (and at most 100), --for over 0 seconds (and at most a day)"
    budget = None if injection.action == SLOW else budget_refusal(name, payload.recovery, history, injection,
                                                                   progressed_now(history, payload.checkpoint.dir))
    if budget is not None:
        return budget
    return None if target.scheduled else ownership.foreign_reason(record.host, record.folder_id, record.run_dir)


def node_down_refusal(node: str, ours: str, squeue_stdout: str) -> Optional[str]:
    """Whether ``node`` may be set DOWN, from ``squeue -h -w NODE -o %A`` (a job id a line): only
    while the run's own job (``ours``, numeric) runs there and nothing else does. DOWN ends every
    job on the node and keeps it down until an administrator resumes it, so another job there
    (another user's, or another point of the same sweep) refuses it, counted but never named."""
    jobs = {line.strip() for line in squeue_stdout.splitlines() if line.strip()}
    if ours not in jobs:
        return (f"squeue lists no job of the run on {node} now (its job {ours} left it): taking it down would prove "
                "nothing; check 'orchestrator status'")
    others = len(jobs - {ours})
    if others:
        return (f"{node} also runs {others} other job(s): DOWN would end them too and keep the node down until an "
                f"administrator resumes it; use --kill-rank N for a crash on {node} instead")
    return None


# ---- the log ------------------------------------------------------------------------------------
def open_log(folder: Path) -> int:
    """An append-only fd on ``<folder>/chaos.jsonl``, opened before anything is broken so that a
    refusal comes first. Never through a link (O_NOFOLLOW: a link there could send our lines into
    any file this user may write); a FIFO, a device or a folder is refused too (O_NONBLOCK: never
    waits on one)."""
    path = folder / CHAOS_FILE
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fix = f"remove it (rm {fs_checks.shown(path)}) and try again; nothing was broken"
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            raise UsageError(f"chaos refused: {fs_checks.shown(path)} is a symbolic link, and chaos never writes "
                             f"through one: {fix}") from None
        if exc.errno in (errno.ENXIO, errno.EISDIR):
            raise UsageError(f"chaos refused: {fs_checks.shown(path)} is not a regular file: {fix}") from None
        if fs_checks.is_denied(exc):
            raise UsageError(f"chaos refused: no permission to write {fs_checks.shown(path)} "
                             f"({fs_checks.no_permission(path, 'written', exc)[1]}); nothing was broken") from None
        raise UsageError(f"chaos refused: {fs_checks.shown(path)} cannot be opened ({fs_checks.errno_text(exc)}); "
                         "nothing was broken") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        what = fs_checks.kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else f"a file with {st.st_nlink} hard links"
        raise UsageError(f"chaos refused: {fs_checks.shown(path)} is {what}, not a regular file of its own: {fix}")
    return fd


def record_entry(fd: int, path: Path, entry: dict) -> None:
    """Append one line; a failure is said on stderr, never raised: the injection has happened."""
    line = (json.dumps(entry) + "\n").encode("utf-8")
    try:
        while line:
            line = line[os.write(fd, line):]
    except OSError as exc:
        print(f"[orchestrator] the injection happened, but {fs_checks.shown(path)} could not record it "
              f"({fs_checks.errno_text(exc)})", file=sys.stderr)


# ---- the injection ------------------------------------------------------------------------------
def inject(ref: str, injection: Injection, refresh: Refresh | None = None) -> str:
    """Inject the failure into the run (or sweep point) and record it; the line to print.
    UsageError when refused, before anything is broken; once broken, it returns."""
    if refresh is None:
        from orchestrator.api import refresh_records  # the scheduler asked (SLURM)

        refresh = refresh_records
    target = find_target(ref, refresh, injection.flag)
    if target.state != State.RUNNING:  # before its files are read: a point not started has none
        raise UsageError(f"chaos refused: {target.name} is {target.state}, not RUNNING: chaos breaks a running job")
    payload, history = read_payload(target), read_history(target)
    why = refusal(target, payload, history, injection, os.geteuid())
    if why is not None:
        raise UsageError(f"chaos refused: {why}")
    if injection.action == "node-down":
        act = _node_down(target, history, injection.node or "")
    elif injection.action == SLOW:
        act = _slow_rank(target, payload, injection)
    else:
        act = _signal_rank(target, payload, injection.rank or 0, "KILL" if injection.action == "kill-rank" else "STOP")
    fd = open_log(target.folder)
    try:
        what, after = act()
        current = [a.number for a in history.attempts if a.outcome is None]
        attempt = current[-1] if current else max(target.record.attempts, len(history.attempts))
        record_entry(fd, target.folder / CHAOS_FILE, {"time": time.time(), "action": injection.action,
                                                      "target": what, "attempt": attempt})
    finally:
        os.close(fd)
    return (f"{target.name}: {injection.action} {what} (attempt {attempt}){after}; follow the recovery with "
            f"'orchestrator status {target.record.run_id}'")


Act = Callable[[], "tuple[str, str]"]


def _chaos(target: Target) -> SchedulerChaos:
    """What chaos asks of the run's scheduler (``ScheduledExecutor.chaos``)."""
    from orchestrator.backends.factory import scheduler

    return scheduler(target.record.executor).chaos()


def _job(target: Target) -> str:
    """The run's job as its scheduler reaches it (UsageError before it has one)."""
    if not target.job:
        raise UsageError(f"chaos refused: {target.name} has no job yet")
    return _chaos(target).job_id(target.job)


def _signal_rank(target: Target, payload: Payload, rank: int, name: str) -> Act:
    """What signals the rank, once every check passed (the rank recorded, its job's id)."""
    from orchestrator.node.chaos_node import signal_rank
    from orchestrator.node.stack_requests import rank_procs

    rp = rank_procs(target.folder).get(rank)
    if rp is None:
        raise UsageError(f"chaos refused: rank {rank} has not recorded itself yet (the job is starting): try again")
    where, job = f"rank {rank} on {rp.host}", _job(target) if target.scheduled else ""

    def act() -> tuple[str, str]:
        why = _chaos(target).signal(target.folder, job, payload.python, rp.host, rank, name) if target.scheduled \
            else signal_rank(target.folder, rank, name)
        if why:
            raise UsageError(f"chaos: {where} was not signalled: {why}")
        return where, ""
    return act


def _slow_rank(target: Target, payload: Payload, injection: Injection) -> Act:
    """What slows the rank: ``chaos_node ... SLOW`` on its node (through its scheduler, inside its
    job, on a cluster), left running in its own session for the injection's time; chaos returns
    once the node said the slow-down began (``SENT``)."""
    from orchestrator.core.interpreter import module_argv
    from orchestrator.node.stack_requests import rank_procs

    rank = injection.rank or 0
    rp = rank_procs(target.folder).get(rank)
    if rp is None:
        raise UsageError(f"chaos refused: rank {rank} has not recorded itself yet (the job is starting): try again")
    here_argv = module_argv(payload.python if target.scheduled else sys.executable,
                            "orchestrator.node.chaos_node", str(target.folder), str(rank), "SLOW",
                            f"{injection.factor:g}", f"{injection.seconds:g}", unbuffered=True)
    job = _job(target) if target.scheduled else ""

    def act() -> tuple[str, str]:
        import subprocess

        if job:  # on its node, in its job; it outlives this command (its own session)
            helper = _chaos(target).start(job, rp.host, here_argv)
        else:
            helper = subprocess.Popen(here_argv, env=dict(os.environ), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, start_new_session=True)
        assert helper.stdout is not None
        line = helper.stdout.readline().decode(errors="replace")  # SENT, or the end of its output
        if SENT not in line:
            helper.wait(timeout=SRUN_TIMEOUT_S)
            why = (helper.stderr.read().decode(errors="replace").strip() if helper.stderr else "") or "no answer"
            raise UsageError(f"chaos: rank {rank} on {rp.host} was not slowed: {' '.join(why.split())[:300]}")
        return (f"rank {rank} on {rp.host}", f", {injection.factor:g}x slower for {injection.seconds:g}s (a "
                f"SIGSTOP/SIGCONT duty cycle; it ends early if the rank does)")
    return act


def _node_down(target: Target, history: History, node: str) -> Act:
    """What sets the node DOWN, once it is the run's, its job's alone (``node_down_refusal``)."""
    nodes = history.attempts[-1].nodes if history.attempts else []
    if node not in nodes:
        raise UsageError(f"chaos refused: {node} is not one of the run's nodes now ({', '.join(nodes) or 'none yet'})")
    ours = _job(target)
    why = node_down_refusal(node, ours, "\n".join(_chaos(target).jobs_on(node)))
    if why is not None:
        raise UsageError(f"chaos refused: {why}")

    def act() -> tuple[str, str]:
        _chaos(target).set_down(node, f"orchestrator chaos on {target.record.run_id}")
        return f"node {node}", f"; {node} stays DOWN until resumed: scontrol update nodename={node} state=resume"
    return act
