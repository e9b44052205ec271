"""Every path of a run folder, named once. Standard library only (ranks use it too).

    <run>/record.json  plan.json  payload.json  result.json  spec.yaml  supervisor.log  end.json
    <run>/code.json                the code snapshot the ranks import (orchestrator.code.snapshot)
    <run>/lock  lease.json  requests/cancel   the live attempt's lock, its lease, a cancel request
    <run>/logs/rank-N.log          local ranks' output (SLURM: <run>/slurm/<job>_<task>_log.out)
    <run>/errors/rank-N.json       a failing rank's traceback, full and trimmed (this attempt's)
    <run>/attempts/K/              attempt K's failure record once another attempt started: errors/, end.json
    <run>/progress/node-G.json     the rank API's heartbeats, one file per node (orchestrator.core.progress)
    <run>/ranks/rank-N.json        who the rank is (host, pid, start time), for identity-checked signals
    <run>/joined/rank-N[.calling]  the rank returned from (entered) init_process_group
    <run>/stacks/rank-N.txt        stacks saved at an abnormal end; stacks/live/: on request
    <run>/requeue/checkpointed-<job>-<restart>   the rank API checkpointed after a stop signal
    <run>/requeue/checkpointed-<job>-<restart>.stopflag   'listening' or 'stopped' (jobs.StopFlag)
    <run>/nccl-trace/rank-N        the NCCL flight recorder's dumps
    <run>/metrics/rank-N.jsonl     jobs.MetricsWriter's records
    <run>/report/                  what ``orchestrator report`` made of them (metrics.png, summary.txt)
    <run>/allreduce.json  predictions.jsonl   what jobs.allreduce and jobs.infer write (by default)
    <run>/checkpoints/             (unless checkpoint.dir says otherwise)
    <run>/points/NNNN/             one sweep point: the same layout again (and point-payload.json)
    <run>/.previous-attempt/       a resubmission's previous attempt, until the scheduler takes the new one
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.core.lean_record import record


@record
class RunFolder:
    """Every path of a run folder, by section, and what a new attempt does to the previous one's
    files. A naming table (one property a path), over the class limit on purpose: it was split into
    five mixins recombined here only to meet the count (issue 52), which hid nothing and helped no
    reader (tests/unit/test_architecture.py: BIG_CLASSES)."""

    root: Path

    # ---- The run's own files: its record, plan, code, payload, spec, result and verdict; its checkpoints,
    # rendezvous files and sweep points.

    @property
    def points(self) -> Path:
        """The sweep points' folders (``point`` names one)."""
        return self.root / "points"

    def point(self, index: int) -> RunFolder:
        """The folder of one sweep point: its logs, errors and result live there."""
        return RunFolder(self.points / f"{index:04d}")

    @property
    def record(self) -> Path:
        return self.root / "record.json"

    @property
    def plan(self) -> Path:
        return self.root / "plan.json"

    @property
    def code(self) -> Path:
        """The code snapshot the run imports (``orchestrator.code.snapshot``): its id, tree, commit."""
        return self.root / "code.json"

    @property
    def payload(self) -> Path:
        return self.root / "payload.json"

    @property
    def point_payload(self) -> Path:
        """A sweep point's own payload, as the local supervisor writes it in the point's folder."""
        return self.root / "point-payload.json"

    @property
    def spec(self) -> Path:
        """The spec the run was started from, as YAML."""
        return self.root / "spec.yaml"

    @property
    def result(self) -> Path:
        return self.root / "result.json"

    @property
    def end(self) -> Path:
        """The SLURM agent's verdict (reason, failed rank, message, waits)."""
        return self.root / "end.json"

    @property
    def supervisor_log(self) -> Path:
        return self.root / "supervisor.log"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def rendezvous(self) -> Path:
        """Default folder of file:// rendezvous files."""
        return self.root / "rendezvous"

    # ---- ``recovery.survivors: keep``'s files (``jobs.heal``, ``backends.local.survivors``): the launcher's
    # generations of the ranks' group, their stores, and what each rank says of itself.

    @property
    def heal(self) -> Path:
        """``recovery.survivors: keep``: the launcher's generations of the ranks' group and their
        stores (``jobs.heal``); one attempt's, removed before a new one starts every rank."""
        return self.root / "heal"

    @property
    def heal_generation(self) -> Path:
        return self.heal / "generation.json"

    def heal_store(self, generation: int) -> Path:
        return self.heal / f"store-{generation}"

    def heal_rejoined(self, generation: int, rank: int) -> Path:
        """Written by a rank once it holds generation ``generation``'s state (``jobs.Healer``):
        the rejoin is complete when every rank wrote it."""
        return self.heal / "rejoined" / f"g{generation}-rank-{rank}"

    def heal_ready(self, rank: int) -> Path:
        """Written by a rank that can rejoin (``jobs.Healer``): only then is a lost peer replaced
        beside it; a script without it restarts whole, as it must (its state is not handed on)."""
        return self.heal / "ready" / f"rank-{rank}"


    # ---- Who holds the run and what steers its attempts (orchestrator.core.ownership, the SLURM agent): lock,
    # lease, cancel request, submitit's folder, requeue markers, earlier attempts.

    @property
    def lock(self) -> Path:
        return self.root / "lock"

    @property
    def lease(self) -> Path:
        return self.root / "lease.json"

    @property
    def cancel_request(self) -> Path:
        return self.root / "requests" / "cancel"

    @property
    def slurm(self) -> Path:
        return self.root / "slurm"

    def slurm_log(self, job: str, task: "int | str") -> Path:
        """submitit's name for a task's log: ``<job>_<task>_log.out`` (also with its patterns,
        ``%j``, ``%A_%a``, ``%t``, in what sbatch is given)."""
        return self.slurm / f"{job}_{task}_log.out"

    def requeue_marker(self, job_id: str, restart: int) -> Path:
        return self.root / "requeue" / f"checkpointed-{job_id}-{restart}"

    @property
    def attempts(self) -> Path:
        """Earlier attempts' failure records, one folder per attempt (``keep_failures``)."""
        return self.root / "attempts"


    # ---- Per rank: its log, traceback, heartbeat, identity, join markers and stacks.

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def log(self, rank: int) -> Path:
        return self.logs / f"rank-{rank}.log"

    @property
    def leftovers_log(self) -> Path:
        return self.logs / "leftovers.log"

    @property
    def errors(self) -> Path:
        return self.root / "errors"

    def error(self, rank: int) -> Path:
        return self.errors / f"rank-{rank}.json"

    def error_files(self) -> list[Path]:
        """The tracebacks ranks have written (none when there is no errors/ folder)."""
        return list(self.errors.glob("rank-*.json")) if self.errors.is_dir() else []

    def progress(self, rank: int) -> Path:
        return self.root / "progress" / f"rank-{rank}.json"

    @property
    def ranks(self) -> Path:
        return self.root / "ranks"

    def rank_record(self, rank: int) -> Path:
        return self.ranks / f"rank-{rank}.json"

    def joined(self, rank: int) -> Path:
        return self.root / "joined" / f"rank-{rank}"

    def calling(self, rank: int) -> Path:
        return self.root / "joined" / f"rank-{rank}.calling"

    @property
    def stacks(self) -> Path:
        return self.root / "stacks"

    def saved_stack(self, rank: int) -> Path:
        return self.stacks / f"rank-{rank}.txt"

    def live_stack(self, rank: int) -> Path:
        return self.stacks / "live" / f"rank-{rank}.txt"

    @property
    def nccl_trace_prefix(self) -> Path:
        """TORCH_FR_DUMP_TEMP_FILE: torch appends the rank."""
        return self.root / "nccl-trace" / "rank-"


    # ---- What jobs write (metrics, allreduce's table, predictions), and what ``report`` makes of it.

    @property
    def metrics(self) -> Path:
        return self.root / "metrics"

    def metrics_file(self, rank: int) -> Path:
        return self.metrics / f"rank-{rank}.jsonl"

    def metrics_files(self) -> list[Path]:
        """Every rank's metrics file there is, in name order."""
        return sorted(self.metrics.glob("rank-*.jsonl"))

    @property
    def report(self) -> Path:
        """Where ``orchestrator report`` writes its plots and summary."""
        return self.root / "report"

    @property
    def report_plot(self) -> Path:
        return self.report / "metrics.png"

    @property
    def report_summary(self) -> Path:
        return self.report / "summary.txt"

    @property
    def allreduce(self) -> Path:
        """jobs.allreduce's table (rank 0 writes it; ``orchestrator preflight`` reads it)."""
        return self.root / "allreduce.json"

    @property
    def predictions(self) -> Path:
        """jobs.infer's predictions, unless its --output says otherwise."""
        return self.root / "predictions.jsonl"

    @classmethod
    def of(cls, path: "str | Path | RunFolder") -> RunFolder:
        return path if isinstance(path, RunFolder) else cls(Path(path))

    #: What belongs to one attempt only (forgotten before the next one starts).
    def attempt_files(self) -> list[Path]:
        return [self.ranks, self.root / "joined", self.stacks / "live", self.end, self.heal]

    def attempts_problem(self) -> str | None:
        """Why the previous attempt's failures cannot be kept under ``attempts/``: it is a symbolic
        link (moving into it would put this run's tracebacks, and a later restore's removals, in
        whatever folder it names) or not a folder. None when it is a folder of its own, or not
        there yet. lstat only: a link is never followed."""
        import os
        import stat

        from orchestrator.core.fs_checks import kind, shown

        try:
            st = os.lstat(self.attempts)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return (f"{shown(self.attempts)} cannot be looked at ({exc.strerror or exc}); check the permissions of "
                    f"{shown(self.root)}")
        if stat.S_ISLNK(st.st_mode):
            try:
                target = f" to {shown(os.readlink(self.attempts))}"
            except OSError:
                target = ""
            return (f"{shown(self.attempts)} is a symbolic link{target}, and an attempt's failures are kept only in a "
                    f"folder of the run's own: move the link out of {shown(self.root)} and run again")
        if not stat.S_ISDIR(st.st_mode):
            return (f"{shown(self.attempts)} is {kind(st.st_mode)}, not a folder: move it out of {shown(self.root)} "
                    "and run again")
        return None

    def keep_failures(self) -> Path | None:
        """Move the previous attempt's failure record (errors/, end.json) to attempts/K, K being
        the attempt its ranks recorded, counted from 1 as status and recovery.json count: what status shows is this attempt's alone, and every
        attempt's failures stay readable. None when there was nothing to keep, or when attempts/
        is no folder of the run's own (``attempts_problem``): nothing is moved through a link."""
        import os

        from orchestrator.core.safe_read import Unreadable, read_json

        errors = sorted(self.error_files())
        if not errors and not self.end.is_file():
            return None
        if self.attempts_problem():
            return None
        label = "earlier"
        for path in errors:
            try:  # a FIFO or a link here is never opened: it would block the new attempt's start
                attempt = (read_json(path, 1 << 20) or {}).get("attempt")
            except (Unreadable, AttributeError):
                continue
            if isinstance(attempt, int) and not isinstance(attempt, bool):
                label = str(attempt + 1)  # the ranks count from 0 (ORCH_ATTEMPT); status from 1
                break
        target, n = self.attempts / label, 1
        while os.path.lexists(target):
            target, n = self.attempts / f"{label}.{n}", n + 1
        try:
            target.mkdir(parents=True)
            if errors:
                os.replace(self.errors, target / "errors")
            if self.end.is_file():
                os.replace(self.end, target / "end.json")
        except OSError:
            return None  # a concurrent start moved it first, or the folder is read-only: forgotten below
        return target

    def forget_attempt(self) -> None:
        """Keep the previous attempt's failures (``keep_failures``), then remove its ranks, joins,
        live dumps and verdict (before a new one)."""
        import shutil
        import sys

        refused = self.attempts_problem()
        if refused and (self.errors.is_dir() or self.end.is_file()):
            print(f"[orchestrator] the previous attempt's failures are not kept: {refused}", file=sys.stderr,
                  flush=True)
        self.keep_failures()
        for path in self.attempt_files():
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def stop_flag_note(marker: str) -> str:
    """Where the rank API's StopFlag notes, beside the attempt's requeue marker, that the ranks
    listen for a stop ('listening') and whether they stopped on one ('stopped'): the job's agent
    then knows that ranks which ended after a time-limit notice without stopping had finished
    their work, and must not be requeued to do it again."""
    return marker + ".stopflag"

