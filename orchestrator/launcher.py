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


def run_rank(payload: Mapping[str, Any], rank: int) -> Any:
    """Run the entrypoint on this rank; record the result (rank 0) or the traceback (any rank)."""
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
    if rank == 0:
        write_json_atomic(run_dir / "result.json", {"finished": time.time(), "result": _jsonable(result)})
    return result


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


if __name__ == "__main__":
    sys.exit(main())
