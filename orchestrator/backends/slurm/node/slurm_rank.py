"""One srun task: ``python -m orchestrator.backends.slurm.node.slurm_rank RUN/payload.json [--point-base N]``.

Standard library only until the user's entrypoint: no submitit import and no unpickling on the
ranks (tens of thousands of ranks doing that from a shared filesystem is a metadata storm). The
task *is* the rank, as under plain ``srun``: SLURM's signals (scancel's SIGTERM, the USR2 that
the job's agent forwards through srun) reach the user's own handlers and ``finally:`` blocks.
The job's variables (``env:``, the thread and heap defaults) are already in place when this
interpreter starts: the job's agent exports them to srun, so the ones read at start-up
(PYTHONPATH, PYTHONHASHSEED, LD_PRELOAD...) take effect.
"""

from __future__ import annotations

import os
import signal
import sys

from orchestrator.node import malloc
from orchestrator.node.launcher import exit_code_of, run_rank
from orchestrator.core.payload import Payload
from orchestrator.node.rank_env import installed_torch_version, rank_environment
from orchestrator.core.rendezvous import remove_earlier_files
from orchestrator.backends.slurm.node.slurm_task import (SlurmTask, gate_attempt, master_port, point_base, rank_env_from_slurm,
                                                      stand_in)


def keep_running_on_time_limit_notice(rank: int, notice: signal.Signals = signal.SIGUSR2) -> None:
    """``notice`` (``slurm.signal``) is the time limit's advance notice (``--signal=B:SIG@margin``),
    which the job's agent forwards so scripts that listen for it can checkpoint (the rank API and
    Lightning's SLURM requeue do). Under plain sbatch a script never sees it: a script with no
    handler runs on to its time limit. Its default action, though, ends the process, so each rank
    starts with a handler that only says it came: a script (or the rank API) that installs its own
    replaces it, and unlike SIG_IGN it is not inherited by a program the rank execs."""
    def said(signum: int, frame: object) -> None:
        try:
            os.write(2, f"[launcher] rank {rank}: the time limit's notice ({notice.name}) came; this script has no "
                        "handler for it, so it runs on until the time limit\n".encode())
        except OSError:
            pass

    signal.signal(notice, said)


def failed_before_entrypoint(payload: Payload, rank: int, attempt: int, exc: BaseException) -> int:
    """A rank that cannot even start its entrypoint is recorded as any failing rank is (its rank,
    the reason, in ``<run>/errors/rank-N.json`` for status), and says so in one line, not a bare
    traceback."""
    import socket
    import time
    import traceback

    from orchestrator.core.failures import FAILED_MARK, message_of
    from orchestrator.core import rank_error
    from orchestrator.core.run_folder import RunFolder

    message = f"{message_of(exc)} (on {socket.gethostname()}, before the entrypoint started)"
    try:
        rank_error.write(RunFolder.of(payload.run_dir).error(rank), rank_error.RankError(
            rank=rank, time=time.time(), attempt=attempt, type=type(exc).__name__, message=message,
            traceback=traceback.format_exc(), user_traceback=f"{type(exc).__name__}: {message}\n"))
    except OSError:
        pass  # the line below still says it
    sys.stderr.write(f"{FAILED_MARK.format(rank=rank)}{type(exc).__name__}: {message}\n")
    sys.stderr.flush()
    return 1


def main(args: list[str]) -> int:
    """Build this task's rank environment from SLURM's variables, then run the rank."""
    if not args:
        print("usage: python -m orchestrator.backends.slurm.node.slurm_rank PAYLOAD.json [--point-base N] (an srun task)", file=sys.stderr)
        return 2
    task = SlurmTask.from_environ(os.environ)
    job = task.job
    payload = Payload.load(job.payload_path(args[0], point_base(args)))
    task, as_its_step = stand_in(task, args, payload.ranks_per_node)  # a replaced rank (recovery.survivors: keep)
    os.environ.update(as_its_step)
    # At once, not after the set-up below: the notice can come while a slow start is still under way
    # (its default action would end the rank, and the job would fail instead of running on).
    keep_running_on_time_limit_notice(int(task.procid), signal.Signals[payload.stop_signal])
    gate = gate_attempt(args)
    stop: str | None = None
    if gate is not None:  # the health gate inside this step: nothing of the user's runs before it passes
        from orchestrator.backends.slurm.node import gate_step

        stop = gate_step.check_part(payload, gate, task.localid, os.environ)
    try:
        return _start(task, payload, args, gate, stop)
    finally:
        if gate is not None and task.localid == 0:  # its node-local copy of the decision (gate_step)
            gate_step.forget_node_signals(payload.run_dir, os.environ.get("SLURMD_NODENAME") or os.uname().nodename)


def _start(task: SlurmTask, payload: Payload, args: list[str], gate: int | None, stop: str | None) -> int:
    """The rank's environment, the gate's decision (``gate``: the attempt whose gate this task takes
    part in), then the entrypoint."""
    job = task.job
    failed: Exception | None = None
    try:  # no side effects: worked out while the other nodes are checked (64 ranks on a node's cores
        # waking on the decision each did ~10 ms of this after it: a third of the last rank's wait)
        rank = rank_env_from_slurm(task, payload, master_port(args))
        env = rank_environment(rank, payload, job.attempt, job.requeue_marker(payload.run_dir),
                               installed_torch_version(payload.env))
    except Exception as exc:  # before the entrypoint (a named interface missing on this node...)
        failed = exc
    if gate is not None and stop is None:
        from orchestrator.backends.slurm.node import gate_step

        stop = gate_step.decision_part(payload, gate, task.localid, os.environ)
    if stop is not None:
        print(f"[launcher] task {task.procid} on {os.environ.get('SLURMD_NODENAME') or os.uname().nodename}: "
              f"{stop}", file=sys.stderr, flush=True)
        return 1
    if failed is not None:
        return failed_before_entrypoint(payload, task.procid, job.attempt, failed)
    os.environ.update(env)
    malloc.apply()  # the job's heap settings, for this process too (its children get them at start)
    print(f"[launcher] rank {rank.rank}/{rank.world_size} (local {rank.local_rank}) on {os.uname().nodename}, job "
          f"{job.job_id} attempt {job.attempt}, master {rank.master_addr}:{rank.master_port}, {rank.init_method}",
          file=sys.stderr, flush=True)
    if payload.init_method == "file":
        if rank.rank == 0 and job.attempt > 0:
            for path in remove_earlier_files(payload.rendezvous_dir, job.job_id, job.attempt):
                print(f"[launcher] removed the previous attempt's rendezvous file {path}", flush=True)
        os.makedirs(payload.rendezvous_dir, exist_ok=True)
    return exit_code_of(run_rank, payload, int(rank.rank))


if __name__ == "__main__":
    from orchestrator.node.rank_exit import leave

    leave(main(sys.argv[1:]), True, {})  # the exit work without torch's teardown (rank_exit)
