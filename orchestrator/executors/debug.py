"""Debug executor: one rank, in this process, so pdb and breakpoints work."""

from __future__ import annotations

import os
import time
from pathlib import Path

from orchestrator.executors.base import prepare_run_dir
from orchestrator.executors.local import pick_port
from orchestrator.launcher import run_rank
from orchestrator.plan import LaunchPlan
from orchestrator.rank_env import init_url, rendezvous_file
from orchestrator.records import RunRecord


class DebugExecutor:
    def run(self, launch: LaunchPlan) -> RunRecord:
        record = prepare_run_dir(launch).update(state="RUNNING", supervisor_pid=os.getpid())
        payload = launch.payload
        env = dict(launch.ranks[0].env)
        port = pick_port(int(env["MASTER_PORT"]))
        rfile = rendezvous_file(payload["rendezvous_dir"], launch.run_id, int(time.time() * 1000))
        if launch.spec["distributed"]["init_method"] == "file":
            Path(payload["rendezvous_dir"]).mkdir(parents=True, exist_ok=True)
        env.update(MASTER_PORT=str(port),
                   ORCH_INIT_METHOD=init_url(launch.spec["distributed"]["init_method"], env["MASTER_ADDR"], port, rfile))
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
