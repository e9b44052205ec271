"""Local executor: nodes x ranks processes on this machine, grouped into emulated nodes, run by a
``Supervisor`` (backends/local/supervisor.py) in the foreground (``run``: the ranks' output is echoed
prefixed with their rank) or detached (``run --detach``: ``python -m orchestrator.backends.local.executor
RUN_DIR --lock-fd N`` holds the run's lock and supervises in a session of its own).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.core import ownership, platform_caps, procs
from orchestrator.core.errors import JobFailedError, SubmissionError, UsageError
from orchestrator.executors.base import (CANCEL_SLACK_S, prepare_run_dir, rank_log_path, refresh_by_supervisor,
                                         stop_grace_s)
from orchestrator.executors.console import ConsoleEcho, PlainEcho
from orchestrator.backends.local.supervisor import Supervisor
from orchestrator.core.interpreter import module_argv
from orchestrator.plan import LaunchPlan
from orchestrator.core.records import RunRecord, disk_trouble
from orchestrator.core.states import TERMINAL, State
from orchestrator.core.run_folder import RunFolder

SUPERVISOR_START_S = 30.0  # how long `run --detach` waits for the supervisor to record itself


class LocalExecutor:
    def __init__(self, zygote: subprocess.Popen | None = None) -> None:
        self.zygote = zygote  # started early by the CLI, so torch imports while it validates

    def run(self, launch: LaunchPlan) -> RunRecord:
        platform_caps.announce_local_limits()  # macOS: one line saying what cannot be done here
        record, lock = prepare_run_dir(launch)
        supervisor = Supervisor(launch, record, lock, ConsoleEcho if sys.stdout.isatty() else PlainEcho,
                                zygote=self.zygote)
        try:
            record = supervisor.run()
        finally:
            if isinstance(supervisor.echo, ConsoleEcho):
                supervisor.echo.close()
        if not supervisor.end_recorded:  # the folder still says RUNNING: never hand the caller that
            raise JobFailedError(f"{record.run_id} ended FAILED, and its end could not be recorded in "
                                 f"{record.path}: {record.error}")
        return record

    def submit(self, launch: LaunchPlan) -> RunRecord:
        platform_caps.announce_local_limits()
        record, lock = prepare_run_dir(launch)
        try:
            return self._start_detached(launch, lock)
        finally:
            lock.handed_over()  # the supervisor holds it now (or it has ended)

    def _start_detached(self, launch: LaunchPlan, lock: ownership.RunLock) -> RunRecord:
        """Start the supervisor in a session of its own, handing it the run's lock, and return once
        it has recorded itself. It writes the record from then on: writing here too would race."""
        with open(RunFolder.of(launch.run_dir).supervisor_log, "ab") as log:
            proc = subprocess.Popen(
                module_argv(sys.executable, "orchestrator.backends.local.executor", launch.run_dir, "--lock-fd", str(lock.fd),
                            unbuffered=False),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                pass_fds=(lock.fd,))
        deadline = time.monotonic() + SUPERVISOR_START_S
        while time.monotonic() < deadline and proc.poll() is None:
            record = RunRecord.load(launch.run_dir)
            if record.supervisor_pid == proc.pid:
                return record
            time.sleep(0.05)
        if proc.poll() is None:  # alive but silent: it keeps the lock and the run
            return RunRecord.load(launch.run_dir)
        record = RunRecord.load(launch.run_dir)
        if record.state not in TERMINAL:
            why = (f"the supervisor exited with code {proc.returncode} before starting the ranks; "
                   f"see {RunFolder.of(launch.run_dir).supervisor_log}")
            try:
                record.update(last=True, state=State.FAILED, ended=time.time(), error=why)
            except OSError as exc:  # the free lock tells the next look all the same
                record.error = f"{why} ({disk_trouble(exc, launch.run_dir) or exc.strerror or exc})"
        raise SubmissionError(record.error or "the supervisor exited before starting the ranks")

    def refresh(self, records: list[RunRecord]) -> list[RunRecord]:
        return [refresh_by_supervisor(rec) for rec in records]

    def cancel(self, record: RunRecord, timeout_s: float | None = None) -> RunRecord:
        """Ask the supervisor to stop (a request file it watches: it stops the ranks, which
        checkpoint together) and wait for its end state. From any host that shares the run
        folder; no signal is sent to any process. A supervisor that is gone is not waited for: what
        it left on this host is stopped and the run is recorded FAILED (see refresh_by_supervisor);
        a dedicated supervisor of ours on this host that does not answer is killed (its launcher
        then stops the ranks)."""
        record = refresh_by_supervisor(RunRecord.load(record.run_dir))  # the caller's copy may be stale
        if record.state in TERMINAL:
            return record
        copy = ownership.copy_reason(record.folder_id, record.run_dir)
        if copy:
            raise UsageError(copy)
        ownership.request_cancel(record.run_dir, "orchestrator cancel")
        if timeout_s is None:  # the ranks' stop_grace_s, and the supervisor's look and clean-up
            timeout_s = stop_grace_s(record.run_dir) + CANCEL_SLACK_S
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            record = refresh_by_supervisor(RunRecord.load(record.run_dir))
            if record.state in TERMINAL and not ownership.is_held(record.run_dir):
                _wait_gone(record, deadline)
                return record
            time.sleep(0.1)
        if ownership.foreign_reason(record.host, record.folder_id, record.run_dir) is None and \
                _is_detached_supervisor(record.supervisor_pid) and \
                procs.signal_if_same(record.supervisor_pid, record.supervisor_start, signal.SIGKILL):
            for _ in range(100):
                if not ownership.is_held(record.run_dir):
                    return refresh_by_supervisor(RunRecord.load(record.run_dir))
                time.sleep(0.1)
        raise SubmissionError(
            f"{record.run_id} was asked to stop but its supervisor ({ownership.holder_text(record.run_dir)}) has not "
            f"ended it within {timeout_s:.0f}s; it will see the request at its next look. Check with "
            f"'orchestrator status {record.run_id}'")

    def log_path(self, record: RunRecord, rank: int, point: int | None = None) -> Path:
        return rank_log_path(record, rank, point)


def _wait_gone(record: RunRecord, deadline: float) -> None:
    """The supervisor records the end and releases the lock as its last acts; on this host, return
    only once its process is gone too, so a caller never finds it still exiting."""
    if ownership.foreign_reason(record.host, record.folder_id, record.run_dir) is None:
        while procs.same_process(record.supervisor_pid, record.supervisor_start) and time.monotonic() < deadline:
            if record.supervisor_pid == os.getpid():
                return  # the caller's own process supervises it (a run() in another thread)
            time.sleep(0.05)


def _is_detached_supervisor(pid: int | None) -> bool:
    """True for a supervisor this module started on its own (never a caller's process, such as
    a notebook kernel that ran the job in the foreground)."""
    argv = procs.cmdline(pid) if pid else []
    # the name before the package move too: a supervisor started by the previous layout
    return any(name in argv for name in (__name__, "orchestrator.executors.local")) and "--lock-fd" in argv


def _detached_main(argv: list[str]) -> int:
    run_dir = argv[0]
    fd = int(argv[argv.index("--lock-fd") + 1]) if "--lock-fd" in argv else -1
    lock = ownership.RunLock(fd, Path(run_dir)) if fd >= 0 else None
    launch = LaunchPlan.model_validate_json(RunFolder.of(run_dir).plan.read_text())
    record = Supervisor(launch, RunRecord.load(run_dir), lock).run()
    return 0 if record.state == State.COMPLETED else 1


if __name__ == "__main__":
    sys.exit(_detached_main(sys.argv[1:]))
