"""The local supervisor: starts the ranks of one run (each sweep point in turn) through the
zygote, echoes their output, watches them, and records the end state.

Every rank is a child of one zygote process (see zygote.py): forked from it after it imported
torch, or exec'd as a fresh ``python -m orchestrator.node.launcher payload.json`` (the plan decides:
``LaunchPlan.rank_start``). Each rank leads its own session (so its DataLoader workers die with
it) and has exactly the environment the plan shows (``rank_env.rank_environment``). The first
rank to fail takes its siblings down (SIGTERM, then SIGKILL after a grace period) and the run is
recorded FAILED with that rank and its traceback. The zygote is a subreaper: whatever a rank
started, even in a new session, is stopped when the ranks are gone, before the end state is
recorded. The watchdog's judgement (init deadline, stall) is ``orchestrator.node.watchdog``'s; this
module only acts on it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from orchestrator.node import forensics, join_hook, stack_requests
from orchestrator.core import ownership, procs, progress, stack_files
from orchestrator.core.progress import NodePlace
from orchestrator.core.errors import SubmissionError
from orchestrator.executors.base import while_cancelled
from orchestrator.executors.console import LogTails
from orchestrator.backends.local.forked import ForkedRank, ZygoteGroup, builds_ddp, start_zygote
from orchestrator.backends.local.attempt import first_failure, health_gate, mark, rank_environments
from orchestrator.backends.local.survivors import Rejoins, kill_rank, replace, say
from orchestrator.plan import LaunchPlan
from orchestrator.core.rendezvous import remove_earlier_files
from orchestrator.core.attempt_logs import local_marker
from orchestrator.core.records import RunRecord, disk_trouble
from orchestrator.core.recovery import Attempt, Failure, History, decide
from orchestrator.core.run_folder import RunFolder
from orchestrator.core.states import Action, EndReason, FailureKind, Outcome, State, combine
from orchestrator.node.stop_judge import StopJudge
from orchestrator.node.straggler_watch import StragglerWatch
from orchestrator.node.watchdog import Watch, did_nothing, judge

#: After a failure or a watchdog verdict the other ranks are doomed: SIGTERM, then SIGKILL after
#: this. A stop the ranks should survive with a checkpoint (cancel, local.timeout_s) gets the
#: spec's stop_grace_s instead.
GRACE_S = 3.0
LOOK_S = 1.0  # how often the watchdog looks at the ranks' logs, heartbeats and joins
POLL_S = 0.1  # the supervisor shares the CPUs with the ranks: poll gently


class Supervisor:
    """Starts the ranks of one run (each sweep point in turn) and watches them."""

    def __init__(self, launch: LaunchPlan, record: RunRecord, lock: ownership.RunLock | None = None,
                 echo_factory: Callable[[], Callable[[int, str], None]] | None = None,
                 zygote: subprocess.Popen | None = None) -> None:
        # The echo (rich) is built after the ranks start, so its imports overlap theirs.
        self.launch, self.record, self.echo_factory = launch, record, echo_factory
        self.lock = lock  # the run folder's lock: held until the end state is recorded
        self._next_lease = 0.0
        self.group: ZygoteGroup | None = None
        self.preload = launch.rank_start == "fork"  # the plan decided, and says why
        self._zygote = zygote if self.preload else None
        if zygote is not None and not self.preload:
            zygote.kill()
            zygote.wait()
        self.echo: Callable[[int, str], None] | None = None
        self.procs: list[ForkedRank] = []
        self._cancelled = False
        self._hurry = False  # a second Ctrl-C: the ranks' stop_grace_s is cut short (SIGKILL now)
        self._signalled: int | None = None  # the signal that stopped the run (passed on at its end)
        self.end_recorded = True  # False once the end state could not be written (_record_end)
        self.timeout_s = launch.spec.local.timeout_s
        self.stall_s: float | None = launch.payload.watchdog.stall_s
        self.stacks_on_failure = launch.payload.watchdog.stacks_on_failure
        self.watch = Watch(0, time.time())
        self.stragglers = StragglerWatch(launch.payload, 0)
        self.failure: Failure | None = None  # what ended the attempt, for recovery.decide
        self.times: dict[str, float] = {}  # the attempt's moments (orchestrator.core.attempt_times)
        #: recovery.survivors: keep: this set's rejoins, and the callback that decides one (a new attempt)
        self.rejoins = Rejoins(launch.payload)
        self.rejoin: Callable[[Failure | None], bool] | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def run(self) -> RunRecord:
        """Run every point; the end state is recorded only after every rank is gone, so a
        caller that sees a terminal state never finds a rank still running. A signal that
        stopped the run is passed on to the caller's own handler once the end is recorded
        (``_pass_on_signal``)."""
        prev = self._handle_signals()  # first: from here on a signal stops the run in order
        state, error = State.FAILED, None
        try:
            try:
                me = os.getpid()
                self.record.update(state=State.RUNNING, supervisor_pid=me, supervisor_start=procs.start_time(me),
                                   host=ownership.this_host(), job_ids=self.record.job_ids or [f"local-{me}"])
                if self.lock is not None:
                    self.lock.renew()  # the lease names this process from now on
                state = self._run_points()
            except Exception as exc:
                state, error = State.FAILED, disk_trouble(exc, self.record.run_dir)
                if error is None:  # a bug, or a problem of the machine's: the caller sees it
                    error = f"{type(exc).__name__}: {exc}"
                    raise
                # The run folder's disk takes no more writes: the run cannot go on honestly (no
                # record, no logs, no checkpoints); its ranks are stopped below, and it ends FAILED.
                print(f"[orchestrator] {error}", file=sys.stderr, flush=True)
            finally:
                self._kill_all(grace=GRACE_S)
                if self.group is not None:  # the warm zygote kept for another attempt: no more
                    self.group.close()
                if self._zygote is not None:  # never used (e.g. a point failed to start)
                    self._zygote.kill()
                    self._zygote.wait()
                self._record_end(state, error)
        finally:  # only now: a second Ctrl-C never cuts the (bounded) clean-up and the end record short
            for s, handler in prev.items():
                signal.signal(s, handler)
        self._pass_on_signal(prev)
        return self.record

    def _run_points(self) -> State:
        """The run, or each point of its sweep in turn whatever the others' outcome, as a SLURM job
        array runs them; the run's state is the most telling of theirs (``states.combine``). A
        cancel starts no further point (those are CANCELLED). ``point_states`` says each point's
        state as it goes (``status`` shows them), and the error names the first point that failed."""
        if not self.launch.sweep:
            return State.CANCELLED if self._cancelled else self._run_point_recovering(None)
        count, ends = len(self.launch.sweep), dict[str, State]()
        first: tuple[int | None, str] | None = None  # the failed rank and error of the first point that failed
        for index, point in enumerate(self.launch.sweep):
            if self._cancelled:
                break
            self.record.update(point_states={**ends, **{str(i): State.RUNNING if i == index else State.PENDING
                                                       for i in range(index, count)}})
            ends[str(index)] = state = self._run_point_recovering(index)
            if state not in (State.COMPLETED, State.CANCELLED) and first is None:  # a cancel is no point's failure
                swept = ", ".join(f"{key}={point.args.get(key)}" for key in self.launch.spec.sweep)
                why = f": {self.record.error}" if self.record.error else ""
                first = self.record.failed_rank, f"point {index} ({swept}) ended {state}{why}"
        ends.update({str(i): State.CANCELLED for i in range(len(ends), count)})
        self.record.update(point_states=ends)
        if first is not None:
            self.record.update(failed_rank=first[0], error=first[1])
        return combine(list(ends.values()))

    def _pass_on_signal(self, prev: dict[int, Any]) -> None:
        """The signal that stopped the run was meant for this process: once the ranks are gone and
        the end is recorded, a handler the caller installed for it hears it (a local pipeline then
        starts no further stage; a script's own SIGTERM handler runs). Python's defaults are not
        given it: a foreground run's answer to Ctrl-C is its orderly end, CANCELLED, and the
        run's exit code is its outcome."""
        handler = prev.get(self._signalled) if self._signalled else None
        if callable(handler) and handler is not signal.default_int_handler:
            handler(self._signalled, None)

    def _handle_signals(self) -> dict[int, Any]:
        """SIGTERM, SIGINT and SIGHUP (the terminal or the ssh session closed) all stop the run in
        order, as a cancel does: never ranks left running without a supervisor. Only the main
        thread can install handlers; a run started from another thread is stopped through its
        cancel request (ownership.request_cancel), which needs no signal."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}

    def _record_end(self, state: State, error: str | None) -> None:
        """Record the end state, then give up the lock. A full disk must not turn into a traceback,
        nor lose the end: it is written over the record in place (``RunRecord.save``). Where even
        that fails (a read-only disk, no room) this process's record says FAILED, naming the disk
        (``end_recorded`` is False), and the free lock makes the end plain to the next look
        (``refresh_by_supervisor``: FAILED, never RUNNING)."""
        try:
            self.record.update(last=True, state=state, ended=time.time(), **({"error": error} if error else {}))
        except OSError as exc:
            self.end_recorded = False
            trouble = disk_trouble(exc, self.record.run_dir) or f"{exc.strerror or exc}"
            lost = f"; the run ended {state}, but that could not be recorded" if state != State.FAILED else ""
            self.record.state, self.record.ended = State.FAILED, time.time()
            prior = error or self.record.error
            self.record.error = f"{trouble}{lost}" + (f"\n{prior}" if prior and prior != trouble else "")
            print(f"[orchestrator] could not record the end state {state} in {self.record.path}: {trouble}; "
                  f"'orchestrator status {self.record.run_id}' reports it FAILED", file=sys.stderr, flush=True)
        finally:
            if self.lock is not None:
                self.lock.release()

    def _on_signal(self, signum: int, frame: object) -> None:
        self._hurry = self._hurry or (self._cancelled and signum == signal.SIGINT)
        self._cancelled = True
        self._signalled = self._signalled or signum

    def _run_point_recovering(self, index: int | None) -> State:
        """One point, its ranks restarted in place after a failure the spec's ``recovery`` covers
        (``orchestrator.core.recovery.decide``); every attempt is kept in <run>/recovery.json."""
        payload = self.launch.payload_for_point(index)
        history = History.load(payload.run_dir)
        history.close_lost("the supervisor of this attempt was killed before it recorded the end")
        rejoins = self.rejoins = Rejoins(payload)

        def begin(again: bool) -> Attempt:
            """The next attempt, in recovery.json (``again``: after one that ended here: the record counts it)."""
            if again:
                self.record.update(attempts=self.record.attempts + 1, failed_rank=None, error=None, waits={})
            began = history.begin(self.record.attempts, [socket.gethostname()], payload.checkpoint.dir)
            self.times, self.failure = began.times, None
            return began

        attempt = begin(again=False)

        def rejoin(failure: Failure | None) -> bool:
            """A rank failed while the others ran on (recovery.survivors: keep): when recovery
            allows a restart, the attempt ends here and the next one is its replacements
            rejoining the survivors."""
            nonlocal attempt
            mark(self.times, self.watch, rejoins, payload.run_dir)
            if failure is None or not rejoins.end_attempt(history, attempt, failure, self.times).restart:
                return False
            attempt = begin(again=True)
            return True

        self.rejoin = rejoin
        while True:
            state = self._run_point(index)
            mark(self.times, self.watch, rejoins, payload.run_dir)
            failure = self.failure
            if state != State.FAILED or failure is None or self._cancelled:
                history.finish(attempt, Outcome(state.lower()), self.record.error or "")
                return state
            progressed = rejoins.progressed(history, attempt, self.times)
            decision = decide(payload.recovery, history, failure, progressed)
            history.finish(attempt, failure.kind, failure.why, progress=progressed, blamed=failure.blamed,
                           action=Action.RESTART if decision.restart else Action.STOP)
            if decision.message:
                print(f"[orchestrator] {decision.message}", file=sys.stderr, flush=True)
            if not decision.restart:
                if decision.reason == EndReason.NO_PROGRESS:
                    self.record.update(error=f"{decision.message}\nthe last attempt's failure: {self.record.error}")
                return state
            attempt = begin(again=True)

    def _run_point(self, index: int | None) -> State:
        payload = self.launch.payload_for_point(index)
        run_dir = Path(payload.run_dir)
        folder = RunFolder(run_dir)
        folder.logs.mkdir(parents=True, exist_ok=True)
        payload_path = folder.payload if index is None else folder.point_payload
        payload.write(payload_path)
        attempt = self.record.attempts - 1
        remove_earlier_files(payload.rendezvous_dir, self.launch.run_id)  # an earlier attempt's, if it was killed
        port, envs = rank_environments(self.launch, payload, attempt)
        folder.forget_attempt()
        gate_from = time.monotonic()
        unhealthy = health_gate(payload, self.record.attempts)
        if payload.recovery.health_check:
            self.times["gate_s"] = round(time.monotonic() - gate_from, 3)
        if unhealthy is not None:
            self.record.update(failed_rank=None, error=unhealthy.why)
            self.failure = unhealthy
            return State.FAILED
        self.rejoins.reset()
        offsets, forks = [], []
        fresh = not self.preload
        ddp = not fresh and builds_ddp(payload.entrypoint, payload.framework)
        for rank, env in enumerate(envs):
            log_path = folder.log(rank)
            with open(log_path, "ab") as log:
                log.write(local_marker(self.record.attempts).encode())
                offsets.append(log.tell())  # echo from here: this attempt's output only
            forks.append({"rank": rank, "env": {**os.environ, **env}, "payload": str(payload_path), "log": str(log_path),
                          "fresh": fresh, "ddp": ddp})
        if self._cancelled:  # stopped while the attempt was being prepared: no rank starts
            return State.CANCELLED
        if self.group is None:  # the first attempt, or the last zygote was lost: a new one
            self.group = ZygoteGroup(self._zygote or start_zygote(self.preload))
            self._zygote = None
        group, tails = self.group, None
        try:
            began = time.time()  # before the forks: a rank may report before the last one is forked
            self.procs = group.start(forks)
            self.watch = Watch(len(self.procs), time.time(), self.stall_s, payload.init_timeout_s, reports_since=began)
            self.stragglers = StragglerWatch(payload, len(self.procs))  # recovery.on: [straggler]
            self.times["ranks_at"] = self.watch.started
            self.record.update(rank_pids=[p.pid for p in self.procs],
                               rank_starts=[procs.start_time(p.pid) or 0 for p in self.procs], master_port=port)
            if self.echo_factory and self.echo is None:
                self.echo = self.echo_factory()
            # the ranks' output, echoed: one reader for the attempt, rejoins included (each line once)
            tails = LogTails(run_dir, offsets, self.echo) if self.echo else None
            state = self._watch(run_dir, tails)
            while self.rejoins.lost and self.rejoin is not None and self.rejoin(self.failure):
                try:
                    lost = replace(self.rejoins, group, self.procs, forks, self.record.attempts)
                except SubmissionError as exc:  # the zygote is gone: this attempt fails, every rank restarts
                    self.times.setdefault("failed_at", time.time())
                    self.record.update(failed_rank=None, error=str(exc))
                    self.failure, self.rejoins.lost = Failure(FailureKind.CRASH, str(exc)), []
                    break
                self.times["ranks_at"] = self.rejoins.began_at or time.time()
                self.watch.restart(lost, self.times["ranks_at"])  # a new stall clock; the stand-ins are starting
                self.record.update(rank_pids=[p.pid for p in self.procs],
                                   rank_starts=[procs.start_time(p.pid) or 0 for p in self.procs])
                state = self._watch(run_dir, tails)
            if state == State.COMPLETED:
                warning = did_nothing(len(self.procs), [p.poll() for p in self.procs],
                                      join_hook.joined_ranks(run_dir, len(self.procs)))
                if warning:
                    self.record.update(warning=warning)
            else:  # when _watch saw it; now, for an end it did not mark
                self.times.setdefault("failed_at", time.time())
            return state
        finally:
            self._kill_all(grace=GRACE_S)
            if tails is not None:  # the ranks have ended: their last line too, if it had no newline
                tails.pump(final=True)
            if not group.end_set():  # closed: the next attempt, if any, starts a new zygote
                self.group = None
            remove_earlier_files(payload.rendezvous_dir, self.launch.run_id)
            # the heartbeats' node-local staging, should a rank have been killed before it left
            progress.clear_staging(payload.run_dir, attempt, {p.node for p in map(NodePlace.from_env, envs) if p})
            if group.leftovers:
                note = (f"[orchestrator] stopped {len(group.leftovers)} process(es) the ranks left running: "
                        f"pids {', '.join(map(str, group.leftovers[:10]))}")
                print(note, file=sys.stderr)
                try:  # a note beside the one on stderr: a full disk must not turn the outcome into its failure
                    with open(folder.leftovers_log, "a", encoding="utf-8") as fh:
                        fh.write(note + "\n")
                except OSError:
                    pass

    def _watch(self, run_dir: Path, tails: LogTails | None) -> State:
        start = time.monotonic()
        pump = tails.pump if tails is not None else lambda: None
        next_look = 0.0
        while True:
            pump()
            codes = [p.poll() for p in self.procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if self.group is not None and self.group.lost:
                self.times.setdefault("failed_at", time.time())  # teardown counts from here
                self._kill_all(grace=GRACE_S)
                # The subreaper that would have stopped what the ranks started is gone: stop what
                # is left in their sessions (their DataLoader workers, their children).
                for pid, start in zip(self.record.rank_pids, self.record.rank_starts):
                    procs.signal_session(pid, start, signal.SIGKILL)
                self.record.update(failed_rank=None, error=self.group.lost)
                self.failure = Failure(FailureKind.CRASH, self.group.lost)
                return State.CANCELLED if self._cancelled else State.FAILED
            stranded = None if failed else self.rejoins.stranded(codes)
            if stranded:
                self.times.setdefault("failed_at", time.time())
                say(stranded)
                self.record.update(failed_rank=None, error=stranded)
                self.failure = Failure(FailureKind.CRASH, stranded)
                self._kill_all(grace=GRACE_S)
                return State.FAILED
            if failed:
                self.times.setdefault("failed_at", time.time())  # teardown counts from here
                alive = self.group is not None and not self.group.lost  # a replacement is forked from it
                rejoin = self.rejoins.may_rejoin(failed, codes, self._cancelled, alive)
                if not (self._cancelled or rejoin):  # survivors kept: their stacks would only slow the rejoin
                    self._capture(run_dir, f"rank {failed[0]} ended with exit code {codes[failed[0]]}")
                rank, message = first_failure(failed, codes, run_dir, self.launch.payload.devices)
                self.record.update(failed_rank=rank, error=while_cancelled(message) if self._cancelled else message)
                self.failure = Failure(FailureKind.CRASH, (self.record.error or f"rank {rank} failed").splitlines()[0])
                if rejoin:
                    self.rejoins.lost = failed  # the survivors run on: _run_point decides
                    return State.FAILED
                self._kill_all(grace=GRACE_S)
                pump()
                return State.CANCELLED if self._cancelled else State.FAILED
            if all(c == 0 for c in codes):
                pump()
                return State.CANCELLED if self._cancelled else State.COMPLETED
            if self._cancelled:
                # SIGTERM first: the ranks checkpoint and stop together, within stop_grace_s,
                # unless their stacks show they never can (stuck in collectives)
                print(f"[orchestrator] stopping: SIGTERM to the ranks, which have stop_grace_s="
                      f"{self.launch.payload.stop_grace_s:g}s to end" + (" (Ctrl-C again: SIGKILL now)" if
                      self._signalled == signal.SIGINT else ""), file=sys.stderr, flush=True)
                self._kill_all(grace=self.launch.payload.stop_grace_s, judged_in=run_dir)
                pump()
                return State.CANCELLED
            if self.timeout_s and time.monotonic() - start > self.timeout_s:
                self.times.setdefault("failed_at", time.time())  # teardown counts from here
                self._capture(run_dir, f"local.timeout_s ({self.timeout_s:.0f}s) reached")
                self.record.update(error=f"local.timeout_s ({self.timeout_s:.0f}s) reached")
                self._kill_all(grace=self.launch.payload.stop_grace_s)  # as SLURM's time limit: TERM, KillWait, KILL
                return State.TIMEOUT
            if time.monotonic() >= next_look:  # the watchdog reads files: once a second is plenty
                self._look_at_requests()
                verdict, kind = self._watchdog(run_dir), FailureKind.HANG
                next_look = time.monotonic() + self.watch.next_look(time.time(), LOOK_S)  # or when stall_s runs out
                if verdict is None and (found := self.stragglers.look(run_dir, self.watch.started, time.time())):
                    verdict, kind = State.FAILED, FailureKind.STRAGGLER  # every rank restarts: a new process each
                    self.record.update(failed_rank=found.rank, error=self.stragglers.message(found))
                if verdict:
                    self.times.setdefault("failed_at", time.time())  # teardown counts from here
                    self.failure = Failure(kind, (self.record.error or verdict).splitlines()[0])
                    straggler = self.record.failed_rank
                    if kind is FailureKind.HANG and straggler is not None and self.rejoins.may_rejoin(
                            [straggler], codes, self._cancelled, self.group is not None and not self.group.lost):
                        # Only the straggler goes: its peers' collective then fails on the lost
                        # peer, and they rejoin its replacement (recovery.survivors: keep).
                        kill_rank(self.procs[straggler])
                        self.rejoins.lost = [straggler]
                        return verdict
                    self._kill_all(grace=GRACE_S)
                    pump()
                    return verdict
            time.sleep(POLL_S)

    def _look_at_requests(self) -> None:
        """Renew the lease other hosts judge liveness by, and take a cancel request from anyone."""
        if self.lock is not None and time.monotonic() >= self._next_lease:
            self._next_lease = time.monotonic() + ownership.LEASE_RENEW_S
            self.lock.renew()
        if ownership.cancel_requested(self.record.run_dir):
            self._cancelled = True

    # -- the watchdog ---------------------------------------------------------------------------
    def _watchdog(self, run_dir: Path) -> State | None:
        """The init deadline and the stall watchdog (orchestrator.node.watchdog.judge); FAILED, with
        the stacks saved, when either fires."""
        if self.watch.settled():
            return None
        logs = {r: RunFolder(run_dir).log(r) for r in range(len(self.procs))}
        forensics.look(self.watch, run_dir, logs)
        verdict = judge(self.watch, time.time(), lambda: join_hook.calling_ranks(run_dir, self.watch.world_size),
                        lambda reason, always: self._capture(run_dir, reason, always))
        if verdict is None:
            return None
        error = verdict.message.replace("<run>", str(run_dir))
        if verdict.reason == EndReason.STALL:
            error += f"\nstacks of every rank: {RunFolder(run_dir).stacks}"
        self.record.update(failed_rank=verdict.rank, error=error)
        return State.FAILED

    def _capture(self, run_dir: Path, reason: str, always: bool = False) -> dict[int, str]:
        """Save the stacks of the ranks still running (spec watchdog.stacks_on_failure) and record
        where each one was. ``always``: the stall watchdog needs them to name the straggler."""
        if not (self.stacks_on_failure or always):
            return {}
        alive = [r for r, p in enumerate(self.procs) if p.poll() is None]
        dumps = forensics.capture_local(run_dir, reason, alive) if alive else {}
        if dumps:
            self.record.update(waits=forensics.waits_of(dumps))
        return dumps

    def _kill_all(self, grace: float, judged_in: Path | None = None) -> None:
        """SIGTERM the sessions of the ranks still running, SIGKILL them after ``grace``. A rank
        the zygote has not reported as ended is its unreaped child, so its PID (and session id)
        cannot belong to anyone else; the sessions of ended ranks are the zygote's to clean.

        ``judged_in`` (a cancel's stop, the ranks' run folder): the grace is cut short once the
        ranks' stacks show that they can never end on their own (``orchestrator.node.stop_judge``:
        every rank waits in a collective that cannot complete, as when a SIGTERM handler's
        collective meets its peers' other one), as the SLURM job's agent does."""
        running = [p for p in self.procs if p.poll() is None]
        for p in running:
            p.signal(signal.SIGTERM)
        stop = StopJudge(time.monotonic(), len(self.procs)) if judged_in is not None and running else None
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.poll() is None for p in running) and not self._hurry:
            if stop is not None and judged_in is not None and stop.due(time.monotonic()) and \
                    self._stuck(judged_in, stop, grace):
                break
            time.sleep(POLL_S)
        for p in running:
            if p.poll() is None:
                p.signal(signal.SIGKILL)
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def _stuck(self, run_dir: Path, stop: StopJudge, grace: float) -> bool:
        """One look at every rank's stacks for the stop's judge; when it finds them stuck, the
        record says so (the error, where each rank waited) and the stacks are saved."""
        if any(p.poll() is not None for p in self.procs):
            stop.look(time.monotonic(), {})  # a rank has ended: the others may still follow it
            return False
        asked = time.monotonic()
        dumps = stack_requests.request_local(run_dir)
        stuck = stop.look(asked, dumps)
        if stuck is None:
            return False
        message = stuck.message(grace)
        print(f"[orchestrator] {message}", file=sys.stderr, flush=True)
        try:  # the ranks are ended all the same when the disk takes no more
            stack_files.save(run_dir, dumps, "stuck in collectives after the stop's SIGTERM")
        except OSError as exc:
            print(f"[orchestrator] the stacks were not saved: {exc}", file=sys.stderr, flush=True)
        self.record.update(error=message, waits=stuck.waits)
        return True
