"""SLURM executor: sbatch through submitit (``orchestrator.backends.slurm.submitit_adapter``, the one module
that touches submitit), with a fresh submitit executor for every submission.

The sbatch script submitit writes is the one ``plan`` rendered: same parameters, same folder
(``<run_dir>/slurm``). A sweep is one job array (split at MaxArraySize). Status for any number
of runs is one ``sacct`` call; SLURM's states are kept distinct (see STATE_MAP).

A cluster without accounting (no slurmdbd: sacct answers "Slurm accounting storage is disabled",
or there is no sacct) is supported: that is noticed once per process and cluster, and status is
then one ``squeue -t all`` call, which knows a job until MinJobAge after its end. A job neither
knows any more gets its end from what its agent recorded in the run folder (``end_from_agent``):
never COMPLETED unless the agent recorded that, and UNKNOWN, with the reason, when it recorded
nothing.
"""

from __future__ import annotations

import contextlib
import io
import os
import pwd
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from orchestrator.core import ownership
from orchestrator.backends.slurm import submitit_adapter
from orchestrator.spec.after import dependency_options, resolve, slurm_dependencies
from orchestrator.spec.validators import printable
from orchestrator.core.errors import SubmissionError
from orchestrator.executors.base import (CANCEL_SLACK_S, first_error, prepare_attempt, rename_aside, stop_grace_s,
                                         while_cancelled)
from orchestrator.backends.slurm.slurm_env import check_submission_env, clean_submission_env, script_options
from orchestrator.plan import LaunchPlan
from orchestrator.core.records import RunRecord, point_dir
from orchestrator.executors.previous_attempt import PreviousAttempt
from orchestrator.core.run_folder import RunFolder
from orchestrator.backends.slurm.node.slurm_controller import check_slurm_conf, controller_problem, one_line
from orchestrator.backends.slurm.node.slurm_controller import run as run_slurm
from orchestrator.backends.slurm.slurm_checks import parse_config
from orchestrator.backends.slurm.slurm_plan import array_chunks, job_command
from orchestrator.backends.slurm.slurm_status import (  # noqa: F401  (re-exported: the status half of this executor)
    ACCOUNTING_OFF, ACCOUNTING_DISABLED, OUTCOME_STATE, STATE_MAP, UNKNOWN_END, pairs, queue_states,
    sacct_rows, accounting_off, agent_end, end_from_agent, expand_array_id, map_state, sacct_states,
    sacct_unusable, squeue_states)
from orchestrator.core.states import PRIORITY, State, combine  # noqa: F401  (PRIORITY re-exported)

if TYPE_CHECKING:
    from orchestrator.backends.slurm.chaos_slurm import SlurmChaos
    from orchestrator.spec.models import JobSpec
from orchestrator.executors.scheduler_pacing import (  # noqa: F401  (re-exported: the names callers knew here)
    WATCHED_POINTS, SchedulerPacing, file_stat, folder_news)

# ---- waiting on the scheduler politely: orchestrator.executors.scheduler_pacing (re-exported here) ----


def rotate_folder(folder: Path) -> Path | None:
    """Job ids restart at 1 on a rebuilt cluster; never let a new job meet an old job's files.
    Where the old files went (None: there were none)."""
    return rename_aside(folder) if folder.is_dir() and any(folder.iterdir()) else None


#: How long past stop_grace_s a cancel waits for the job's agent to end the job itself before it
#: scancels the job plainly (the agent looks once a second; srun and scancel take a moment).
AGENT_ACT_S = 15.0
#: sbatch's answers that do not say which field the cluster cannot satisfy.
_UNSATISFIABLE = ("Requested node configuration is not available", "Invalid node name specified",
                  "Invalid generic resource")


# check_slurm_conf and controller_problem: orchestrator.backends.slurm.node.slurm_controller (re-exported here).


