"""Debug executor: one rank, in this process, so pdb and breakpoints work."""

from __future__ import annotations

import os
import sys
import time
from typing import Any
from pathlib import Path

from orchestrator.core import procs
from orchestrator.core.errors import OrchestratorError
from orchestrator.executors.base import prepare_run_dir, rank_log_path, refresh_by_supervisor
from orchestrator.node.launcher import run_rank
from orchestrator.backends.local.attempt import rank_environments
from orchestrator.plan import LaunchPlan
from orchestrator.core.records import RunRecord
from orchestrator.core.states import TERMINAL, State


class DebugExecutor:
    """The rank runs in the caller's process (a notebook, pdb) and leaves it as it found it:
    the working directory, os.environ (the rank variables, the ORCH_* ones the launcher sets and
    anything the entrypoint set) and sys.path are restored however the run ends."""

    def run(self, launch: LaunchPlan) -> RunRecord:
        saved_env, saved_path, saved_cwd = dict(os.environ), list(sys.path), os.getcwd()
        me = os.getpid()
        try:
            record, lock = prepare_run_dir(launch)  # this process is the attempt's supervisor: it holds the lock
            with lock:
                record = record.update(state=State.RUNNING, supervisor_pid=me, supervisor_start=procs.start_time(me))
                return self._run_rank(launch, record)
        finally:
            _restore(saved_env, saved_path, saved_cwd)

    def _run_rank(self, launch: LaunchPlan, record: RunRecord) -> RunRecord:
        payload = launch.payload
        os.environ.update(rank_environments(launch, payload, record.attempts - 1, port_taken_ok=True)[1][0])
        # Every way out records an end state: an exception, sys.exit() in the entrypoint, Ctrl-C.
        changes: dict[str, Any]
        state, changes = State.FAILED, {"failed_rank": 0, "error": "the debug run ended without a result"}
        try:
            run_rank(payload, 0, own_process=False)  # rank 0 records its result in the run folder
            state, changes = State.COMPLETED, {}
        except KeyboardInterrupt:
            state, changes = State.CANCELLED, {"error": "interrupted (Ctrl-C)"}
            raise
        except SystemExit as exc:
            if exc.code in (None, 0):
                state, changes = State.COMPLETED, {}
            else:
                changes = {"failed_rank": 0, "error": f"the entrypoint called sys.exit({exc.code!r})"}
                raise
        except Exception as exc:
            changes = {"failed_rank": 0, "error": f"{type(exc).__name__}: {exc}"}
        finally:
            record.update(state=state, ended=time.time(), **changes)
        return record

    def submit(self, launch: LaunchPlan) -> RunRecord:
        return self.run(launch)

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


def _restore(env: dict[str, str], path: list[str], cwd: str) -> None:
    """os.environ exactly as ``env`` (only the variables that differ are touched), sys.path as
    ``path``, and the working directory ``cwd``."""
    for key in [k for k in os.environ if k not in env]:
        del os.environ[key]
    for key, value in env.items():
        if os.environ.get(key) != value:
            os.environ[key] = value
    sys.path[:] = path
    try:
        os.chdir(cwd)
    except OSError as exc:  # removed while the rank ran: say so, and stay where the rank left us
        print(f"could not return to {cwd} after the debug run: {exc.strerror}", file=sys.stderr)
