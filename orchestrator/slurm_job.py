"""The job's agent on SLURM: ``python -m orchestrator.slurm_job RUN/payload.json [--point-base N]``.

It is the batch script's one command (standard library only). It starts the ranks with srun
(one task per rank, ``--kill-on-bad-exit``), and it alone receives the time-limit notice
(``#SBATCH --signal=B:SIG@margin``, ``slurm.signal``: USR2, or USR1 for Lightning): it forwards
it through srun to every rank, where the user's handlers or the rank API see it, and decides
about requeue by ``slurm.requeue``:

- ``always``: requeue once the ranks have ended after the notice, or when the margin is nearly
  spent (``requeue_deadline``), never in the middle of their clean-up; the script resumes from
  its own snapshot.
- ``auto``: requeue once srun has ended and the ranks stopped on a signal and checkpointed
  through the rank API (it writes ``ORCH_REQUEUE_MARKER``), unless the job was cancelled.
- ``never``: let the job end.

Requeues are bounded by ``slurm.max_requeues``; ``scontrol requeue`` is retried within a bound. A
stop that no requeue follows (``never``, no requeues left, scontrol refused) is not a completed
job: when the ranks ended because they were told to stop, the agent exits non-zero (FAILED, never
COMPLETED) and records why in end.json. scancel signals the ranks directly, as under plain
srun, and never leads to a requeue; ``orchestrator cancel`` leaves a request in the run folder
and signals the ranks' step only, and the agent scancels the job once the ranks ended,
``stop_grace_s`` ran out, or the ranks' stacks show that they never can end on their own
(``orchestrator.stop_judge``: every rank waits in a collective that cannot complete, as when a
SIGTERM handler's collective meets its peers' other one). A SIGTERM the controller says is a
preemption is a notice, not a cancel (``_term_is_preemption``). Being outside the job step,
the agent is not killed by ``--kill-on-bad-exit`` and decides once per attempt, in one place;
the decision never depends on what the entrypoint returns.

It is also the job's watchdog, with the local supervisor's rules (``orchestrator.watchdog``):
a rank that has not joined its process group within ``distributed.init_timeout_s``, or no rank
progressing for ``watchdog.stall_s``, ends the job FAILED once every rank's stacks are saved
(``srun --overlap`` runs ``orchestrator.stacks_probe`` on each node); so does a notice that no
requeue will follow, before it is forwarded. The verdict goes to ``<run>/end.json`` for status.
"""

from __future__ import annotations

import enum
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, Mapping

from orchestrator import container
from orchestrator.interpreter import module_argv
from orchestrator.payload import Payload
from orchestrator.rank_env import cpu_share, has_cpu_share_rule, resolve_cpu_share
from orchestrator.recovery import HARDWARE_SIGNALS, Attempt, Failure, History, decide
from orchestrator.run_folder import RunFolder, stop_flag_note
from orchestrator.slurm_task import SlurmJob, point_base

# The watchdog's modules (forensics, join_hook, stacks, watchdog) are imported at its first look,
# a second after srun started the ranks: the time to the ranks' first line is the job's start-up
# cost, and on a busy node these imports would compete with the ranks' own.
if TYPE_CHECKING:
    from orchestrator.stop_judge import StopJudge
    from orchestrator.watchdog import Watch

POLL_S = 0.2
LOOK_S = 1.0  # the watchdog reads the shared run folder: once a second
#: After a watchdog verdict (the stacks are saved): srun gets SIGTERM and forwards it; a rank still
#: alive this long after gets SIGKILL (scancel --signal=KILL reaches the job's steps, not this
#: agent), and srun this long after that: every rank is gone within ~10 s of the decision.
END_GRACE_S = 5.0
#: scontrol requeue is retried on failure (a controller restarting, a socket timeout), within a bound.
SCONTROL_BACKOFF_S = (1.0, 2.0, 4.0, 8.0)
SCONTROL_RETRY_S = 30.0
#: The agent's exit code for a job that stopped early and was not requeued (SLURM: FAILED).
UNFINISHED_EXIT = 3
#: The health gate's srun: the token wait (health.TOKEN_WAIT_S) and node_check (NODE_CHECK_TIMEOUT_S)
#: fit in it, and a node where the task cannot start is reported as not reporting.
HEALTH_SRUN_TIMEOUT_S = 150.0
#: srun's line about a node the step lost ("srun: error: Node failure on node2").
_NODE_FAILURE = re.compile(r"Node failure on (\S+)")
#: Node states (sinfo %t) that say a node is gone: down, drained or failing, not responding (*).
_NODE_GONE = re.compile(r"^(down|drain|drng|fail|failg|maint|boot|powered|pow_dn|npc)|\*$")
#: While the watchdog would give a verdict, the controller is asked at most this often whether the
#: job is (or was) suspended.
SUSPEND_CHECK_S = 5.0
#: Under ``always``, the requeue waits for the ranks' clean-up at most until this much of the
#: margin is left (scontrol and the controller need a moment before the time limit ends the job).
REQUEUE_RESERVE_S = 15.0


def requeue_deadline(notice_at: float, margin_s: float) -> float:
    """When a requeue under ``always`` stops waiting for the ranks to end: the margin minus a
    reserve for scontrol (half the margin, for short margins)."""
    return notice_at + max(0.0, margin_s - min(REQUEUE_RESERVE_S, margin_s / 2))


class Phase(enum.Enum):
    """Where one attempt of the agent stands. Every attempt starts RUNNING and makes at most one
    decision (``JobAgent._enter`` refuses any other move):

    RUNNING ─┬─> REQUEUEING ─┬─> REQUEUED       scontrol accepted; the next attempt is SLURM's
             │        ^      └─> NOT_REQUEUED   no requeue left, or scontrol refused
             └─> ENDING ┘                        the watchdog ended the ranks (init deadline, stall);
                                                 recovery may restart the job from there (a hang)

    A cancel (SIGTERM from scancel, or ``orchestrator cancel``'s request) is a fact the agent
    received, not a phase: from RUNNING it only rules out a requeue and a watchdog verdict. A
    SIGTERM that is a preemption (``preempted``) is a notice instead, like the time limit's."""

    RUNNING = "running"
    REQUEUEING = "requeueing"
    REQUEUED = "requeued"
    NOT_REQUEUED = "not_requeued"
    ENDING = "ending"


