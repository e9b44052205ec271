"""The job's agent on SLURM: ``python -m orchestrator.backends.slurm.node.slurm_job RUN/payload.json [--point-base N]``.

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
(``orchestrator.node.stop_judge``: every rank waits in a collective that cannot complete, as when a
SIGTERM handler's collective meets its peers' other one). A SIGTERM the controller says is a
preemption is a notice, not a cancel (``Requeuer.term_is_preemption``). Being outside the job step,
the agent is not killed by ``--kill-on-bad-exit`` and decides once per attempt, in one place;
the decision never depends on what the entrypoint returns.

It is also the job's watchdog, with the local supervisor's rules (``orchestrator.node.watchdog``):
a rank that has not joined its process group within ``distributed.init_timeout_s``, or no rank
progressing for ``watchdog.stall_s``, ends the job FAILED once every rank's stacks are saved
(``srun --overlap`` runs ``orchestrator.backends.slurm.node.stacks_probe`` on each node); so does a notice that no
requeue will follow, before it is forwarded. The verdict goes to ``<run>/end.json`` for status.

No rank's entrypoint starts before the health gate passed: inside the ranks' own step (each node's
first task checks it; ``agent_gate`` reads the verdicts and writes the decision every task waits
for), or, for a job holding spares or running its ranks in a container, as an srun step of its own
first (``AgentRecovery.health_gate``).

The loop is here (``JobAgent``: srun's lifecycle over one ``agent_state.AgentState``); the
decisions are pure functions (``agent_decisions``); the requeue and cancel protocol
(``agent_requeue``), the attempt's record and recovery (``agent_recovery``) and the watchdog
(``agent_watch``) are its parts; every SLURM command but the ranks' srun goes through
``slurm_controller``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Mapping

from orchestrator.core.lean_record import replace
from orchestrator.backends.slurm.node import gate_step
from orchestrator.node import container
from orchestrator.backends.slurm.node import slurm_controller
from orchestrator.backends.slurm.node.agent_decisions import (AUTO, UNFINISHED_EXIT, a_failure, attempt_in_job, exit_code,
                                                               grace_spent, notice_at, stacks_before_notice)
from orchestrator.backends.slurm.node.agent_srun_messages import name_killed_rank, relay_srun_messages
from orchestrator.backends.slurm.node.agent_gate import StepGate
from orchestrator.backends.slurm.node.agent_recovery import AgentRecovery, master_port
from orchestrator.backends.slurm.node.agent_requeue import SCONTROL_RETRY_S, Requeuer, wait_for_site_end
from orchestrator.backends.slurm.node.agent_standby import Standbys
from orchestrator.backends.slurm.node.agent_survivors import StandIns, exit_code_of
from orchestrator.backends.slurm.node.agent_warm_start import ForkedStep, forks_ranks, warm_up_once_training
from orchestrator.backends.slurm.node.agent_state import NOTICE_FACT, SIGTERM_FACT, AgentContext, AgentState, Phase, say
from orchestrator.backends.slurm.node.agent_stop import cancel_asked, cancel_requested, carried, is_preemption
from orchestrator.backends.slurm.node.agent_watch import AgentWatch
from orchestrator.core.payload import Payload
from orchestrator.node.rank_env import cpu_share, has_cpu_share_rule, resolve_cpu_share
from orchestrator.core.recovery import History
from orchestrator.core.run_folder import RunFolder
from orchestrator.backends.slurm.node.slurm_task import (ATTEMPT_VARIABLE, MASTER_PORT_OPTION, POINT_BASE_OPTION, SlurmJob,
                                                     expand_nodelist, point_base)
from orchestrator.core.states import EndReason

POLL_S = 0.2
LOOK_S = 1.0  # the watchdog reads the shared run folder: once a second
#: A gap this long between two turns of the loop (which sleeps POLL_S) means the agent was stopped:
#: SLURM suspended the job (``scontrol suspend``, SUSPEND,GANG preemption), so the watchdog asks.
STOPPED_GAP_S = 5.0
#: After a watchdog verdict (the stacks are saved): srun gets SIGTERM and forwards it; a rank still
#: alive this long after gets SIGKILL (scancel --signal=KILL reaches the job's steps, not this
#: agent), and srun this long after that: every rank is gone within ~10 s of the decision.
END_GRACE_S = 5.0


class JobAgent:
    """One attempt: srun's lifecycle and the loop over the agent's state (``AgentState``); the
    requeue and cancel protocol (``Requeuer``), the attempt's record and recovery
    (``AgentRecovery``) and the watchdog (``AgentWatch``) are its parts."""

    def __init__(self, payload: Payload, environ: Mapping[str, str], before: AgentState | None = None,
                 allocated: tuple[str, ...] | None = None, standbys: Standbys | None = None) -> None:
        self.payload = payload
        slurm = SlurmJob.from_environ(environ)
        #: The nodes sbatch allocated (the job's variables describe them); later attempts inside the job
        #: may hold fewer.
        self.allocated = slurm.hosts if allocated is None else allocated
        top = RunFolder.of(payload.run_dir)  # a sweep point's folder is <run>/points/NNNN
        run = RunFolder(top.root.parent.parent) if top.root.parent.name == "points" else top
        self.state = AgentState(started=time.time())
        if before is not None:  # the attempt before, inside this job: what it received goes on counting
            self.state.received = list(before.received)
            self.state.update_stop(lambda _: carried(before.stop, sigterm_came="SIGTERM" in before.received))
        self.ctx = AgentContext(payload, slurm, History.load(payload.run_dir), self.state,
                                slurm.requeue_marker(payload.run_dir), run.cancel_request,
                                signal.Signals[payload.stop_signal])
        self.requeuer = Requeuer(self.ctx)
        self.recovery = AgentRecovery(self.ctx, self.requeuer)
        self.watch: AgentWatch | None = None
        self.srun: subprocess.Popen | ForkedStep | None = None  # the ranks' step, or its ranks forked from standbys
        self.keep: StandIns | None = None  # recovery.survivors: keep: the ranks replaced beside the step
        #: The job's warm interpreters (``agent_standby``), kept across the attempts inside the job.
        self.standbys = Standbys() if standbys is None else standbys
        self.inside = before is not None  # an attempt after another inside this job: its ranks may be forked
        self.rank_argv: list[str] = []  # the ranks' srun as this attempt runs it (the standbys' options come from it)
        self.environ = dict(environ)
        # Each rank's share of its node's granted CPUs, for a payload that carries it as a rule
        # (no slurm.cpus_per_task): srun's --cpus-per-task and the thread default.
        self.cpus_per_rank, self.cpus_from = cpu_share(environ, payload.ranks_per_node)

    def _on_signal(self, signum: int, frame: object) -> None:
        s, notice = self.state, self.ctx.notice
        s.received.append(signal.Signals(signum).name)
        if signum == signal.SIGTERM:
            s.signalled(SIGTERM_FACT, time.monotonic())  # a cancel or a preemption: Requeuer.term_is_preemption tells
        if signum == notice:
            s.signalled(NOTICE_FACT, time.monotonic())
            if self.srun is not None and self.srun.poll() is None:
                if stacks_before_notice(self.payload.watchdog.stacks_on_failure, self.ctx.policy,
                                        self.requeuer.used(), self.payload.max_requeues):
                    s.notice_pending = True  # the loop captures the stacks, then forwards it
                else:
                    self.srun.send_signal(notice)  # srun forwards it to every task (rank)
                    if self.keep is not None:
                        self.keep.signal(notice)

    def run(self, srun_argv: list[str]) -> int:
        """One attempt, recorded in <run>/recovery.json however it ends."""
        for sig in (self.ctx.notice, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        RunFolder.of(self.payload.run_dir).forget_attempt()
        self.recovery.begin_attempt()
        c = self.ctx
        assert c.attempt is not None
        # Never below SLURM's count: a history that lost this job's first attempts must not give an
        # earlier attempt's number (its requeue marker, its port) again.
        c.slurm = replace(c.slurm, attempt=max(c.slurm.restart, attempt_in_job(
            (a.number for a in c.history.attempts if a.job == c.job_id), c.attempt.number)))
        c.marker = c.slurm.requeue_marker(c.run_dir)
        code: int | None = None
        try:
            code = self._run(srun_argv)
            return code
        finally:
            self._mark_attempt()
            self.recovery.end_attempt(code)

    def _mark_attempt(self) -> None:
        """The attempt's moments seen from here (``orchestrator.core.attempt_times``): when every rank
        joined, the rank API's first and last steps."""
        from orchestrator.core import attempt_times

        c = self.ctx
        if c.attempt is None or "ranks_at" not in c.attempt.times:
            return
        watch = self.watch.watch if self.watch is not None else None
        rejoined = self.keep is not None and self.keep.rejoins.began_at is not None  # the joins were the first group's
        if watch is not None and not rejoined:
            c.attempt.times.update(attempt_times.joined_at(watch.joined, c.world))
        if watch is not None:
            c.attempt.times.update(attempt_times.progress_at(watch))
        try:
            c.attempt.times.update(attempt_times.progress_marks(c.run_dir, c.world, c.attempt.times["ranks_at"]))
        except OSError:
            pass

    def _run(self, srun_argv: list[str]) -> int:
        s, p = self.state, self.payload
        if s.over_limit:
            return self.recovery.over_limit()
        c = self.ctx
        warm = self._warm_start()
        in_step = (not warm and c.world > 0 and bool(c.slurm.hosts)
                   and gate_step.runs_in_step(p, spares_held=len(c.slurm.hosts) > p.nodes))
        if p.recovery.health_check and c.world > 0 and not in_step and not warm:  # a step of its own first
            unhealthy = self.recovery.health_gate(self.srun_environment())
            if unhealthy is not None and not self.recovery.replace_unhealthy(unhealthy):
                return self.recovery.gate_failed(unhealthy)
        if c.world > 0:
            srun_argv = self._on_step_nodes(srun_argv)
        port = master_port(self.ctx, self.environ)
        if port is False:
            return 1
        if port is not None:
            srun_argv = [*srun_argv, MASTER_PORT_OPTION, str(port)]
        if any(has_cpu_share_rule(a) for a in srun_argv):
            srun_argv = [resolve_cpu_share(a, self.cpus_per_rank) for a in srun_argv]
            say(f"each rank gets {self.cpus_per_rank} CPU(s) ({self.cpus_from}; srun "
                f"--cpus-per-task={self.cpus_per_rank})")
        gate = StepGate(c, c.rank_hosts) if in_step else None
        self.rank_argv = srun_argv
        if p.recovery.survivors == "keep" and c.world > 0:
            self.keep = StandIns(c, srun_argv, self.srun_environment(), self.standbys)
        code = self._srun([*srun_argv, *gate.argv()] if gate is not None else srun_argv, gate, warm)
        if not cancel_asked(s.stop) and os.path.lexists(self.ctx.cancel_request):
            s.update_stop(lambda stop: cancel_requested(stop, time.monotonic()))  # the ranks ended on the cancel's SIGTERM before a look saw it
        if gate is not None and not gate.decided and not cancel_asked(s.stop) and "SIGTERM" not in s.received:
            gate.look(step_ended=True)  # the step ended before every node reported
        if gate is not None and gate.failure is not None and not cancel_asked(s.stop):
            # No spare to take a node's place (the gate runs inside the step only without spares):
            # recovery decides, as after a gate step of its own.
            return self.recovery.gate_failed(gate.failure)
        return self._after_srun(code)

    def _on_step_nodes(self, srun_argv: list[str]) -> list[str]:
        """The ranks' srun on the step's nodes (``AgentRecovery.choose_step``): named, with the task
        counts, whenever they are not the whole allocation as sbatch made it (spares held, a node
        given back or lost), since srun would otherwise spread the job's task count over them all."""
        c = self.ctx
        if not c.slurm.hosts:  # SLURM named no nodes: nothing to choose from
            return srun_argv
        step = c.step or self.recovery.choose_step()
        if step is None:
            say(f"the job holds {len(c.slurm.hosts)} usable node(s) of the {c.payload.nodes} the ranks need; "
                "srun runs on the whole allocation")
            return srun_argv
        if step == self.allocated:  # the allocation as sbatch made it: srun's defaults are the job's
            return srun_argv
        return [srun_argv[0], f"--nodes={len(step)}", f"--ntasks={c.world}", f"--nodelist={','.join(step)}",
                *srun_argv[1:]]

    def allocation_environ(self) -> dict[str, str]:
        """The agent's environment with the job's nodes as they are now (a node given back, or lost
        under --no-kill): what the next attempt inside this job starts from."""
        env = dict(self.environ)
        hosts = self.ctx.slurm.hosts
        if hosts and hosts != tuple(expand_nodelist(env.get("SLURM_JOB_NODELIST", ""))):
            for name in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
                env[name] = ",".join(hosts)
            for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
                env[name] = str(len(hosts))
        return env

    def _warm_start(self) -> bool:
        """Whether this attempt's ranks are forked from the job's standbys (``agent_warm_start``)."""
        c = self.ctx
        if not self.inside or c.world <= 0 or not c.slurm.hosts or not self.standbys.by_host:
            return False
        return forks_ranks(c, self.standbys, c.step or self.recovery.choose_step())

    def _srun(self, srun_argv: list[str], gate: StepGate | None = None, warm: bool = False) -> int:
        """Start the ranks and watch them until srun ends: its exit code. With the health gate in
        the step (``gate``), the watchdog's clock starts once the gate let the entrypoints start;
        ``warm``: the ranks are forked from the job's standbys (``agent_warm_start``), no step."""
        s, p = self.state, self.payload
        logs = {r: self.ctx.slurm.rank_log(p.rank_log, r) for r in range(self.ctx.world)} if p.rank_log else {}
        self.watch = AgentWatch(self.ctx, logs)
        s.started = time.time()
        if self.ctx.attempt is not None:
            self.ctx.attempt.times["ranks_at"] = s.started
        # The job's variables reach srun, which starts every rank with them: those read when an
        # interpreter starts (PYTHONPATH, PYTHONHASHSEED, LD_PRELOAD...) take effect, as they would
        # exported in a hand-written batch script. The agent itself keeps its own environment.
        # srun's own messages (not the ranks' output, which goes to their logs) pass through the
        # agent, which reads which task a signal ended ("srun: error: node2: task 3: Killed").
        self.srun = None
        if warm:
            try:
                self.srun = ForkedStep(self.ctx, self.standbys, srun_argv, self.srun_environment(),
                                       kill_on_bad_exit=p.recovery.survivors != "keep")
            except OSError as exc:
                say(f"the ranks start as a new step: {exc}")
        if self.srun is None:
            self.srun = subprocess.Popen(srun_argv, env=self.srun_environment(), stderr=subprocess.PIPE)
        relay = threading.Thread(target=relay_srun_messages, args=(self.srun.stderr, s), daemon=True)
        relay.start()
        # Requeue while the job is still running, as soon as the evidence is there (SLURM then
        # ends the ranks that are still exiting); checked once more after srun, since every rank
        # may have ended before the loop looked.
        next_look, last = time.monotonic() + LOOK_S, time.monotonic()
        while (code := self.srun.poll()) is None or (self.keep is not None and self.keep.running()):
            if time.monotonic() - last > STOPPED_GAP_S:  # this loop was stopped: the job was suspended
                s.stopped_seen = True
            last = time.monotonic()
            gating = gate is not None and not gate.decided
            if gating and gate is not None and gate.look() and gate.failure is None:
                gating = False
                s.started = time.time()  # the entrypoints start now: the init deadline counts from here
                if self.ctx.attempt is not None:
                    self.ctx.attempt.times["ranks_at"] = s.started
                next_look = time.monotonic() + LOOK_S
            self.requeuer.if_due(ranks_ended=False)
            if s.notice_pending:
                s.notice_pending = False
                self.watch.time_limit_stacks()
                if self.srun.poll() is None:
                    self.srun.send_signal(self.ctx.notice)
                if self.keep is not None:
                    self.keep.signal(self.ctx.notice)
            if grace_spent(s.stop, time.monotonic(), p.stop_grace_s):
                self.requeuer.end_cancelled(f"the ranks did not end within stop_grace_s ({p.stop_grace_s:g}s)")
            elif cancel_asked(s.stop) and s.stop is not None and not s.stop.sent and self.watch.stuck_after_cancel():
                self._end_ranks()
            running = s.phase is Phase.RUNNING and not self.requeuer.stopping() and not gating and not cancel_asked(s.stop)
            if running and self.keep is not None and not self.keep.given_up and self.keep.failed(code):
                self._rejoin(self.keep.failed(code))
            elif running:
                warm_up_once_training(self.ctx, self.standbys, self.rank_argv, self.srun_environment, self.watch.watch)
            if s.phase is Phase.RUNNING and not self.requeuer.stopping() and not gating and time.monotonic() >= next_look:
                next_look = time.monotonic() + LOOK_S
                if os.path.lexists(self.ctx.cancel_request):
                    s.update_stop(lambda stop: cancel_requested(stop, time.monotonic()))
                    say(f"orchestrator cancel: the ranks have stop_grace_s ({p.stop_grace_s:g}s) "
                        "to checkpoint and exit")
                    continue
                verdict = self.watch.look() or self.watch.straggler()
                next_look = time.monotonic() + self.watch.next_look_s(LOOK_S)  # or when stall_s runs out
                if verdict is not None:
                    if self.keep is not None and not self.keep.given_up \
                            and self.keep.end_straggler(slow=verdict == EndReason.STRAGGLER):
                        next_look = time.monotonic() + LOOK_S  # the straggler alone goes; its peers rejoin
                        continue
                    if self.ctx.attempt is not None:
                        self.ctx.attempt.times["failed_at"] = time.time()
                    s.enter(Phase.ENDING)
                    self._end_ranks()
            time.sleep(min(POLL_S, max(0.005, gate.wait_s())) if gating and gate is not None else POLL_S)
        relay.join(timeout=5)
        if self.keep is None:
            return code
        if not self.keep.given_up and self.keep.rejoins.began_at is None and self.keep.failed(code):
            say(f"rank(s) {', '.join(map(str, self.keep.failed(code)))} failed and the ranks' step ended before a "
                "rejoin could begin: every rank restarts")
        return exit_code_of(code, self.keep.codes(code), bool(self.keep.steps))

    def _rejoin(self, failed: list[int]) -> None:
        """Ranks failed while the others run on (recovery.survivors: keep): when recovery allows
        it, this attempt ends as a restart, the next begins, and the lost ranks start again beside
        the survivors (``agent_survivors``); else every rank ends, as --kill-on-bad-exit would."""
        c, keep = self.ctx, self.keep
        assert keep is not None and c.attempt is not None
        codes = keep.codes(None)
        keep.rejoins.lost = failed
        if keep.rejoins.may_rejoin(failed, codes, False, True):
            c.attempt.times.setdefault("failed_at", time.time())
            self._mark_attempt()
            c.attempt.inside_job = True  # recorded with the restart: no requeue (History.restarts_by_requeue)
            failure = keep.failure(failed, codes)  # before a lost node's ranks move to a spare: it names the node
            if keep.move_off_lost_nodes(failed) and \
                    keep.rejoins.end_attempt(c.history, c.attempt, failure, c.attempt.times).restart:
                self.recovery.begin_attempt()
                assert c.attempt is not None
                c.attempt.nodes = list(c.rank_hosts)  # the ranks' nodes, a spare in a lost one's place
                c.history.save()
                self.state.first_end = self.state.killed = None  # the next failure is the next attempt's
                self.state.straggler_node = None
                lost = keep.replace(c.attempt.number)
                c.attempt.times["ranks_at"] = keep.rejoins.began_at or time.time()
                if self.watch is not None:
                    self.watch.restart(lost, c.attempt.times["ranks_at"])  # a new stall clock, new straggler looks
                return
            c.attempt.inside_job = False
        keep.given_up = True
        say(f"rank(s) {', '.join(map(str, failed))} failed and cannot rejoin the others: every rank ends")
        self._end_ranks()

    def _after_srun(self, code: int) -> int:
        """The attempt's end, once srun has: a requeue still due, a failure to recover from, a
        cancel to finish, or the exit code SLURM records."""
        s, rq = self.state, self.requeuer
        rq.if_due(ranks_ended=True, work_done=code == 0 and rq.finished_after_notice())
        if code != 0 and s.phase is Phase.RUNNING and not rq.stopping():
            name_killed_rank(self.ctx)
        if a_failure(code, s.phase, cancel_asked(s.stop) or rq.stopping(), notice_at(s.stop)):
            if self.ctx.attempt is not None:
                self.ctx.attempt.times.setdefault("failed_at", time.time())
            s.failure = self.recovery.classify()
            return self.recovery.recover(code)
        if s.stop is not None and cancel_asked(s.stop):
            return rq.end_cancelled("the ranks ended") if not s.stop.sent else UNFINISHED_EXIT
        if code == 0 and s.phase is not Phase.ENDING:
            from orchestrator.node import forensics, join_hook
            from orchestrator.node.watchdog import did_nothing

            warning = did_nothing(self.ctx.world, [0], join_hook.joined_ranks(self.payload.run_dir, self.ctx.world))
            if warning:
                forensics.write_end(self.payload.run_dir, reason=EndReason.DID_NOTHING, warning=warning)
        if self.ctx.policy == AUTO and s.phase is Phase.RUNNING and notice_at(s.stop) is not None \
                and not (code == 0 and rq.finished_after_notice()):
            what = "the preemption's SIGTERM" if is_preemption(s.stop) else self.ctx.notice.name
            say(f"{what} arrived but the ranks did not checkpoint through the rank API, so the job is "
                "not requeued (slurm.requeue: auto); a script that resumes from its own snapshot "
                "wants slurm.requeue: always")
        result = exit_code(s.phase, code, code == 0 and rq.stopped_early())
        return rq.unfinished() if result is None else result

    def srun_environment(self) -> dict[str, str]:
        """The environment of the agent's own sruns (the ranks', the health gate's): the job's, with
        the job's variables (a CPU share rule resolved: ``rank_env.cpu_share``), and:

        - ``SLURM_EXPORT_ENV=ALL``: on a site whose sbatch runs with ``--export=NONE``
          (``SBATCH_EXPORT``, a cli_filter) the batch step has ``SLURM_EXPORT_ENV=NONE``, which srun
          would inherit and start every rank without the job's ``env:``, its PATH and its Python;
        - no ``SLURM_CPUS_PER_GPU`` (``slurm.cpus_per_gpu``): these sruns give --cpus-per-task
          themselves, which an srun that also reads --cpus-per-gpu from its environment may refuse as
          mutually exclusive (the ranks' share already counts the per-GPU CPUs)."""
        env = {**self.allocation_environ(), **{k: resolve_cpu_share(value, self.cpus_per_rank)
                                   for k, value in self.payload.env.items()}}
        env["SLURM_EXPORT_ENV"] = "ALL"
        env.pop("SLURM_CPUS_PER_GPU", None)
        env[ATTEMPT_VARIABLE] = str(self.ctx.slurm.attempt)  # the ranks' attempt in this job (SlurmJob.attempt)
        return env

    def _end_ranks(self) -> None:
        """Two tiers: SIGTERM through srun, then SIGKILL to every rank (a rank that handles or
        ignores SIGTERM, or is stuck, has END_GRACE_S); srun itself goes last."""
        assert self.srun is not None
        self.srun.send_signal(signal.SIGTERM)
        if self.keep is not None:
            self.keep.end(END_GRACE_S)
        try:
            self.srun.wait(timeout=END_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            pass
        if isinstance(self.srun, ForkedStep):  # no step to scancel: the standbys SIGKILL their ranks
            say(f"the ranks did not end within {END_GRACE_S:g}s of SIGTERM: SIGKILL")
            self.srun.kill()
            self.srun.wait(timeout=END_GRACE_S * 2)
            return
        # The ranks' step only (every numbered step of the job: ours), never the job: a bare
        # SIGKILL through scancel cancels the job, this agent included, and nothing restarts.
        steps = slurm_controller.running_steps(self.ctx.slurm.raw_job_id, SCONTROL_RETRY_S) or []
        say(f"the ranks did not end within {END_GRACE_S:g}s of SIGTERM: SIGKILL to step(s) "
            f"{', '.join(steps) or '(none listed)'} of job {self.ctx.job_id}")
        if steps:
            slurm_controller.scancel("--signal=KILL", *steps, timeout_s=SCONTROL_RETRY_S)
        self.standbys.drop()  # their steps were among those: the next attempt starts a new step
        try:
            self.srun.wait(timeout=END_GRACE_S)
        except subprocess.TimeoutExpired:
            self.srun.kill()
            self.srun.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m orchestrator.backends.slurm.node.slurm_job PAYLOAD.json [--point-base N] (the batch script's command)",
              file=sys.stderr)
        return 2
    payload = Payload.load(SlurmJob.from_environ(os.environ).payload_path(args[0], point_base(args)))
    if not payload.srun:
        print(f"the payload {args[0]} was not planned for SLURM: plan and submit the job with --executor slurm",
              file=sys.stderr)
        return 2
    srun = list(payload.srun) + ([POINT_BASE_OPTION, str(point_base(args))] if point_base(args) else [])
    try:  # container.runtime oci: the run's bundle, with this run's mounts (orchestrator.node.container)
        container.prepare(payload)
    except OSError as exc:
        print(f"[agent] {exc}", file=sys.stderr)
        return 1
    environ: dict[str, str] = dict(os.environ)
    before: AgentState | None = None
    allocated: tuple[str, ...] | None = None
    standbys = Standbys()  # the job's warm interpreters, across its attempts
    try:
        while True:  # one attempt each; recovery.in_allocation restarts the ranks' step here, in the same job
            agent = JobAgent(payload, environ, before, allocated, standbys)
            code = agent.run(srun)
            if agent.state.phase is not Phase.RESTARTING:
                standbys.close()  # before waiting for the site's end: nothing of ours outlives the ranks
                if agent.requeuer.site_ends_it():
                    job = agent.ctx.job_id  # SLURM records PREEMPTED, as the site's policy says
                    wait_for_site_end(say, lambda: slurm_controller.show_job(job).get("JobState", ""))
                return code
            environ, before, allocated = agent.allocation_environ(), agent.state, agent.allocated
    finally:
        standbys.close()


if __name__ == "__main__":
    sys.exit(main())
