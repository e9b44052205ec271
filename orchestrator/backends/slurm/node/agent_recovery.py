"""The SLURM job agent's attempts and recovery: each attempt recorded in <run>/recovery.json
(its start, and how it ended), the health gate before any rank starts, what a failure is blamed
on, and restart (a requeue without the blamed nodes) or stop by ``orchestrator.core.recovery.decide``.
Standard library only.
"""

from __future__ import annotations

import socket
import time
from typing import Iterable, Mapping

from orchestrator.core.lean_record import replace
from orchestrator.backends.slurm.node import slurm_controller
from orchestrator.backends.slurm.node.agent_gate import gate_verdict
from orchestrator.backends.slurm.node.agent_decisions import attempt_outcome, cancelled, failed_exit, hang_blamed, step_hosts
from orchestrator.backends.slurm.node.agent_stop import is_preemption
from orchestrator.backends.slurm.node.agent_requeue import SCONTROL_RETRY_S, Requeuer
from orchestrator.backends.slurm.node.agent_state import AgentContext, Phase, say
from orchestrator.core import rank_error
from orchestrator.core.interpreter import lean_module_argv
from orchestrator.core.recovery import HARDWARE_SIGNALS, Failure, decide
from orchestrator.core.run_folder import RunFolder
from orchestrator.core.states import Action, EndReason, FailureKind, Outcome
from orchestrator.backends.slurm.node.gate_step import DECIDE_WITHIN_S

#: The health gate's srun: the token wait (health.TOKEN_WAIT_S) and node_check (NODE_CHECK_TIMEOUT_S)
#: fit in it, and a node where the task cannot start is reported as not reporting. The same bound as
#: the gate's inside the ranks' step (``orchestrator.backends.slurm.node.gate_step``).
HEALTH_SRUN_TIMEOUT_S = DECIDE_WITHIN_S


