"""Debug executor: one rank, in this process, so pdb and breakpoints work."""

from __future__ import annotations

import os
import time
from pathlib import Path

from orchestrator.executors.base import prepare_run_dir
from orchestrator.executors.local import pick_port, rank_environments
from orchestrator.launcher import run_rank
from orchestrator.plan import LaunchPlan
from orchestrator.records import RunRecord


class DebugExecutor:
    def run(self, launch: LaunchPlan) -> RunRecord:
        record = prepare_run_dir(launch).update(state="RUNNING", supervisor_pid=os.getpid())
        payload = launch.payload
        port = pick_port(int(launch.ranks[0].env["MASTER_PORT"]))
        env = rank_environments(launch, port, payload)[0]
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            result = run_rank(payload, 0)
        except Exception as exc:
            return record.update(state="FAILED", failed_rank=0, error=f"{type(exc).__name__}: {exc}", ended=time.time())
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        print(f"{record.run_id}: COMPLETED  result: {result}")
        return record.update(state="COMPLETED", ended=time.time())

    def submit(self, launch: LaunchPlan, detach: bool = True) -> RunRecord:
        return self.run(launch)

    def wait(self, record: RunRecord, follow: bool = False) -> RunRecord:
        return RunRecord.load(record.run_dir)

    def refresh(self, records: list[RunRecord]) -> list[RunRecord]:
        return records

    def cancel(self, record: RunRecord) -> RunRecord:
        return record

    def log_path(self, record: RunRecord, rank: int) -> Path:
        return Path(record.run_dir) / "logs" / f"rank-{rank}.log"
