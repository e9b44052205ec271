"""What starts on every rank: export the environment, import the entrypoint, call it.

Locally each rank is ``python -m orchestrator.launcher <payload.json>`` with its RankEnv already
in the environment. On SLURM, submitit unpickles a ``SlurmLauncher`` (see executors/slurm.py),
which builds the RankEnv from SLURM's variables and then calls ``run_rank`` here: the same code
path after that point. Standard library only until the entrypoint imports torch.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Mapping

from orchestrator.records import write_json_atomic


def config_environ(payload: Mapping[str, Any]) -> dict[str, str]:
    """The ORCH_* settings that jobs/runtime.py reads."""
    c = payload["checkpoint"]
    return {
        "ORCH_JOB_NAME": payload["job_name"],
        "ORCH_BACKEND": payload["backend"],
        "ORCH_STRATEGY": payload["strategy"],
        "ORCH_INIT_TIMEOUT_S": str(payload["init_timeout_s"]),
        "ORCH_COLLECTIVE_TIMEOUT_S": str(payload["collective_timeout_s"]),
        "ORCH_RUN_DIR": payload["run_dir"],
        "ORCH_CHECKPOINT_DIR": c["dir"],
        "ORCH_CHECKPOINT_INTERVAL": str(c["interval_steps"]),
        "ORCH_CHECKPOINT_KEEP": str(c["keep_last"]),
        "ORCH_RESUME": "1" if c["resume"] else "0",
    }


def call_entrypoint(entrypoint: str, argv: list[str]) -> Any:
    """``pkg.module:function`` is called with the argument list; a script runs as __main__."""
    if entrypoint.endswith(".py") or ":" not in entrypoint:
        saved = sys.argv
        sys.argv = [entrypoint, *argv]
        sys.path.insert(0, str(Path(entrypoint).parent))
        try:
            runpy.run_path(entrypoint, run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise
        finally:
            sys.argv = saved
        return None
    module_name, func_name = entrypoint.split(":")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    func = getattr(importlib.import_module(module_name), func_name)
    return func(argv)


_FIRST_TITLE: list[str] = []  # the process's own title, before any rank renamed it


def name_process(payload: Mapping[str, Any], rank: int) -> None:
    """``ps`` and ``top`` show the job and the rank ("orchestrator: digits rank 3/4 (python3 -u -m
    ...)"). The original command line stays in the title, so what matches on it still does.
    Optional: without the setproctitle package, nothing changes."""
    try:
        import setproctitle
    except ImportError:
        return
    if not _FIRST_TITLE:
        _FIRST_TITLE.append(setproctitle.getproctitle())
    world = os.environ.get("WORLD_SIZE", "")
    setproctitle.setproctitle(f"orchestrator: {payload['job_name']} rank {rank}{'/' + world if world else ''} "
                              f"({_FIRST_TITLE[0]})")


def run_rank(payload: Mapping[str, Any], rank: int) -> Any:
    """Run the entrypoint on this rank; record the result (rank 0) or the traceback (any rank)."""
    name_process(payload, rank)
    os.environ.update(config_environ(payload))
    run_dir = Path(payload["run_dir"])
    try:
        result = call_entrypoint(payload["entrypoint"], list(payload["argv"]))
    except BaseException as exc:
        write_json_atomic(run_dir / "errors" / f"rank-{rank}.json", {
            "rank": rank, "time": time.time(), "type": type(exc).__name__, "message": str(exc),
            "traceback": traceback.format_exc(),
        })
        raise
    finally:
        remove_rendezvous_file(os.environ.get("ORCH_INIT_METHOD", ""))
    if rank == 0:
        write_json_atomic(run_dir / "result.json", {"finished": time.time(), "result": _jsonable(result)})
    return result


def rendezvous_path(init_method: str) -> str | None:
    """The file behind a file:// init URL, or None for env:// and tcp://."""
    return init_method[len("file://"):] or None if init_method.startswith("file://") else None


def remove_rendezvous_file(init_method: str) -> None:
    """Every rank removes the job's file:// rendezvous file once its entrypoint is over.

    By then every rank has passed the rendezvous (a rank that never joins makes its peers fail
    anyway), and each rank's own store is torn down inside the entrypoint, so the last rank out
    leaves nothing behind even for a script that never tears its process group down.
    """
    path = rendezvous_path(init_method)
    if path:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            print(f"[launcher] could not remove the rendezvous file {path}: {exc}", file=sys.stderr)


