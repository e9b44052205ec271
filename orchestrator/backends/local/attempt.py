"""One attempt of a local run, outside the supervisor's loop: every rank's environment, the health
gate before any rank starts, which rank failed first, and the attempt's moments for
recovery.json (``orchestrator.core.attempt_times``)."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path

from orchestrator.backends.local.survivors import Rejoins
from orchestrator.core import procs
from orchestrator.core.errors import SubmissionError
from orchestrator.core.failures import hidden_gpu_hint
from orchestrator.core.payload import Payload
from orchestrator.core.recovery import Failure
from orchestrator.core.rendezvous import derive_port, pick_port, port_is_free, rendezvous_file
from orchestrator.core.run_folder import RunFolder
from orchestrator.core.states import FailureKind
from orchestrator.executors.base import first_error
from orchestrator.node.rank_env import installed_torch_version, local_rank_env, rank_environment
from orchestrator.node.watchdog import Watch
from orchestrator.plan import LaunchPlan


def rank_environments(launch: LaunchPlan, payload: Payload, attempt: int,
                      port_taken_ok: bool = False) -> tuple[int, list[dict[str, str]]]:
    """Every rank's environment for this attempt (``rank_env.rank_environment``, as ``plan`` shows
    it): the planned port, or the next free one should it be taken (refused for a port the spec
    names, unless ``port_taken_ok``: the debug executor's), and a file:// rendezvous file of this
    attempt. Returns the port and the environments."""
    planned = int(payload.port) if payload.port != "auto" else derive_port(launch.run_id, 0)
    if payload.port != "auto" and not port_taken_ok and not port_is_free(planned):
        raise SubmissionError(f"distributed.port {planned} is in use on this machine; pick another or use 'auto'")
    port = pick_port(planned)
    if port is None:
        raise SubmissionError("no free port in the auto range; set distributed.port to a free port")
    rfile = rendezvous_file(payload.rendezvous_dir, launch.run_id, attempt)
    if payload.init_method == "file":
        Path(payload.rendezvous_dir).mkdir(parents=True, exist_ok=True)
    torch_version = installed_torch_version(payload.env)
    return port, [rank_environment(local_rank_env(payload, rank, port, rfile), payload, attempt,
                                   torch_version=torch_version) for rank in range(payload.world_size)]


def mark(times: dict[str, float], watch: Watch, rejoins: Rejoins, run_dir: str) -> None:
    """The attempt's moments (``orchestrator.core.attempt_times``) into ``times``: when every rank joined
    (the watchdog saw it; not for an attempt that began as a rejoin, whose joins the watchdog saw
    are the ranks' first group's), the rank API's first and last steps. Nothing for an attempt
    that started no rank."""
    from orchestrator.core import attempt_times

    if "ranks_at" not in times:
        return
    if rejoins.began_at is None:
        times.update(attempt_times.joined_at(watch.joined, watch.world_size))
    times.update(attempt_times.progress_at(watch))
    try:
        times.update(attempt_times.progress_marks(run_dir, watch.world_size, times["ranks_at"]))
    except OSError:
        pass


def health_gate(payload: Payload, attempt: int) -> Failure | None:
    """The health gate (``orchestrator.node.health``) for this machine, before any rank starts: the
    failure (unhealthy) when it fails, else None."""
    if not payload.recovery.health_check:
        return None
    from orchestrator.node import health, shared_folders

    node = socket.gethostname()
    for line in shared_folders.write_agent_token(payload.run_dir, payload.checkpoint.dir, attempt, node):
        print(f"[orchestrator] health gate: {line}", file=sys.stderr)
    result = health.check_node(node, payload.run_dir, payload.checkpoint.dir, attempt,
                               interface=None, gpus=len(payload.devices or ()),
                               node_check=payload.recovery.node_check,
                               environ={**os.environ, **({"CUDA_VISIBLE_DEVICES": ",".join(map(str, payload.devices))}
                                                       if payload.devices else {})})
    health.write_result(payload.run_dir, attempt, result)
    shutil.rmtree(health.checkpoint_tokens(payload.checkpoint.dir, attempt).parent, ignore_errors=True)
    if result.ok:
        return None
    why = f"the health gate failed on {node}: {'; '.join(result.problems)}"
    print(f"[orchestrator] {why}", file=sys.stderr, flush=True)
    return Failure(FailureKind.UNHEALTHY, why)


def first_failure(failed: list[int], codes: list[int | None], run_dir: Path,
                  devices: tuple[int, ...] | None) -> tuple[int, str]:
    """Prefer a rank killed by a signal (peers then fail because it vanished), then the
    earliest traceback. A rank that recorded a traceback before a signal ended it raised
    first: the signal came at its exit (torch can abort there while a group is still up),
    as on SLURM, where the traceback is the report too."""
    folder = RunFolder(run_dir)
    by_signal = [r for r in failed if (codes[r] or 0) < 0 and not folder.error(r).is_file()]
    err = first_error(run_dir)
    if by_signal:
        rank = by_signal[0]
        message = f"rank {rank} was killed by signal {procs.signal_name(-(codes[rank] or 0))}"
    elif err is not None and err.rank in failed:
        rank = err.rank
        message = err.said()
        hint = hidden_gpu_hint(err.message, devices)
        message += f"\n{hint}" if hint else ""
    else:
        rank = failed[0]
        message = f"rank {rank} exited with code {codes[rank]}"
    return rank, message