def _scancel(*args: str, quiet: bool = False) -> None:
    out = run_slurm(["scancel", *args])
    if out.returncode is None and not quiet:
        raise SubmissionError(f"scancel could not run ({out.error}); run this on a SLURM login node")
    if out.problem and not quiet:
        raise SubmissionError(out.problem)


def max_array_size() -> int:
    """The cluster's MaxArraySize (array task ids must stay below it)."""
    out = run_slurm(["scontrol", "show", "config"])
    if out.returncode is None:
        raise SubmissionError(f"cannot ask the cluster for its MaxArraySize ({out.error}); submit from a SLURM "
                              "login node with SLURM_CONF set")
    if out.problem:
        raise SubmissionError(out.problem)
    return parse_config(out.stdout).max_array_size


class SlurmExecutor:
    def submit(self, launch: LaunchPlan, after: Sequence[tuple[str, Sequence[str]]] = ()) -> RunRecord:
        """sbatch through submitit, with the script the plan rendered: the batch script runs the
        job's agent, which runs one srun task per rank on a payload file (no pickled callable). A sweep is one array per
        chunk of MaxArraySize; each array task finds its point's payload by its task id.

        ``after``: (when, job ids) the job also waits for (``orchestrator.front.pipeline``'s edges); the
        spec's own ``after:`` runs are resolved here from their records. Both become one
        ``--dependency`` with ``--kill-on-invalid-dep=yes``, known only now, so added at submission."""
        if launch.submitit is None:
            raise SubmissionError("this plan was not made for the slurm executor; plan it with --executor slurm")
        submitit_adapter.check_version()  # before a run folder is made
        check_slurm_conf()
        check_submission_env()  # SLURM_CLUSTERS, SBATCH_CONTAINER: refused before anything is written
        extra = self.dependency(launch, after)
        created = not os.path.lexists(launch.run_dir)  # a first submission that sbatch refuses leaves no folder
        record, lock, previous = prepare_attempt(launch, self.refresh)  # a job that ended unasked: asked again
        with lock:  # until the scheduler has the job: then the job is the live attempt
            return self._submit_locked(launch, record, previous, extra, created)

    def dependency(self, launch: LaunchPlan, after: Sequence[tuple[str, Sequence[str]]] = ()) -> dict[str, str]:
        """The sbatch options for what the job waits for (``orchestrator.spec.after``); {} for nothing."""
        entries = launch.spec.after
        parents = resolve(entries, "slurm", self._refresh_slurm, launch.run_id) if entries else []
        return dependency_options([*after, *slurm_dependencies(parents)])

    def _refresh_slurm(self, records: list[RunRecord]) -> list[RunRecord]:
        slurm = [r for r in records if r.executor == "slurm"]
        fresh = {r.run_dir: r for r in (self.refresh(slurm) if slurm else [])}
        return [fresh.get(r.run_dir, r) for r in records]

    def _submit_locked(self, launch: LaunchPlan, record: RunRecord, previous: PreviousAttempt,
                       extra: dict[str, str] | None = None, created: bool = False) -> RunRecord:
        """sbatch, once the run folder holds the new attempt. Refused, the run is left as it was
        before the submission, and the error says why once: a resubmission's previous attempt is
        put back (a COMPLETED run stays COMPLETED, its result and logs with it), and a first
        submission leaves no run (its folder goes when this submission ``created`` it), as any
        start that is refused. The chunks of a sweep that sbatch had already taken are cancelled."""
        job_ids: list[str] = []  # each chunk's, as sbatch takes it
        try:
            _sbatch(launch, previous, extra, job_ids)
        except Exception:
            previous.restore()
            if created:
                shutil.rmtree(launch.run_dir, ignore_errors=True)
            raise
        previous.drop()
        return record.update(state=State.PENDING, job_ids=job_ids)

    def refresh(self, records: list[RunRecord]) -> list[RunRecord]:
        """The records of runs not ended, refreshed with one scheduler query for all of them (two
        when accounting has not heard of a new job yet); a job the scheduler no longer knows (no
        accounting, and past MinJobAge) takes its end from its agent's record (``agent_end``)."""
        states = sacct_states([j for r in records if not r.state.terminal for j in r.job_ids])
        return [rec if rec.state.terminal else _refreshed(rec, states) for rec in records]

    def cancel(self, record: RunRecord, timeout_s: float | None = None) -> RunRecord:
        """Stop the job with the ranks' stop_grace_s, then return only when the scheduler no longer
        lists it (not even COMPLETING).

        A cancel request in the run folder tells the job's agent that this SIGTERM is a cancel (not
        a preemption: no requeue); ``scancel --signal=TERM`` reaches the ranks' step only, so
        srun stays up while the ranks checkpoint. The agent then scancels its own job once srun
        has ended, or after stop_grace_s (SLURM records CANCELLED). A job still pending, and an
        agent that did not act within the grace, get a plain scancel (SLURM's KillWait)."""
        record = RunRecord.load(record.run_dir)
        bases = sorted({j.split("_")[0] for j in record.job_ids})
        if not bases or record.state.terminal:
            return record
        grace = stop_grace_s(record.run_dir)
        timeout_s = grace + CANCEL_SLACK_S + 60.0 if timeout_s is None else timeout_s
        ownership.request_cancel(record.run_dir, "orchestrator cancel")
        _scancel("--state=PENDING", *bases)  # nothing to stop gracefully in a job that never started
        _scancel("--signal=TERM", *bases, quiet=True)  # refused once nothing runs: the plain scancel ends it
        deadline = time.monotonic() + timeout_s
        hard_at = time.monotonic() + grace + AGENT_ACT_S
        hard = False
        # One squeue call a question: at once, then 1 s after each change (paced up to 5 s while
        # nothing changes), and 0.5 s after the job's agent records the attempt's end in the run
        # folder (looked at every 0.25 s: a few stat calls).
        pacing = SchedulerPacing(first_s=1.0, most_s=5.0, soon_s=0.5)
        seen = folder_news(record)
        while (now := time.monotonic()) < deadline:
            news = folder_news(record)
            if news != seen:
                seen = news
                pacing.folder_changed(now)
            if pacing.due(now) or (not hard and now >= hard_at):
                states = queue_states(bases)
                if states == []:  # the scheduler no longer lists the job
                    break
                if not hard and (now >= hard_at or "RUNNING" not in (states or ())):
                    _scancel(*bases)
                    hard = True
                pacing.answered(time.monotonic(), tuple(sorted(set(states or ["?"]))))
            time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
        return self.refresh([RunRecord.load(record.run_dir)])[0]

    # ---- what only a scheduler answers (executors.base.ScheduledExecutor) ----------------------
    def queued(self, jobs: Sequence[str]) -> set[str]:
        """The jobs (array ids without the task) SLURM still lists as pending, running, suspended or
        completing."""
        if not jobs:
            return set()
        return {job.split("_")[0] for job in squeue_states(list(jobs), every_state=False)}

    def array_limit(self) -> int:
        return max_array_size()

    def check_against_cluster(self, spec: JobSpec) -> None:
        from orchestrator.backends.slurm.slurm_checks import check_against_cluster

        check_against_cluster(spec)

    def live_stacks(self, record: RunRecord, folder: Path, ranks: list[int] | None,
                    timeout: float) -> tuple[dict[int, str], str]:
        """Through ``srun --overlap`` on every node of the job (``stacks_probe``)."""
        from orchestrator.core.payload import Payload
        from orchestrator.backends.slurm.node.stacks_probe import request_slurm

        payload = Payload.load(RunFolder.of(folder).payload)
        return request_slurm(folder, running_job(record, folder), payload.nodes, payload.python, ranks,
                             timeout_s=max(timeout * 3, 10.0))

    def chaos(self) -> SlurmChaos:
        from orchestrator.backends.slurm.chaos_slurm import SlurmChaos

        return SlurmChaos()

    def log_path(self, record: RunRecord, rank: int, point: int | None = None) -> Path:
        """submitit names task logs <job>_<task>_log.out in the run's slurm folder; in a sweep the
        job is the point's array task (<array>_<index>): the one asked for, else the latest one
        that has a log."""
        run = RunFolder.of(record.run_dir)
        if not record.job_ids:
            return run.slurm_log("unsubmitted", rank)
        if point is not None and point < len(record.job_ids):
            return run.slurm_log(record.job_ids[point], rank)
        for job in reversed(record.job_ids):
            if run.slurm_log(job, rank).exists():
                return run.slurm_log(job, rank)
        return run.slurm_log(record.job_ids[0], rank)