def remove_stale_rendezvous_files(rendezvous_dir: str, job_id: str, restart: int) -> list[str]:
    """Before a restart: the earlier attempts' files of this job (never another job's)."""
    from orchestrator.rank_env import rendezvous_file

    removed = []
    for earlier in range(restart):
        path = rendezvous_file(rendezvous_dir, job_id, earlier)
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m orchestrator.launcher PAYLOAD.json (started by the local executor)", file=sys.stderr)
        return 2
    payload = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    rank = int(os.environ.get("RANK", "0"))
    try:
        run_rank(payload, rank)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        return 1
    return 0



class SlurmLauncher:
    """The callable submitit pickles: the rank payload (plain data) and nothing else.

    On each srun task it builds the RankEnv from SLURM's variables, exports it and runs the
    entrypoint through ``run_rank``, like a local rank. If the entrypoint reports that it stopped
    on a signal (USR2 before the time limit, or preemption) and requeues remain, rank 0 requeues
    the job after the checkpoint is written; a finished job never requeues.
    """

    def __init__(self, payload: dict[str, Any], point: int | None = None) -> None:
        self.payload = payload
        self.point = point  # the sweep point, for whoever inspects the pickle (submitit's folder)

    def rank_env(self, environ: Mapping[str, str] | None = None) -> Any:
        from orchestrator.netif import check_interfaces, interface_for
        from orchestrator.rank_env import (RankEnv, derive_port, expand_nodelist, init_url,
                                           rendezvous_file, slurm_visible_devices)

        e = os.environ if environ is None else environ
        p = self.payload
        hosts = expand_nodelist(e["SLURM_JOB_NODELIST"])
        job_id = slurm_job_id(e)
        restart = int(e.get("SLURM_RESTART_COUNT", "0"))
        port = derive_port(job_id, restart) if p["port"] == "auto" else int(p["port"])
        world = int(e["SLURM_NTASKS"])
        nnodes = int(e.get("SLURM_JOB_NUM_NODES", e.get("SLURM_NNODES", "1")))
        local_world = world // max(1, nnodes)
        local_rank = int(e["SLURM_LOCALID"])
        master = hosts[0]
        iface = p["interface"]
        host = socket_hostname()
        if iface in (None, "auto"):
            iface = interface_for(master)
        else:
            check_interfaces(iface.split(","), host)
        rfile = rendezvous_file(p["rendezvous_dir"], job_id, restart)
        if p["init_method"] == "file":
            os.makedirs(p["rendezvous_dir"], exist_ok=True)
        return RankEnv(
            rank=int(e["SLURM_PROCID"]), local_rank=local_rank, world_size=world, local_world_size=local_world,
            node_rank=int(e["SLURM_NODEID"]), nnodes=nnodes, master_addr=master, master_port=port,
            init_method=init_url(p["init_method"], master, port, rfile), interface=iface,
            visible_devices=slurm_visible_devices(e, local_rank, local_world), source="slurm",
        )

    def __call__(self) -> Any:
        env = self.rank_env()
        os.environ.update(env.to_environ())
        restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        if self.payload["init_method"] == "file" and env.rank == 0 and restart > 0:
            for path in remove_stale_rendezvous_files(self.payload["rendezvous_dir"], slurm_job_id(os.environ), restart):
                print(f"[launcher] removed the previous attempt's rendezvous file {path}", flush=True)
        result = run_rank(self.payload, env.rank)
        stopped = isinstance(result, dict) and result.get("stopped") not in (None, "max_steps")
        if stopped and env.rank == 0 and result.get("stopped") != "SIGTERM":  # SIGTERM: scancel, not preemption
            if restart < int(self.payload.get("max_requeues", 0)):
                import subprocess

                job = slurm_job_id(os.environ)
                print(f"[launcher] stopped ({result.get('stopped')}); requeueing {job} "
                      f"(restart {restart + 1} of {self.payload['max_requeues']})", flush=True)
                subprocess.run(["scontrol", "requeue", job], check=False)
            else:
                print(f"[launcher] stopped ({result.get('stopped')}) with no requeues left", flush=True)
        return result


def slurm_job_id(environ: Mapping[str, str]) -> str:
    """The id scontrol and sacct use for this job: '<array job>_<task>' inside an array."""
    if environ.get("SLURM_ARRAY_JOB_ID"):
        return f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    return environ["SLURM_JOB_ID"]


def socket_hostname() -> str:
    import socket

    return socket.gethostname()


if __name__ == "__main__":
    sys.exit(main())