MOVES: dict[Phase, frozenset[Phase]] = {
    Phase.RUNNING: frozenset({Phase.REQUEUEING, Phase.ENDING}),
    Phase.REQUEUEING: frozenset({Phase.REQUEUED, Phase.NOT_REQUEUED}),
    Phase.REQUEUED: frozenset(), Phase.NOT_REQUEUED: frozenset(), Phase.ENDING: frozenset({Phase.REQUEUEING}),
}


#: How srun names a task that a signal ended (its ``strsignal``); an exit code is not one.
_SRUN_TASK_ENDED = re.compile(r"srun: error: (\S+): tasks? (\d+)(?:[-,][\d,-]*)?: (.+?)\s*$")


def srun_signal_death(line: str) -> tuple[str, int, str] | None:
    """(host, first task, description) from srun's line about tasks a signal ended, else None."""
    m = _SRUN_TASK_ENDED.search(line)
    if not m or m.group(3).startswith("Exited with exit code"):
        return None
    return m.group(1), int(m.group(2)), m.group(3)


def scontrol_job(job_id: str) -> dict[str, str]:
    """``scontrol show job -o`` as key=value pairs ({} when the controller does not answer in time)."""
    try:
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return dict(part.split("=", 1) for part in out.stdout.split() if "=" in part) if out.returncode == 0 else {}


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