def _refreshed(rec: RunRecord, states: dict[str, State]) -> RunRecord:
    """``rec``, not ended, brought up to date from the scheduler's ``states`` (``sacct_states``)."""
    per_job, unknown = [], []
    for index, job in enumerate(rec.job_ids):
        if job in states:
            per_job.append(states[job])
            continue
        tasks = [s for k, s in states.items() if k.startswith(job + "_")] if "_" not in job else []
        if tasks:
            per_job.append(combine(tasks))
            continue
        state, why = agent_end(rec, index, job)
        per_job.append(state)
        if why:
            unknown.append(why)
    state = combine(per_job)
    changes: dict = {"state": state}
    if state == State.UNKNOWN and unknown:
        changes["error"] = unknown[0]
    elif rec.state == State.UNKNOWN and UNKNOWN_END in (rec.error or ""):
        changes["error"] = None  # the unknown end's reason no longer holds
    if state.terminal:
        changes["ended"] = time.time()
        err = first_error(rec.run_dir)
        if err and state != State.COMPLETED:
            changes.update(failed_rank=err.rank, error=while_cancelled(err.said())
                           if state == State.CANCELLED else err.said())
        changes.update(agent_verdict(rec, state))
    if len(per_job) > 1:
        changes["point_states"] = {str(i): s for i, s in enumerate(per_job)}
    return rec.update_seen(**changes)