class AgentRecovery:
    """One attempt's record, and what follows a failure."""

    def __init__(self, ctx: AgentContext, requeuer: Requeuer) -> None:
        self.ctx = ctx
        self.state = ctx.state
        self.requeuer = requeuer

    def begin_attempt(self) -> None:
        """Record this attempt's start, and the previous one's end if its agent never recorded it:
        then it died with the job, which SLURM ended for a lost node (NODE_FAIL, and requeued it,
        as --requeue asks) or killed outright."""
        c, history = self.ctx, self.ctx.history
        earlier = history.attempts[-1] if history.attempts else None
        if earlier is not None and earlier.job != c.job_id:  # another submission's: it ended however it did
            history.close_lost(f"job {earlier.job or '?'} ended without its agent recording how "
                               "(killed, or its node lost)")
        elif earlier is not None and earlier.outcome == Outcome.PREEMPTED and earlier.action != Action.REQUEUE:
            # Preempted, and SLURM requeued the job itself (PreemptMode=REQUEUE): a requeue, not a failure.
            history.finish(earlier, Outcome.PREEMPTED, earlier.why or "preempted; SLURM requeued the job",
                           action=Action.REQUEUE, progress=earlier.progress)
        elif earlier is not None and (earlier.ended is None or earlier.action not in (Action.RESTART, Action.REQUEUE)):
            # The same job runs again though its agent requeued nothing: SLURM did (a node failure
            # under --requeue; the agent was killed, or took the SIGTERM for a cancel, or its own
            # requeue came too late). The nodes it saw lost count, with those SLURM says are gone.
            gone = sorted(set(earlier.blamed) | (set(earlier.nodes) & slurm_controller.nodes_gone(earlier.nodes)))
            why = (f"node(s) {', '.join(gone)} failed and SLURM requeued the job" if gone else
                   "SLURM ended the attempt and requeued the job (a node failure)")
            c.say(f"attempt {earlier.number}: {why}")
            history.finish(earlier, Outcome.NODE_FAILURE, why, action=Action.RESTART, blamed=gone)
            limit = c.payload.recovery.max_restarts
            if limit and history.restarts() > limit:  # SLURM's requeue was one restart too many
                self.state.over_limit = (f"{why}; no restarts left ({history.restarts() - 1} of {limit} used; "
                                         "recovery.max_restarts)")
        number = earlier.number + 1 if earlier is not None else 1
        c.attempt = history.begin(number, c.slurm.hosts, c.payload.checkpoint.dir, job=c.job_id)

    def end_attempt(self, code: int | None) -> None:
        c, s = self.ctx, self.state
        if c.attempt is None or c.attempt.ended is not None:
            return
        outcome = attempt_outcome(was_cancelled=cancelled(s.stop), failure=s.failure.kind if s.failure else None,
                                  action=s.action, phase=s.phase,
                                  preempted=is_preemption(s.stop), code=code)
        why = s.failure.why if s.failure is not None else (s.not_requeued or s.requeued_why)
        try:
            c.history.finish(c.attempt, outcome, why, action=s.action, progress=c.attempt.progress,
                             blamed=s.failure.blamed if s.failure else sorted(s.lost_nodes))
        except OSError as exc:
            c.say(f"could not record the attempt in {c.history.path}: {exc}")

    def over_limit(self) -> int:
        """SLURM requeued the job after a node failure with no restart left: stop it."""
        from orchestrator.node import forensics

        s = self.state
        self.ctx.say(s.over_limit)
        s.failure = Failure(FailureKind.NODE_FAILURE, s.over_limit)
        s.action = Action.STOP
        forensics.write_end(self.ctx.run_dir, reason=EndReason.NODE_FAILURE, error=s.over_limit)
        return 1

    # -- the health gate, what a failure is blamed on, restart or stop --------------------------
    def health_gate(self, environ: dict[str, str]) -> Failure | None:
        """``orchestrator.node.health`` on every node (one srun task each) before any rank starts; the
        nodes that fail it, or never report, are the failure (unhealthy), blamed on them."""
        import json
        import shutil

        from orchestrator.backends.slurm.node import gate_step
        from orchestrator.node import health, shared_folders

        c = self.ctx
        assert c.attempt is not None
        number = c.attempt.number
        hosts = [h for h in c.slurm.hosts if h not in c.history.excluded] or list(c.slurm.hosts) or [socket.gethostname()]
        shutil.rmtree(health.health_dir(c.run_dir, number), ignore_errors=True)  # a resubmission's leftovers
        for line in shared_folders.write_agent_token(c.run_dir, c.payload.checkpoint.dir, number, health.this_node()):
            c.say(f"health gate: {line}")
        p = c.payload
        where = [f"--nodelist={','.join(hosts)}"] if set(hosts) != set(c.slurm.hosts) else []  # not an excluded one
        argv = ["srun", f"--nodes={len(hosts)}", f"--ntasks={len(hosts)}", "--ntasks-per-node=1", *where,
                "--kill-on-bad-exit=0", "--cpus-per-task=1",
                # never importing from the submit folder (a json.py), nor site's .pth files: the gate
                # is the standard library and this package (the agent's: it runs the same python)
                *lean_module_argv(p.python, "orchestrator.node.health", "--run-dir", c.run_dir, "--checkpoint-dir",
                                  p.checkpoint.dir, "--attempt", str(number), "--gpus", str(gate_step.gate_gpus(p)))]
        if p.interface:
            argv += ["--interface", p.interface]
        if p.recovery.node_check:
            argv += ["--node-check-json", json.dumps(list(p.recovery.node_check))]
        started = time.monotonic()
        answer = slurm_controller.run(argv, HEALTH_SRUN_TIMEOUT_S, backoff_s=(), env=environ, quiet_stdin=True,
                                      capture=False)
        if answer.returncode is None:
            c.say(f"health gate: srun did not finish ({answer.error})")
        return gate_verdict(c, number, hosts, time.monotonic() - started)

    def gate_failed(self, failure: Failure) -> int:
        """The health gate failed with too few healthy nodes in the job: recorded, then recovery."""
        from orchestrator.node import forensics

        c = self.ctx
        forensics.write_end(c.run_dir, reason=EndReason.UNHEALTHY, error=failure.why,
                            unhealthy=dict(c.attempt.health) if c.attempt is not None else {})
        self.state.failure = failure
        return self.recover(1)

    # -- the ranks' nodes inside the allocation (recovery.spares, recovery.in_allocation) ---------
    def allocation(self) -> tuple[str, ...]:
        """The job's nodes as the controller has them now (a node lost under --no-kill is gone from
        them); the ones the job started with when it does not answer."""
        c = self.ctx
        now = slurm_controller.controller_hosts(slurm_controller.show_job(c.job_id).get("NodeList", ""))
        return tuple(now) if now else c.slurm.hosts

    def choose_step(self, avoid: Iterable[str] = ()) -> tuple[str, ...] | None:
        """The ranks' nodes for this attempt (``ctx.step``): the first ``nodes`` healthy ones of the
        allocation, none excluded; None when the allocation has too few."""
        c = self.ctx
        step = step_hosts(c.slurm.hosts, set(c.history.excluded) | set(avoid), c.payload.nodes)
        if step is not None:
            c.step = step
            if c.attempt is not None and list(step) != c.attempt.nodes:
                c.attempt.nodes = list(step)
                c.history.save()
        return step

    def replace_unhealthy(self, failure: Failure) -> bool:
        """A gate that failed on spare capacity's worth of nodes: the ranks run on the healthy ones,
        and the unhealthy ones are given back. False: too few healthy nodes (recovery decides)."""
        c = self.ctx
        step = self.choose_step(failure.blamed)
        if step is None:
            return False
        if c.payload.recovery.exclude_failed_nodes:
            c.history.excluded = sorted(set(c.history.excluded) | set(failure.blamed))
            c.history.save()
        c.say(f"health gate: {', '.join(failure.blamed)} replaced by a spare; the ranks run on {','.join(step)}")
        self.release(failure.blamed)
        return True

    def release(self, nodes: Iterable[str]) -> None:
        """Give ``nodes`` back to SLURM (the batch host, where this agent runs, stays): the job pays
        for no node it will not use. A refusal (a site may disable shrinking: ``disable_job_shrink``,
        a job_submit hook) is said and changes nothing else: the job goes on holding the node."""
        c = self.ctx
        first = batch_host(c.slurm.hosts)
        drop = {n for n in nodes if n != first and n in c.slurm.hosts}
        if not drop:
            return
        keep = [h for h in c.slurm.hosts if h not in drop]
        folder = RunFolder.of(c.run_dir).slurm
        answer = slurm_controller.shrink_job(c.job_id, keep, SCONTROL_RETRY_S, cwd=str(folder) if folder.is_dir() else None)
        if not answer.ok:
            c.say(f"could not give {', '.join(sorted(drop))} back to SLURM: {answer.complaint}")
            return
        c.say(f"gave {', '.join(sorted(drop))} back to SLURM; the job holds {','.join(keep)}")
        c.slurm = replace(c.slurm, hosts=tuple(keep))

    def classify(self) -> Failure:
        """What ended the attempt, and the nodes it is blamed on: a lost node (srun's message, or
        SLURM's node state), a rank a hardware-like signal killed (its node), a hang (the
        straggler's node when its stack is not inside a collective); a traceback blames nothing."""
        from orchestrator.node import forensics

        c, s = self.ctx, self.state
        end = forensics.read_end(c.run_dir)
        error = end.error if end is not None else ""
        if s.phase is Phase.ENDING and end is not None and end.reason == EndReason.STRAGGLER:
            return Failure(FailureKind.STRAGGLER, error.splitlines()[0] if error else FailureKind.STRAGGLER.value,
                           (s.straggler_node,) if s.straggler_node else ())
        if s.phase is Phase.ENDING:
            rank, reason = (end.failed_rank, end.reason) if end is not None else (None, "no verdict recorded")
            blamed = hang_blamed(rank, c.rank_hosts, c.payload.ranks_per_node, s.straggler_outside)
            return Failure(FailureKind.HANG, error.splitlines()[0] if error else f"watchdog: {reason}", blamed)
        gone = s.lost_nodes | slurm_controller.nodes_gone(c.rank_hosts)
        if gone:
            return Failure(FailureKind.NODE_FAILURE, f"lost node(s) {', '.join(sorted(gone))}", tuple(sorted(gone)))
        if s.killed is not None:
            host, rank, what = s.killed
            return Failure(FailureKind.CRASH, f"rank {rank} on {host} was killed by a signal ({what})",
                           (host,) if what in HARDWARE_SIGNALS else ())
        err = rank_error.earliest(RunFolder.of(c.run_dir).error_files())
        if err is not None:
            return Failure(FailureKind.CRASH, err.headline())
        return Failure(FailureKind.CRASH, error.splitlines()[0] if error else (s.first_end or "a rank failed").strip())

    def _restart_inside(self, message: str, failure: Failure) -> bool:
        """Restart the ranks' step inside this job (recovery.in_allocation) when the allocation still
        has enough nodes once the blamed and lost ones are left out: the agent then runs the next
        attempt itself. False: too few (the job is requeued without them)."""
        c, s = self.ctx, self.state
        c.slurm = replace(c.slurm, hosts=self.allocation())
        # A lost node is gone either way; a blamed one is left out as recovery.exclude_failed_nodes says.
        blamed = set(failure.blamed) if c.payload.recovery.exclude_failed_nodes else set()
        avoid = set(c.history.excluded) | blamed | s.lost_nodes
        step = step_hosts(c.slurm.hosts, avoid, c.payload.nodes)
        if step is None:
            c.say(f"{message}; the job holds {len(set(c.slurm.hosts) - avoid)} healthy node(s) and needs "
                  f"{c.payload.nodes}: requeued instead of restarted inside it")
            return False
        s.enter(Phase.RESTARTING)
        s.action = Action.RESTART
        assert c.attempt is not None
        c.attempt.inside_job = True
        c.say(f"{message}; restarting the ranks inside job {c.job_id} on {','.join(step)} (no requeue)")
        self.release(avoid)
        return True

    def _partition_nodes(self) -> int | None:
        """How many nodes of the job's partition are not excluded (None: unknown)."""
        c = self.ctx
        job = slurm_controller.show_job(c.job_id)
        partition = job.get("Partition")
        if not partition:
            return None
        rows = slurm_controller.node_states(partition=partition)
        if rows is None:
            return None
        # Every node of the partition counts, whatever its state now: a drained or down node may come
        # back, and the job may wait for it. Only the excluded ones can never run it.
        excluded = set(c.history.excluded) | set(slurm_controller.controller_hosts(job.get("ExcNodeList", "")))
        return len({node for node, _ in rows} - excluded)

    def recover(self, code: int | None) -> int:
        """After a failure: restart (requeue without the blamed nodes) or stop, by the spec's
        ``recovery`` (``orchestrator.core.recovery.decide``). Returns the agent's exit code."""
        c, s = self.ctx, self.state
        assert s.failure is not None and c.attempt is not None
        failure, settings = s.failure, c.payload.recovery
        progressed = failure.kind != FailureKind.UNHEALTHY and c.history.progressed(c.attempt, c.payload.checkpoint.dir)
        c.attempt.progress = progressed
        available = self._partition_nodes() if settings.max_restarts and failure.blamed else None
        decision = decide(settings, c.history, failure, progressed, c.payload.nodes, available)
        failed_code = failed_exit(s.phase, code)
        if not decision.restart:
            s.action = Action.STOP
            if decision.message:
                c.say(decision.message)
            if decision.reason in (EndReason.NO_PROGRESS, EndReason.NOT_ENOUGH_NODES):
                from orchestrator.node import forensics

                forensics.write_end(c.run_dir, reason=decision.reason,
                                    error=f"{decision.message}; the last failure: {failure.why}")
            return failed_code
        excluded = sorted(set(c.history.excluded) | set(decision.exclude))
        c.history.excluded = excluded
        if settings.in_allocation and self._restart_inside(decision.message, failure):
            return 0
        c.say(decision.message)
        s.enter(Phase.REQUEUEING)
        s.action = Action.RESTART
        self.requeuer.scontrol_requeue(excluded if decision.exclude else None)
        if s.phase is not Phase.REQUEUED:
            s.action = Action.STOP
            from orchestrator.node import forensics

            forensics.write_end(c.run_dir, reason=failure.kind, error=f"{failure.why}; the restart failed: {s.not_requeued}")
            return failed_code
        return 0


