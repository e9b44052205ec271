"""One srun task: ``python -m orchestrator.launcher --slurm RUN/payload.json [--point-base N]``.

Standard library only until the user's entrypoint: no submitit import and no unpickling on the
ranks (tens of thousands of ranks doing that from a shared filesystem is a metadata storm). The
task *is* the rank, as under plain ``srun``: SLURM's signals (scancel's SIGTERM, the USR2 that
the job's agent forwards through srun) reach the user's own handlers and ``finally:`` blocks.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

from orchestrator import malloc
from orchestrator.rank_env import OrchVar, rank_env_from_slurm, slurm_job_id
from orchestrator.run_folder import RunFolder


def payload_path(path: str, point_base: int, environ: Mapping[str, str]) -> Path:
    """The payload of this job: the run's, or in a job array that of its sweep point."""
    task = environ.get("SLURM_ARRAY_TASK_ID")
    if task is None:
        return Path(path)
    return RunFolder(Path(path).parent).point(point_base + int(task)).payload


def point_base(args: list[str]) -> int:
    return int(args[args.index("--point-base") + 1]) if "--point-base" in args else 0


def requeue_marker(run_dir: str, job_id: str, restart: int) -> str:
    """Written by the rank API once the ranks checkpointed after a stop signal (policy auto)."""
    return str(RunFolder(Path(run_dir)).requeue_marker(job_id, restart))


def keep_running_on_time_limit_notice(rank: int) -> None:
    """USR2 is the time limit's advance notice (``--signal=B:USR2@margin``), which the job's agent
    forwards so scripts that listen for it can checkpoint (the rank API does). Under plain sbatch a
    script never sees it: a script with no handler runs on to its time limit. Its default action,
    though, ends the process, so each rank starts with a handler that only says it came: a script
    (or the rank API) that installs its own replaces it, and unlike SIG_IGN it is not inherited by
    a program the rank execs."""
    def notice(signum: int, frame: object) -> None:
        try:
            os.write(2, f"[launcher] rank {rank}: the time limit's notice (SIGUSR2) came; this script has no "
                        "handler for it, so it runs on until the time limit\n".encode())
        except OSError:
            pass

    signal.signal(signal.SIGUSR2, notice)


def main(args: list[str], run_rank: Callable[[Mapping[str, Any], int], Any]) -> int:
    """Build this task's rank environment from SLURM's variables, then run the rank."""
    payload = json.loads(payload_path(args[0], point_base(args), os.environ).read_text(encoding="utf-8"))
    env = rank_env_from_slurm(os.environ, payload)
    job_id, restart = slurm_job_id(os.environ), int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    os.environ.update(env.to_environ())
    os.environ.update(payload.get("env", {}))  # the job's variables, computed once by the plan
    os.environ[OrchVar.REQUEUE_MARKER] = requeue_marker(str(payload["run_dir"]), job_id, restart)
    os.environ[OrchVar.ATTEMPT] = str(restart)
    malloc.apply()  # the job's heap settings, which srun started this process without
    import socket

    print(f"[launcher] rank {env.rank}/{env.world_size} (local {env.local_rank}) on {socket.gethostname()}, job "
          f"{job_id} attempt {restart}, master {env.master_addr}:{env.master_port}, {env.init_method}",
          file=sys.stderr, flush=True)
    if payload["init_method"] == "file":
        if env.rank == 0 and restart > 0:
            from orchestrator.launcher import remove_stale_rendezvous_files

            for path in remove_stale_rendezvous_files(str(payload["rendezvous_dir"]), job_id, restart):
                print(f"[launcher] removed the previous attempt's rendezvous file {path}", flush=True)
        os.makedirs(str(payload["rendezvous_dir"]), exist_ok=True)
    keep_running_on_time_limit_notice(env.rank)
    try:
        run_rank(payload, env.rank)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        return 1  # run_rank printed and recorded it
    return 0