def agent_verdict(rec: RunRecord, state: State) -> dict:
    """What the job's agent recorded about the end (orchestrator.node.forensics.write_end): the init
    deadline or the stall (failed rank, message, where each rank was), the stacks at the time
    limit, or the did-nothing warning; for a sweep, the first point that has one."""
    from orchestrator.node.forensics import read_end

    folders = [point_dir(rec.run_dir, i) for i in range(rec.sweep_size)] if rec.sweep_size else [Path(rec.run_dir)]
    for folder in folders:
        end = read_end(folder)
        if not end:
            continue
        changes: dict = {}
        if end.warning and state == State.COMPLETED:
            changes["warning"] = end.warning
        if state != State.COMPLETED:
            if end.error:
                changes.update(error=end.error, failed_rank=end.failed_rank)
            if end.waits:
                changes["waits"] = dict(end.waits)
        if changes:
            return changes
    return {}


def _sbatch(launch: LaunchPlan, previous: PreviousAttempt, extra: dict[str, str] | None, job_ids: list[str]) -> None:
    """Write what the job's agent reads beyond the attempt's files (the sweep's payloads), then
    sbatch the job, one array per chunk of the cluster's MaxArraySize, each chunk's job ids added
    to ``job_ids`` as sbatch takes it. Refused: SubmissionError (``sbatch_refusal``), once any
    chunk already taken is cancelled."""
    folder = RunFolder.of(launch.run_dir).slurm
    previous.moved(folder, rotate_folder(folder))
    folder.mkdir(parents=True, exist_ok=True)
    for index, point in enumerate(launch.sweep):
        launch.payload_for_point(index).write(RunFolder.of(launch.run_dir).point(index).payload)
    python, params = launch.spec.slurm.python, launch.submitit
    assert params is not None  # submit refused a plan without it
    chunks: list[list[int]] | list[None] = [None]
    if launch.sweep:  # the plan assumed SLURM's default MaxArraySize; this cluster's may be smaller
        chunks = array_chunks(len(launch.sweep), max_array_size())
    sbatch_stderr = io.StringIO()  # submitit prints sbatch's errors as well as raising them: once is enough
    options = script_options(*launch.sbatch_scripts) | set(extra or {})  # the SBATCH_* these would lose to
    try:
        with clean_submission_env(options), contextlib.redirect_stderr(sbatch_stderr):
            for chunk in chunks:  # a chunk: an array of len(chunk) tasks
                job_id = submitit_adapter.submit(folder, params, job_command(
                    launch.run_dir, python, chunk[0] if chunk else 0), n_points=len(chunk) if chunk else 0,
                    extra_sbatch=extra)
                job_ids += [f"{job_id}_{i}" for i in range(len(chunk))] if chunk else [job_id]
    except Exception as exc:
        refusal = sbatch_refusal(str(exc), launch.spec.slurm.account, launch.spec.slurm.partition)
        raise SubmissionError(refusal + _cancel_accepted(job_ids)) from exc
    sys.stderr.write(sbatch_stderr.getvalue())