def master_port(ctx: AgentContext, environ: Mapping[str, str]) -> int | None | bool:
    """An auto port checked before any rank starts: the batch script runs on the job's first
    node, which is the master's, so the agent binds the derived port there to see that it is
    free (another job sharing the node may hold it), else takes the next free one in the auto
    range, and hands it to every rank on its argv. None: nothing to check (a fixed port, or
    this is not the master's node); False: no free port, the job ends FAILED with the reason."""
    from orchestrator.core.rendezvous import PORT_BASE, PORT_SPAN, derive_port, pick_port

    if ctx.payload.port != "auto" or ctx.world <= 0:
        return None
    here = environ.get("SLURMD_NODENAME") or socket.gethostname()
    if ctx.rank_hosts and here != ctx.rank_hosts[0]:
        return None
    derived = derive_port(ctx.slurm.raw_job_id, ctx.slurm.attempt)
    port = pick_port(derived)
    if port is None:
        from orchestrator.node import forensics

        message = (f"no free port on {here} in the auto range {PORT_BASE}-{PORT_BASE + PORT_SPAN - 1} for the "
                   f"ranks' rendezvous; set distributed.port to a port you know is free there")
        say(message)
        forensics.write_end(ctx.run_dir, reason=EndReason.NO_PORT, error=message)
        return False
    if port != derived:
        say(f"port {derived} is in use on {here} (another job's?): the ranks rendezvous on {port}")
    return port


def batch_host(hosts: tuple[str, ...], environ: dict[str, str] | None = None) -> str:
    """The node this agent (the batch step) runs on, as SLURM names it (``SLURMD_NODENAME``), not
    assumed to be the first of the sorted host list (SLURM picks the batch host; a job given
    ``--nodelist`` in another order, or a resized one, may have it elsewhere). The first host only
    where SLURM did not say."""
    import os

    here = (os.environ if environ is None else environ).get("SLURMD_NODENAME", "")
    return here if here in hosts else (hosts[0] if hosts else "")

