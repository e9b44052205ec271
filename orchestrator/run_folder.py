"""Every path of a run folder, named once. Standard library only (ranks use it too).

    <run>/record.json  plan.json  payload.json  result.json  spec.yaml  supervisor.log  end.json
    <run>/logs/rank-N.log          local ranks' output (SLURM: <run>/slurm/<job>_<task>_log.out)
    <run>/errors/rank-N.json       a failing rank's traceback, full and trimmed
    <run>/progress/rank-N.json     the rank API's heartbeat (orchestrator.progress)
    <run>/ranks/rank-N.json        who the rank is (host, pid, start time), for identity-checked signals
    <run>/joined/rank-N[.calling]  the rank returned from (entered) init_process_group
    <run>/stacks/rank-N.txt        stacks saved at an abnormal end; stacks/live/: on request
    <run>/requeue/checkpointed-<job>-<restart>   the rank API checkpointed after a stop signal
    <run>/nccl-trace/rank-N        the NCCL flight recorder's dumps
    <run>/checkpoints/             (unless checkpoint.dir says otherwise)
    <run>/points/NNNN/             one sweep point: the same layout again
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunFolder:
    root: Path

    @classmethod
    def of(cls, path: "str | Path | RunFolder") -> RunFolder:
        return path if isinstance(path, RunFolder) else cls(Path(path))

    def point(self, index: int) -> RunFolder:
        """The folder of one sweep point: its logs, errors and result live there."""
        return RunFolder(self.root / "points" / f"{index:04d}")

    # -- the run's own files
    @property
    def record(self) -> Path:
        return self.root / "record.json"

    @property
    def plan(self) -> Path:
        return self.root / "plan.json"

    @property
    def payload(self) -> Path:
        return self.root / "payload.json"

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
    def slurm(self) -> Path:
        return self.root / "slurm"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    # -- per rank
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

    def progress(self, rank: int) -> Path:
        return self.root / "progress" / f"rank-{rank}.json"

    def rank_record(self, rank: int) -> Path:
        return self.root / "ranks" / f"rank-{rank}.json"

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

    def requeue_marker(self, job_id: str, restart: int) -> Path:
        return self.root / "requeue" / f"checkpointed-{job_id}-{restart}"

    @property
    def nccl_trace_prefix(self) -> Path:
        """TORCH_FR_DUMP_TEMP_FILE: torch appends the rank."""
        return self.root / "nccl-trace" / "rank-"

    @property
    def rendezvous(self) -> Path:
        """Default folder of file:// rendezvous files."""
        return self.root / "rendezvous"

    #: What belongs to one attempt only (forgotten before the next one starts).
    def attempt_files(self) -> list[Path]:
        return [self.root / "ranks", self.root / "joined", self.stacks / "live", self.end]

    def forget_attempt(self) -> None:
        """Remove the previous attempt's ranks, joins, live dumps and verdict (before a new one)."""
        import shutil

        for path in self.attempt_files():
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