def sbatch_refusal(sbatch_error: str, account: str | None, partition: str | None) -> str:
    """The one line a refused submission says: the missing cluster or controller and its fix
    (``controller_problem``), else sbatch's own answer with the field to look at."""
    hint = (" (run 'orchestrator validate SPEC --cluster': it names the field this cluster cannot satisfy)"
            if any(s in sbatch_error for s in _UNSATISFIABLE) else "")
    hint += account_hint(sbatch_error, account, partition)
    return controller_problem("sbatch", sbatch_error) or f"sbatch refused the job: {one_line(sbatch_error)}{hint}"


def _cancel_accepted(job_ids: Sequence[str]) -> str:
    """Cancel the arrays sbatch took before it refused a later chunk of the sweep (their run folder
    is put back as it was: they would run without their payloads); what to add to the error."""
    bases = sorted({j.split("_")[0] for j in job_ids})
    if not bases:
        return ""
    _scancel(*bases, quiet=True)
    return f"; the job array(s) sbatch had taken for the sweep's first points ({', '.join(bases)}) were cancelled"


#: sbatch's answer when the job charges an account its user has no association with (sites that
#: enforce associations: AccountingStorageEnforce=associations).
_INVALID_ACCOUNT = "Invalid account"


def account_hint(sbatch_error: str, account: str | None, partition: str | None,
                 environ: Mapping[str, str] | None = None, user: str | None = None) -> str:
    """What to add to sbatch's "Invalid account or account/partition combination specified",
    which names neither: the account the job charged and where it came from (``slurm.account``,
    else the SBATCH_ACCOUNT sbatch read, else the user's default), the partition, and how to
    list the accounts the user may charge. '' for any other error."""
    if _INVALID_ACCOUNT not in sbatch_error:
        return ""
    env = os.environ if environ is None else environ
    user = user or _user_name()
    if account:
        named = f"the account '{account}' (slurm.account)"
    elif env.get("SBATCH_ACCOUNT"):  # from the environment: its control characters escaped for the terminal
        named = f"the account '{printable(env['SBATCH_ACCOUNT'])}' (SBATCH_ACCOUNT in this environment)"
    else:
        named = f"{user}'s default account (the spec names none)"
    where = partition or env.get("SBATCH_PARTITION")
    on = f" on partition '{printable(where)}'" if where else ""
    fix = ("set slurm.account to one of them" if account else
           "set slurm.account (or SBATCH_ACCOUNT) to one of them")
    return (f": {named} is not one user {user} may charge{on}; list those with 'sacctmgr show assoc "
            f"user={user} format=account,partition' and {fix} (or ask the site for an association)")


def _user_name() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def running_job(record: RunRecord, folder: Path) -> str:
    """The SLURM job (or array task) whose ranks record themselves in ``folder``."""
    if record.sweep_size and folder.parent.name == "points":
        index = int(folder.name)
        return record.job_ids[index] if index < len(record.job_ids) else record.job_ids[-1]
    return record.job_ids[0]