def partition_preempt_mode(partition: str) -> str:
    """The partition's PreemptMode as the controller states it (REQUEUE, CANCEL, SUSPEND,GANG...;
    the cluster's default where the partition sets none); '' when it does not answer. For a job
    listed in several partitions, the first."""
    name = partition.split(",")[0]
    if not name:
        return ""
    try:
        out = subprocess.run(["scontrol", "show", "partition", "-o", name], capture_output=True, text=True,
                             timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    fields = dict(p.split("=", 1) for p in out.stdout.split() if "=" in p) if out.returncode == 0 else {}
    return fields.get("PreemptMode", "")


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


class JobAgent:
    def __init__(self, payload: Payload, environ: Mapping[str, str]) -> None:
        self.payload = payload
        self.slurm = SlurmJob.from_environ(environ)
        self.job_id = self.slurm.job_id
        self.restart = self.slurm.restart
        self.received: list[str] = []
        self.marker = self.slurm.requeue_marker(payload.run_dir)
        self.phase = Phase.RUNNING
        self.srun: subprocess.Popen | None = None
        self.run_dir = payload.run_dir
        self.stall_s = payload.watchdog.stall_s
        self.stacks_on_failure = payload.watchdog.stacks_on_failure
        self.world = payload.world_size
        self.environ = dict(environ)
        self.init_timeout_s = payload.init_timeout_s
        self.notice = signal.Signals[payload.stop_signal]  # the time limit's notice (slurm.signal)
        self.notice_at: float | None = None  # monotonic time it first came
        self.notice_pending = False  # stacks first, then the notice (a rank may end on it)
        self.not_requeued = ""  # why a requeue that was due did not happen (Phase.NOT_REQUEUED)
        self.started = time.time()
        self.watch: Watch | None = None
        top = RunFolder.of(payload.run_dir)  # a sweep point's folder is <run>/points/NNNN
        run = RunFolder(top.root.parent.parent) if top.root.parent.name == "points" else top
        self.cancel_request = run.cancel_request
        self.cancel_at: float | None = None  # monotonic time `orchestrator cancel` asked (its request file)
        self.stop_judge: StopJudge | None = None  # looks at the ranks' stacks while a cancel's stop is under way
        self.preempted: bool | None = None  # whether the SIGTERM that came is a preemption (asked once)
        self.term_at: float | None = None  # monotonic time SIGTERM first came
        self.first_end: str | None = None  # srun's line about the first task that ended badly
        self.killed: tuple[str, int, str] | None = None  # that task, if a signal ended it: host, rank, what
        self.lost_nodes: set[str] = set()  # nodes srun said the step lost ("Node failure on ...")
        self.history = History.load(payload.run_dir)  # every attempt of this run (orchestrator.recovery)
        self.attempt: Attempt | None = None
        self.failure: Failure | None = None  # what ended this attempt, for recovery.decide
        self.over_limit = ""  # SLURM requeued the job after a node failure with no restart left
        self.straggler_outside = False  # the watchdog's straggler was not inside a collective
        self.action = ""  # what this attempt led to: requeue (time limit), restart (a failure), stop
        self.preempt_mode = ""  # the preempting partition's PreemptMode, once a preemption is known
        self.requeued_why = ""  # why this attempt requeued the job (the time limit, a preemption)
        self.suspended_s = 0.0  # the job's time suspended so far (the watchdog's clock leaves it out)
        self.suspended_now = False
        self.suspend_checked = float("-inf")  # monotonic time the controller was last asked
        # Each rank's share of its node's granted CPUs, for a payload that carries it as a rule
        # (no slurm.cpus_per_task): srun's --cpus-per-task and the thread default.
        self.cpus_per_rank, self.cpus_from = cpu_share(environ, payload.ranks_per_node)

    def _on_signal(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        self.received.append(name)
        if signum == signal.SIGTERM and self.term_at is None:
            self.term_at = time.monotonic()  # a cancel or a preemption: _term_is_preemption tells
        if signum == self.notice:
            if self.notice_at is None:
                self.notice_at = time.monotonic()
            if self.srun is not None and self.srun.poll() is None:
                if self._stacks_before_notice():
                    self.notice_pending = True  # the loop captures the stacks, then forwards it
                else:
                    self.srun.send_signal(self.notice)  # srun forwards it to every task (rank)

    def _stacks_before_notice(self) -> bool:
        """A notice with no requeue to follow (slurm.requeue: never, or no requeues left) is the
        time limit ending the job: save where the ranks are first. ``auto`` may still requeue."""
        limit = self.payload.max_requeues
        return self.stacks_on_failure and (self.policy == "never" or self._requeues_used() >= limit)

    def run(self, srun_argv: list[str]) -> int:
        """One attempt, recorded in <run>/recovery.json however it ends."""
        for sig in (self.notice, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        RunFolder.of(self.run_dir).forget_attempt()
        self._begin_attempt()
        code: int | None = None
        try:
            code = self._run(srun_argv)
            return code
        finally:
            self._end_attempt(code)

    def _begin_attempt(self) -> None:
        """Record this attempt's start, and the previous one's end if its agent never recorded it:
        then it died with the job, which SLURM ended for a lost node (NODE_FAIL, and requeued it,
        as --requeue asks) or killed outright."""
        earlier = self.history.attempts[-1] if self.history.attempts else None
        if earlier is not None and earlier.job != self.job_id:  # another submission's: it ended however it did
            self.history.close_lost(f"job {earlier.job or '?'} ended without its agent recording how "
                                    "(killed, or its node lost)")
        elif earlier is not None and earlier.outcome == "preempted" and earlier.action != "requeue":
            # Preempted, and SLURM requeued the job itself (PreemptMode=REQUEUE): a requeue, not a failure.
            self.history.finish(earlier, "preempted", earlier.why or "preempted; SLURM requeued the job",
                                action="requeue", progress=earlier.progress)
        elif earlier is not None and (earlier.ended is None or earlier.action not in ("restart", "requeue")):
            # The same job runs again though its agent requeued nothing: SLURM did (a node failure
            # under --requeue; the agent was killed, or took the SIGTERM for a cancel, or its own
            # requeue came too late). The nodes it saw lost count, with those SLURM says are gone.
            gone = sorted(set(earlier.blamed) | (set(earlier.nodes) & self._nodes_gone(earlier.nodes)))
            why = (f"node(s) {', '.join(gone)} failed and SLURM requeued the job" if gone else
                   "SLURM ended the attempt and requeued the job (a node failure)")
            self._say(f"attempt {earlier.number}: {why}")
            self.history.finish(earlier, "node_failure", why, action="restart", blamed=gone)
            limit = self.payload.recovery.max_restarts
            if limit and self.history.restarts() > limit:  # SLURM's requeue was one restart too many
                self.over_limit = (f"{why}; no restarts left ({self.history.restarts() - 1} of {limit} used; "
                                   "recovery.max_restarts)")
        number = earlier.number + 1 if earlier is not None else 1
        self.attempt = self.history.begin(number, self.slurm.hosts, self.payload.checkpoint.dir, job=self.job_id)

    def _end_attempt(self, code: int | None) -> None:
        if self.attempt is None or self.attempt.ended is not None:
            return
        if self.cancel_at is not None or ("SIGTERM" in self.received and self.preempted is False):
            outcome = "cancelled"
        elif self.failure is not None and self.action in ("restart", "stop"):
            outcome = self.failure.kind
        elif self.phase is Phase.REQUEUED:
            outcome = "requeued"
        elif self.preempted:
            outcome = "preempted"
        elif code == 0:
            outcome = "completed"
        elif self.failure is not None:
            outcome = self.failure.kind
        elif code == UNFINISHED_EXIT:
            outcome = "not_requeued"
        else:
            outcome = "failed"
        why = self.failure.why if self.failure is not None else (self.not_requeued or self.requeued_why)
        try:
            self.history.finish(self.attempt, outcome, why, action=self.action, progress=self.attempt.progress,
                                blamed=self.failure.blamed if self.failure else sorted(self.lost_nodes))
        except OSError as exc:
            self._say(f"could not record the attempt in {self.history.path}: {exc}")

    def _run(self, srun_argv: list[str]) -> int:
        if self.over_limit:
            from orchestrator import forensics

            self._say(self.over_limit)
            self.failure = Failure("node_failure", self.over_limit)
            self.action = "stop"
            forensics.write_end(self.run_dir, reason="node_failure", error=self.over_limit)
            return 1
        if self.payload.recovery.health_check and self.world > 0:
            unhealthy = self._health_gate()
            if unhealthy is not None:
                self.failure = unhealthy
                return self._recover(1)
        port = self._master_port()
        if port is False:
            return 1
        if port is not None:
            srun_argv = [*srun_argv, "--master-port", str(port)]
        self.logs = ({r: self.slurm.rank_log(self.payload.rank_log, r) for r in range(self.world)}
                     if self.payload.rank_log else {})
        if any(has_cpu_share_rule(a) for a in srun_argv):
            srun_argv = [resolve_cpu_share(a, self.cpus_per_rank) for a in srun_argv]
            self._say(f"each rank gets {self.cpus_per_rank} CPU(s) ({self.cpus_from}; srun "
                      f"--cpus-per-task={self.cpus_per_rank})")
        self.started = time.time()
        # The job's variables reach srun, which starts every rank with them: those read when an
        # interpreter starts (PYTHONPATH, PYTHONHASHSEED, LD_PRELOAD...) take effect, as they would
        # exported in a hand-written batch script. The agent itself keeps its own environment.
        # srun's own messages (not the ranks' output, which goes to their logs) pass through the
        # agent, which reads which task a signal ended ("srun: error: node2: task 3: Killed").
        self.srun = subprocess.Popen(srun_argv, env=self.srun_environment(), stderr=subprocess.PIPE)
        relay = threading.Thread(target=self._relay_srun_messages, args=(self.srun.stderr,), daemon=True)
        relay.start()
        # Requeue while the job is still running, as soon as the evidence is there (SLURM then
        # ends the ranks that are still exiting); checked once more after srun, since every rank
        # may have ended before the loop looked.
        next_look = time.monotonic() + LOOK_S
        while (code := self.srun.poll()) is None:
            self._requeue_if_due(ranks_ended=False)
            if self.notice_pending:
                self.notice_pending = False
                dumps = self._capture(f"the time limit ({self.notice.name}) with no requeue left")
                if self.stacks_on_failure:
                    from orchestrator import forensics

                    forensics.write_end(self.run_dir, reason="time_limit", waits=forensics.waits_of(dumps))
                if self.srun.poll() is None:
                    self.srun.send_signal(self.notice)
            if self.cancel_at is not None and time.monotonic() >= self.cancel_at + self.payload.stop_grace_s:
                self._end_cancelled(f"the ranks did not end within stop_grace_s ({self.payload.stop_grace_s:g}s)")
            elif self.cancel_at is not None and self.cancel_at != float("inf"):
                self._end_cancelled_if_stuck()
            if self.phase is Phase.RUNNING and not self._stopping() and time.monotonic() >= next_look:
                next_look = time.monotonic() + LOOK_S
                if os.path.lexists(self.cancel_request):
                    self.cancel_at = time.monotonic()
                    self._say(f"orchestrator cancel: the ranks have stop_grace_s ({self.payload.stop_grace_s:g}s) "
                              "to checkpoint and exit")
                    continue
                if self._watchdog() is not None:
                    self._enter(Phase.ENDING)
                    self._end_ranks()
            time.sleep(POLL_S)
        relay.join(timeout=5)
        if self.cancel_at is None and os.path.lexists(self.cancel_request):
            self.cancel_at = time.monotonic()  # the ranks ended on the cancel's SIGTERM before a look saw it
        self._requeue_if_due(ranks_ended=True, work_done=code == 0 and self._finished_after_notice())
        if code != 0 and self.phase is Phase.RUNNING and not self._stopping():
            self._name_killed_rank()
        if (code != 0 or self.phase is Phase.ENDING) and self.phase in (Phase.RUNNING, Phase.ENDING) \
                and self.cancel_at is None and self.notice_at is None and not self._stopping():
            self.failure = self._classify()
            return self._recover(code)
        if self.cancel_at is not None:
            return self._end_cancelled("the ranks ended") if self.cancel_at != float("inf") else UNFINISHED_EXIT
        if code == 0 and self.phase is not Phase.ENDING:
            from orchestrator import forensics, join_hook
            from orchestrator.watchdog import did_nothing

            warning = did_nothing(self.world, [0], join_hook.joined_ranks(self.run_dir, self.world))
            if warning:
                forensics.write_end(self.run_dir, reason="did_nothing", warning=warning)
        if self.policy == "auto" and self.phase is Phase.RUNNING and self.notice_at is not None \
                and not (code == 0 and self._finished_after_notice()):
            what = "the preemption's SIGTERM" if self.preempted else self.notice.name
            self._say(f"{what} arrived but the ranks did not checkpoint through the rank API, so the job is "
                      "not requeued (slurm.requeue: auto); a script that resumes from its own snapshot "
                      "wants slurm.requeue: always")
        result = exit_code(self.phase, code, code == 0 and self._stopped_early())
        return self._unfinished() if result is None else result

    def srun_environment(self) -> dict[str, str]:
        """The environment of the agent's own sruns (the ranks', the health gate's): the job's, with
        the job's variables (a CPU share rule resolved: ``rank_env.cpu_share``), and:

        - ``SLURM_EXPORT_ENV=ALL``: on a site whose sbatch runs with ``--export=NONE``
          (``SBATCH_EXPORT``, a cli_filter) the batch step has ``SLURM_EXPORT_ENV=NONE``, which srun
          would inherit and start every rank without the job's ``env:``, its PATH and its Python;
        - no ``SLURM_CPUS_PER_GPU`` (``slurm.cpus_per_gpu``): these sruns give --cpus-per-task
          themselves, which an srun that also reads --cpus-per-gpu from its environment may refuse as
          mutually exclusive (the ranks' share already counts the per-GPU CPUs)."""
        env = {**self.environ, **{k: resolve_cpu_share(value, self.cpus_per_rank)
                                   for k, value in self.payload.env.items()}}
        env["SLURM_EXPORT_ENV"] = "ALL"
        env.pop("SLURM_CPUS_PER_GPU", None)
        return env

    def _enter(self, phase: Phase) -> None:
        if phase not in MOVES[self.phase]:
            raise RuntimeError(f"the job's agent cannot go from {self.phase.value} to {phase.value}")
        self.phase = phase

    def _master_port(self) -> int | None | bool:
        """An auto port checked before any rank starts: the batch script runs on the job's first
        node, which is the master's, so the agent binds the derived port there to see that it is
        free (another job sharing the node may hold it), else takes the next free one in the auto
        range, and hands it to every rank on its argv. None: nothing to check (a fixed port, or
        this is not the master's node); False: no free port, the job ends FAILED with the reason."""
        from orchestrator.rendezvous import PORT_BASE, PORT_SPAN, derive_port, pick_port

        if self.payload.port != "auto" or self.world <= 0:
            return None
        here = self.environ.get("SLURMD_NODENAME") or socket.gethostname()
        if self.slurm.hosts and here != self.slurm.hosts[0]:
            return None
        derived = derive_port(self.slurm.raw_job_id, self.restart)
        port = pick_port(derived)
        if port is None:
            from orchestrator import forensics

            message = (f"no free port on {here} in the auto range {PORT_BASE}-{PORT_BASE + PORT_SPAN - 1} for the "
                       f"ranks' rendezvous; set distributed.port to a port you know is free there")
            self._say(message)
            forensics.write_end(self.run_dir, reason="no_port", error=message)
            return False
        if port != derived:
            self._say(f"port {derived} is in use on {here} (another job's?): the ranks rendezvous on {port}")
        return port

    def _stopped_early(self) -> bool:
        """The ranks ended because they were told to stop, not because the work was done: the rank
        API checkpointed after a stop signal (its marker), or, under ``always``, a script that
        snapshots itself left on the time limit's notice."""
        return os.path.exists(self.marker) or (self.policy == "always" and self.notice_at is not None
                                                and not self._finished_after_notice())

    def _finished_after_notice(self) -> bool:
        """The ranks ended having finished their work, though a notice came: they listened for a
        stop through the rank API (``jobs.StopFlag``) and never stopped on one, and rank 0's
        entrypoint returned in this attempt (its result.json). A script that does not use the
        rank API gives no such evidence: under ``always`` it is requeued after the notice, and
        resumes from its own snapshot."""
        import json

        try:
            with open(stop_flag_note(self.marker), encoding="utf-8") as fh:
                listening = fh.read().strip() == "listening"
            with open(RunFolder.of(self.run_dir).result, encoding="utf-8") as fh:
                finished = json.load(fh).get("finished")
        except (OSError, ValueError, AttributeError):
            return False
        return (listening and isinstance(finished, (int, float)) and finished >= self.started
                and not os.path.exists(self.marker))

    def _unfinished(self) -> int:
        """A stop that no requeue follows is not a completed job: end non-zero (SLURM records
        FAILED, not COMPLETED) with the reason in end.json, which status shows."""
        from orchestrator import forensics

        why = self.not_requeued or f"slurm.requeue: {self.policy}"
        message = (f"the ranks stopped before their work was done (a stop signal, then a checkpoint) and the job "
                   f"was not requeued: {why}; submit the spec again to resume from the checkpoint")
        self._say(message)
        forensics.write_end(self.run_dir, reason="not_requeued", error=message)
        return UNFINISHED_EXIT

    def _relay_srun_messages(self, stream: IO[bytes] | None) -> None:
        if stream is None:
            return
        out = getattr(sys.stderr, "buffer", None)
        for line in stream:
            try:
                if out is not None:
                    out.write(line)
                    out.flush()
            except (OSError, ValueError):
                pass  # the batch log is gone: keep draining, or srun would block
            text = line.decode(errors="replace")
            lost = _NODE_FAILURE.search(text)
            if lost:
                self.lost_nodes.add(lost.group(1))
            if self.first_end is None and _SRUN_TASK_ENDED.search(text):
                # Only the first task to end is the suspect: srun kills the rest after it.
                self.first_end = text
                self.killed = srun_signal_death(text)

    def _name_killed_rank(self) -> None:
        """A rank ended by a signal leaves no traceback, and its peers then fail for want of it:
        name it (from srun's message) as the job's failure, unless it recorded an error itself."""
        if self.killed is None:
            return
        host, rank, what = self.killed
        if RunFolder.of(self.run_dir).error(rank).exists():
            return
        from orchestrator import forensics

        message = (f"rank {rank} on {host} was killed by a signal ({what}), with no traceback: the kernel's OOM "
                   "killer, a segfault in native code, or someone's kill; its peers failed after it")
        self._say(message)
        forensics.write_end(self.run_dir, reason="rank_killed", failed_rank=rank, error=message)

    def _stopping(self) -> bool:
        """Cancelled: by scancel (SIGTERM to this shell, not a preemption) or by ``orchestrator
        cancel`` (its request)."""
        return ("SIGTERM" in self.received and not self._term_is_preemption()) or self.cancel_at is not None

    def _term_is_preemption(self) -> bool:
        """SIGTERM to this shell is a scancel, the time limit, or a preemption (SLURM's GraceTime:
        SIGTERM first, then the job is requeued or cancelled). Asked once, of the controller: a
        preempted job has a PreemptTime (or is PREEMPTED already). A preempted job is handled as
        at the time-limit notice: requeued by slurm.requeue, never counted as a cancel. (SLURM
        22.05 signals only the job's steps on preemption, not this shell: then the ranks' end
        under ``always`` is when it is asked.)"""
        if self.preempted is None:
            job = scontrol_job(self.job_id)
            self.preempted = preempted(job)
            if self.preempted:
                self.notice_at = self.notice_at or self.term_at or time.monotonic()
                self.preempt_mode = partition_preempt_mode(job.get("Partition", ""))
                mode = f" (partition PreemptMode={self.preempt_mode})" if self.preempt_mode else ""
                self._say(f"job {self.job_id} is being preempted{mode} (SIGTERM, then SLURM's GraceTime): the ranks "
                          f"got SIGTERM; slurm.requeue: {self.policy} decides the requeue")
        return self.preempted

    def _end_cancelled_if_stuck(self) -> None:
        """While a cancel's stop is under way, look at the ranks' stacks now and then (``srun
        --overlap``, as the watchdog does); when every rank waits in a collective that cannot
        complete (``orchestrator.stop_judge``), end the ranks now, not after stop_grace_s: srun,
        sent SIGTERM, SIGKILLs its tasks at once ("forcing job termination"), as it would under a
        plain scancel while the job still runs. (A plain scancel here would not do: once the job is
        cancelled, slurmd ends its steps itself, SIGTERM then SIGKILL only after KillWait.) The
        loop then sees srun end and scancels the job (CANCELLED); end.json says why and where each
        rank waited, which status shows."""
        from orchestrator.stop_judge import StopJudge

        assert self.cancel_at is not None
        if self.stop_judge is None:
            self.stop_judge = StopJudge(self.cancel_at, self.world)
        if not self.stop_judge.due(time.monotonic()):
            return
        from orchestrator.stacks_probe import request_slurm

        asked = time.monotonic()
        dumps, _ = request_slurm(self.run_dir, self.job_id, self.payload.nodes, self.payload.python)
        stuck = self.stop_judge.look(asked, dumps)
        if stuck is None:
            return
        from orchestrator import forensics, stack_files

        message = stuck.message(self.payload.stop_grace_s)
        try:  # the job is ended all the same when the shared folder takes no more
            stack_files.save(self.run_dir, dumps, "stuck in collectives after the cancel's SIGTERM")
            forensics.write_end(self.run_dir, reason="cancelled", error=message, waits=stuck.waits)
        except OSError as exc:
            self._say(f"could not record why in {self.run_dir}: {exc}")
        self._say(f"orchestrator cancel: {message}")
        self._end_ranks()

    def _end_cancelled(self, why: str) -> int:
        """``orchestrator cancel`` asked, and the ranks ended (or their grace ran out): scancel this
        job, which SLURM records CANCELLED. If scancel fails, the job still never ends COMPLETED."""
        self._say(f"orchestrator cancel: {why}; scancel {self.job_id}")
        try:
            out = subprocess.run(["scancel", self.job_id], capture_output=True, text=True, timeout=SCONTROL_RETRY_S)
            problem = out.stderr.strip() if out.returncode else ""
        except (OSError, subprocess.TimeoutExpired) as exc:
            problem = str(exc)
        if problem:
            from orchestrator import forensics

            forensics.write_end(self.run_dir, reason="cancelled", error=f"cancelled; scancel failed: {problem}")
        self.cancel_at = float("inf")  # asked once; SLURM ends the job (and this agent) from here
        return UNFINISHED_EXIT

    def _requeue_if_due(self, ranks_ended: bool, work_done: bool = False) -> None:
        if self.phase is not Phase.RUNNING or self._stopping():  # scancel / orchestrator cancel: never
            return
        if ranks_ended and work_done and self.notice_at is not None:
            self._say(f"{self.notice.name} came, but the ranks finished their work before stopping for it "
                      "(the rank API's stop flag never stopped them): the job is complete, not requeued")
            return
        if ranks_ended and self.policy == "always" and self.notice_at is None:
            self._term_is_preemption()  # did the ranks end because the job is being preempted?
        due = (self.policy == "always" and self.notice_at is not None) or \
            (self.policy == "auto" and os.path.exists(self.marker))
        if due and os.path.lexists(self.cancel_request):  # the ranks checkpointed on a cancel's SIGTERM
            self.cancel_at = time.monotonic()
            return
        if self.policy == "always" and self.notice_at is not None:
            # Never in the middle of the ranks' clean-up (a requeue ends them at once): once srun has
            # ended, or when the margin is nearly spent.
            if ranks_ended or time.monotonic() >= requeue_deadline(self.notice_at, self.payload.signal_margin_s):
                self._requeue(f"{self.notice.name} (time limit or preemption), slurm.requeue: always"
                              + ("" if ranks_ended else "; the ranks had not ended with the margin nearly spent"))
        # The ranks may also have been signalled directly (scancel --signal=USR2 reaches the steps,
        # not this shell): the rank API's checkpoint marker is the evidence either way.
        elif self.policy == "auto" and os.path.exists(self.marker):
            self._requeue("the ranks stopped on a signal and checkpointed, slurm.requeue: auto")

    @property
    def policy(self) -> str:
        return self.payload.requeue

    def _requeue(self, why: str) -> None:
        """A requeue for the time limit or a preemption (slurm.requeue), bounded by slurm.max_requeues
        (recovery's restarts are counted apart)."""
        self._enter(Phase.REQUEUEING)
        limit, used = self.payload.max_requeues, self._requeues_used()
        if used >= limit:
            self.not_requeued = f"no requeues left ({used} of {limit} used; slurm.max_requeues)"
            self._say(f"{why}; {self.not_requeued}")
            self._enter(Phase.NOT_REQUEUED)
            return
        if self.preempted is None:  # SLURM 22.05 signals only the ranks' step on preemption: ask once
            self._term_is_preemption()
        if self.preempted and self.preempt_mode.startswith("CANCEL"):
            why = (f"preempted, under PreemptMode={self.preempt_mode}, with which SLURM would have ended the job: "
                   f"the agent requeued it itself ({why})")
        self._say(f"{why}: requeueing {self.job_id} (requeue {used + 1} of {limit})")
        self._scontrol_requeue()
        if self.phase is Phase.REQUEUED:
            self.action = "requeue"
            self.requeued_why = why

    def _requeues_used(self) -> int:
        """Time-limit and preemption requeues so far: SLURM's restart count less recovery's
        restarts (recorded in the history); never fewer than the history's own count."""
        return max(self.history.requeues(), self.restart - self.history.restarts())

    def _scontrol_requeue(self, exclude: list[str] | None = None) -> None:
        """``scontrol requeue``, retried within a bound; then, for a restart, the job's excluded
        nodes (ExcNodeList can only change while the job pends, which it does from the requeue
        until this agent has ended: the job is COMPLETING until then, so it cannot start yet)."""
        problem = ""
        deadline = time.monotonic() + SCONTROL_RETRY_S
        for delay in SCONTROL_BACKOFF_S:  # a busy or restarting controller answers a moment later
            try:
                out = subprocess.run(["scontrol", "requeue", self.job_id], capture_output=True, text=True,
                                     timeout=max(1.0, deadline - time.monotonic()))
            except (OSError, subprocess.TimeoutExpired) as exc:
                problem = str(exc)
            else:
                if out.returncode == 0:
                    self._enter(Phase.REQUEUED)
                    if exclude:
                        self._exclude(exclude)
                    return
                problem = out.stderr.strip() or f"exit code {out.returncode}"
            self._say(f"scontrol requeue {self.job_id} failed: {problem}")
            if time.monotonic() + delay >= deadline:
                break
            time.sleep(delay)
        self.not_requeued = f"scontrol requeue failed: {problem}"
        self._enter(Phase.NOT_REQUEUED)

    # -- recovery: the health gate, what a failure is blamed on, restart or stop ------------------
    def _health_gate(self) -> Failure | None:
        """``orchestrator.health`` on every node (one srun task each) before any rank starts; the
        nodes that fail it, or never report, are the failure (unhealthy), blamed on them."""
        import json
        import shutil

        from orchestrator import health

        assert self.attempt is not None
        number, hosts = self.attempt.number, self.slurm.hosts or [socket.gethostname()]
        shutil.rmtree(health.health_dir(self.run_dir, number), ignore_errors=True)  # a resubmission's leftovers
        p = self.payload
        gpus = p.ranks_per_node if p.backend == "nccl" and p.strategy == "ddp" else 0
        argv = ["srun", f"--nodes={len(hosts)}", f"--ntasks={len(hosts)}", "--ntasks-per-node=1",
                "--kill-on-bad-exit=0", "--cpus-per-task=1",  # never importing from the submit folder (a json.py)
                *module_argv(p.python, "orchestrator.health", "--run-dir", self.run_dir, "--checkpoint-dir",
                             p.checkpoint.dir, "--attempt", str(number), "--nodes", ",".join(hosts), "--gpus", str(gpus),
                             unbuffered=False)]
        if p.interface:
            argv += ["--interface", p.interface]
        if p.recovery.node_check:
            argv += ["--node-check-json", json.dumps(list(p.recovery.node_check))]
        started = time.monotonic()
        try:
            subprocess.run(argv, env=self.srun_environment(), stdin=subprocess.DEVNULL, timeout=HEALTH_SRUN_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self._say(f"health gate: srun did not finish ({exc})")
        bad = health.unhealthy(health.read_results(self.run_dir, number, hosts))
        shutil.rmtree(health.checkpoint_tokens(p.checkpoint.dir, number).parent, ignore_errors=True)
        self.attempt.health = bad
        if not bad:
            self._say(f"health gate: {len(hosts)} node(s) healthy in {time.monotonic() - started:.1f}s")
            return None
        why = "; ".join(f"{node}: {problem}" for node, problem in sorted(bad.items()))
        self._say(f"health gate: {why}")
        from orchestrator import forensics

        forensics.write_end(self.run_dir, reason="unhealthy", error=f"the health gate failed: {why}",
                            unhealthy=bad)
        return Failure("unhealthy", f"the health gate failed: {why}", tuple(sorted(bad)))

    def _nodes_gone(self, nodes: list[str]) -> set[str]:
        """Which of ``nodes`` SLURM says are down, drained, failing or not responding."""
        if not nodes:
            return set()
        try:
            out = subprocess.run(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %t"], capture_output=True,
                                 text=True, timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            return set()
        gone = set()
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and _NODE_GONE.search(parts[1]):
                gone.add(parts[0])
        return gone

    def _classify(self) -> Failure:
        """What ended the attempt, and the nodes it is blamed on: a lost node (srun's message, or
        SLURM's node state), a rank a hardware-like signal killed (its node), a hang (the
        straggler's node when its stack is not inside a collective); a traceback blames nothing."""
        from orchestrator import forensics

        end = forensics.read_end(self.run_dir) or {}
        error = str(end.get("error") or "")
        if self.phase is Phase.ENDING:
            rank = end.get("failed_rank")
            blamed: tuple[str, ...] = ()
            if isinstance(rank, int) and self.slurm.hosts and self.straggler_outside:
                blamed = (self.slurm.hosts[min(rank // max(1, self.payload.ranks_per_node), len(self.slurm.hosts) - 1)],)
            return Failure("hang", error.splitlines()[0] if error else f"watchdog: {end.get('reason')}", blamed)
        gone = self.lost_nodes | self._nodes_gone(self.slurm.hosts)
        if gone:
            return Failure("node_failure", f"lost node(s) {', '.join(sorted(gone))}", tuple(sorted(gone)))
        if self.killed is not None:
            host, rank, what = self.killed
            return Failure("crash", f"rank {rank} on {host} was killed by a signal ({what})",
                           (host,) if what in HARDWARE_SIGNALS else ())
        err = self._first_traceback()
        if err is not None:
            return Failure("crash", f"rank {err.get('rank')} raised {err.get('type')}: {err.get('message')}".splitlines()[0])
        return Failure("crash", error.splitlines()[0] if error else (self.first_end or "a rank failed").strip())

    def _first_traceback(self) -> dict | None:
        """The earliest error a rank of this attempt recorded (<run>/errors/rank-N.json)."""
        import json

        found = []
        for path in RunFolder.of(self.run_dir).error_files():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(data, dict):
                found.append(data)
        return min(found, key=lambda d: d.get("time") or 0) if found else None

    def _partition_nodes(self) -> int | None:
        """How many nodes of the job's partition are not excluded (None: unknown)."""
        job = scontrol_job(self.job_id)
        partition = job.get("Partition")
        if not partition:
            return None
        try:
            out = subprocess.run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N %t"], capture_output=True, text=True,
                                 timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            return None
        # Every node of the partition counts, whatever its state now: a drained or down node may come
        # back, and the job may wait for it. Only the excluded ones can never run it.
        nodes = {p[0] for p in (line.split() for line in out.stdout.splitlines()) if p}
        excluded = set(self.history.excluded) | set(_hostnames(job.get("ExcNodeList", "")))
        return len(nodes - excluded)

    def _recover(self, code: int | None) -> int:
        """After a failure: restart (requeue without the blamed nodes) or stop, by the spec's
        ``recovery`` (``orchestrator.recovery.decide``). Returns the agent's exit code."""
        assert self.failure is not None and self.attempt is not None
        failure, settings = self.failure, self.payload.recovery
        progressed = failure.kind != "unhealthy" and self.history.progressed(self.attempt, self.payload.checkpoint.dir)
        self.attempt.progress = progressed
        available = self._partition_nodes() if settings.max_restarts and failure.blamed else None
        decision = decide(settings, self.history, failure, progressed, self.payload.nodes, available)
        failed_code = 1 if self.phase is Phase.ENDING or code in (None, 0) else (code if code > 0 else 128 - code)
        if not decision.restart:
            self.action = "stop"
            if decision.message:
                self._say(decision.message)
            if decision.reason in ("no_progress", "not_enough_nodes"):
                from orchestrator import forensics

                forensics.write_end(self.run_dir, reason=decision.reason,
                                    error=f"{decision.message}; the last failure: {failure.why}")
            return failed_code
        self._say(decision.message)
        self._enter(Phase.REQUEUEING)
        self.action = "restart"
        excluded = sorted(set(self.history.excluded) | set(decision.exclude))
        self.history.excluded = excluded
        self._scontrol_requeue(excluded if decision.exclude else None)
        if self.phase is not Phase.REQUEUED:
            self.action = "stop"
            from orchestrator import forensics

            forensics.write_end(self.run_dir, reason=failure.kind, error=f"{failure.why}; the restart failed: {self.not_requeued}")
            return failed_code
        return 0

    def _exclude(self, nodes: list[str]) -> None:
        """Add ``nodes`` to the job's ExcNodeList (keeping what the spec's slurm.exclude named)."""
        job = scontrol_job(self.job_id)
        names = sorted(set(_hostnames(job.get("ExcNodeList", ""))) | set(nodes))
        try:
            out = subprocess.run(["scontrol", "update", f"JobId={self.job_id}", f"ExcNodeList={','.join(names)}"],
                                 capture_output=True, text=True, timeout=SCONTROL_RETRY_S)
            problem = out.stderr.strip() if out.returncode else ""
        except (OSError, subprocess.TimeoutExpired) as exc:
            problem = str(exc)
        self._say(f"the next attempt excludes {', '.join(names)}" if not problem else
                  f"could not exclude {', '.join(names)} from the next attempt: {problem}")

    # -- the watchdog: init deadline and stall, decided as locally (orchestrator.watchdog) --------
    def _watchdog(self) -> str | None:
        from orchestrator import forensics, join_hook
        from orchestrator.watchdog import Watch, judge

        if self.world <= 0:
            return None
        if self.watch is None:  # made at the first look, a second after srun: off the ranks' start-up
            self.watch = Watch(self.world, self.started, self.stall_s, self.init_timeout_s)
        elif self.watch.settled():
            return None
        forensics.look(self.watch, self.run_dir, self.logs)
        now = self._running_clock(time.time())
        if now is None:
            return None
        verdict = judge(self.watch, now, lambda: join_hook.calling_ranks(self.run_dir, self.world), self._capture)
        if verdict is None:
            return None
        self._verdict(verdict.reason, verdict.rank, verdict.message, dict(verdict.dumps))
        dump = verdict.dumps.get(verdict.rank) if verdict.rank is not None else None
        if dump:  # a straggler outside any collective is stuck on its own: recovery blames its node
            from orchestrator import stacks

            self.straggler_outside = stacks.where(dump).collective is None
        return verdict.reason

    def _running_clock(self, now: float) -> float | None:
        """The watchdog's clock: wall time less the time the job spent suspended, so that ranks
        SLURM only stopped (``scontrol suspend``, a SUSPEND,GANG preemption) are never called
        stalled or late to join for it. The controller is asked only when a verdict is near (at
        most every SUSPEND_CHECK_S): None while the job is suspended (no verdict now)."""
        assert self.watch is not None
        adjusted = now - self.suspended_s
        if not (self.watch.stalled(adjusted) or self.watch.never_joined(adjusted)):
            return adjusted
        if time.monotonic() < self.suspend_checked + SUSPEND_CHECK_S:
            return adjusted if not self.suspended_now else None
        self.suspend_checked = time.monotonic()
        job = scontrol_job(self.job_id)
        self.suspended_now = job.get("JobState") == "SUSPENDED"
        if self.suspended_now:
            return None
        total = suspended_s(job, now)
        if total is not None and total > self.suspended_s + 1.0:
            self._say(f"job {self.job_id} was suspended for {total - self.suspended_s:.0f}s: the watchdog's "
                      "clocks (stall_s, init_timeout_s) do not count it")
            self.suspended_s = total
        return now - self.suspended_s

    def _capture(self, reason: str, always: bool = False) -> dict[int, str]:
        """Every rank's stacks through ``srun --overlap`` (one probe per node), saved in
        <run>/stacks/."""
        if not (self.stacks_on_failure or always):
            return {}
        from orchestrator import stack_files
        from orchestrator.stacks_probe import request_slurm

        self._say(f"{reason}: saving every rank's stacks in {RunFolder.of(self.run_dir).stacks}")
        dumps, problem = request_slurm(self.run_dir, self.job_id, self.payload.nodes, self.payload.python)
        if problem:
            self._say(f"stacks: {problem.splitlines()[-1] if problem.splitlines() else problem}")
        if any(dumps.values()):
            stack_files.save(self.run_dir, dumps, reason)
        return dumps

    def _verdict(self, reason: str, rank: int | None, message: str, dumps: dict[int, str]) -> None:
        from orchestrator import forensics

        message = message.replace("<run>", self.run_dir)
        self._say(message)
        forensics.write_end(self.run_dir, reason=reason, failed_rank=rank, error=message,
                            waits=forensics.waits_of(dumps) if any(dumps.values()) else {})

    def _end_ranks(self) -> None:
        """Two tiers: SIGTERM through srun, then SIGKILL to every rank (a rank that handles or
        ignores SIGTERM, or is stuck, has END_GRACE_S); srun itself goes last."""
        assert self.srun is not None
        self.srun.send_signal(signal.SIGTERM)
        try:
            self.srun.wait(timeout=END_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            pass
        self._say(f"the ranks did not end within {END_GRACE_S:g}s of SIGTERM: SIGKILL")
        try:
            subprocess.run(["scancel", "--signal=KILL", self.job_id], capture_output=True, timeout=SCONTROL_RETRY_S)
        except (OSError, subprocess.TimeoutExpired):
            pass
        try:
            self.srun.wait(timeout=END_GRACE_S)
        except subprocess.TimeoutExpired:
            self.srun.kill()
            self.srun.wait(timeout=10)

    def _say(self, text: str) -> None:
        print(f"[launcher] {text}", file=sys.stderr, flush=True)


def _hostnames(hostlist: str) -> list[str]:
    """A SLURM hostlist ('node[1-3],gpu7') as names (``orchestrator.hostlist``); [] for '(null)' or
    none, and the text itself for one the parser refuses (the controller wrote it: it names hosts)."""
    from orchestrator.hostlist import expand

    if not hostlist or hostlist == "(null)":
        return []
    try:
        return expand(hostlist)
    except ValueError:
        return [hostlist]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m orchestrator.slurm_job PAYLOAD.json [--point-base N] (the batch script's command)",
              file=sys.stderr)
        return 2
    payload = Payload.load(SlurmJob.from_environ(os.environ).payload_path(args[0], point_base(args)))
    if not payload.srun:
        print(f"the payload {args[0]} was not planned for SLURM: plan and submit the job with --executor slurm",
              file=sys.stderr)
        return 2
    srun = list(payload.srun) + (["--point-base", str(point_base(args))] if point_base(args) else [])
    try:  # container.runtime oci: the run's bundle, with this run's mounts (orchestrator.container)
        container.prepare(payload)
    except OSError as exc:
        print(f"[agent] {exc}", file=sys.stderr)
        return 1
    return JobAgent(payload, os.environ).run(srun)


if __name__ == "__main__":
    sys.exit(main())
