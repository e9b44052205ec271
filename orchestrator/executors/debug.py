"""Debug executor: one rank, in this process, so pdb and breakpoints work."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from orchestrator import procs
from orchestrator.errors import OrchestratorError
from orchestrator.executors.base import prepare_run_dir, rank_log_path, refresh_by_supervisor
from orchestrator.executors.local import pick_port, rank_environments
from orchestrator.launcher import run_rank
from orchestrator.plan import LaunchPlan
from orchestrator.records import TERMINAL, RunRecord


class DebugExecutor:
    def run(self, launch: LaunchPlan) -> RunRecord:
        me = os.getpid()
        record = prepare_run_dir(launch).update(state="RUNNING", supervisor_pid=me,
                                                supervisor_start=procs.start_time(me))
        payload = launch.payload
        port = pick_port(int(launch.ranks[0].env["MASTER_PORT"]))
        env = rank_environments(launch, port, payload)[0]
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        # Every way out records an end state: an exception, sys.exit() in the entrypoint, Ctrl-C.
        state, changes = "FAILED", {"failed_rank": 0, "error": "the debug run ended without a result"}
        try:
            result = run_rank(payload, 0, own_process=False)
            state, changes = "COMPLETED", {}
        except KeyboardInterrupt:
            state, changes = "CANCELLED", {"error": "interrupted (Ctrl-C)"}
            raise
        except SystemExit as exc:
            if exc.code in (None, 0):
                state, changes, result = "COMPLETED", {}, None
            else:
                changes = {"failed_rank": 0, "error": f"the entrypoint called sys.exit({exc.code!r})"}
                raise
        except Exception as exc:
            changes = {"failed_rank": 0, "error": f"{type(exc).__name__}: {exc}"}
            print(f"{record.run_id}: FAILED  {changes['error']}", file=sys.stderr)
            return record
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            record.update(state=state, ended=time.time(), **changes)
        print(f"{record.run_id}: COMPLETED  result: {result}")
        return record

    def submit(self, launch: LaunchPlan, detach: bool = True) -> RunRecord:
        return self.run(launch)

    def wait(self, record: RunRecord, follow: bool = False) -> RunRecord:
        return RunRecord.load(record.run_dir)

    def refresh(self, records: list[RunRecord]) -> list[RunRecord]:
        return [refresh_by_supervisor(rec) for rec in records]

    def cancel(self, record: RunRecord) -> RunRecord:
        record = refresh_by_supervisor(record)
        if record.state in TERMINAL:
            return record
        raise OrchestratorError(f"{record.run_id} is a debug run in the foreground of process "
                                f"{record.supervisor_pid}; stop it there with Ctrl-C")

    def log_path(self, record: RunRecord, rank: int, point: int | None = None) -> Path:
        return rank_log_path(record, rank, point)
