"""The health gate: every node of an allocation checked before any rank starts.

A node that cannot write the run folder, does not share it with the others, has no disk left,
lacks the job's interface or GPUs, or fails the site's own check would otherwise show up as a
rank that hangs in init_process_group or dies an hour later in a checkpoint save, blamed on the
code. Here each such fault is one line naming the node, what is wrong and what to do, written
to ``<run>/health/attempt-<K>/<node>.json`` for the agent (or the local supervisor) to read.

On SLURM the job's agent runs it as one srun task per node::

    python -m orchestrator.node.health --run-dir RUN --checkpoint-dir CKPT --attempt K \\
        [--interface IF] [--gpus N] [--disk-floor-mb M] [--token-wait-s S] [--node-check-json '[...]']

locally the supervisor calls :func:`check_node` for the one machine. Standard library only, and
quick (a healthy node takes a few milliseconds, and one look for the job agent's token): it
runs on every node before every attempt.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# shlex, signal, subprocess, shutil and socket are imported where a failing node or node_check needs
# them, typing never: the gate runs on every node before every attempt (docs/PERFORMANCE.md).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Mapping, Sequence

from orchestrator.core.fs_checks import errno_text, shown
from orchestrator.core.atomic_files import write_json_atomic
from orchestrator.node.shared_folders import (CHECKPOINT_DIR, RUNS_DIR, not_shared, token_folders,
                                              wait_for_agent_token)
from orchestrator.node.shared_folders import checkpoint_tokens, health_dir  # noqa: F401  (health.health_dir, as ever)

#: Free space (MiB) a node needs under the run folder and the checkpoint folder. 1 GiB holds the
#: logs, stack dumps and metrics of a long run and a small model's checkpoint; below it a run
#: would likely die of ENOSPC mid-save (a truncated checkpoint) instead of failing here, named.
#: Jobs with large checkpoints should ask for more (--disk-floor-mb).
DISK_FLOOR_MB = 1024

#: How long a node waits to see the job agent's token (``shared_folders``). The agent writes it
#: before the gate's tasks start, so a healthy node sees it at its first look; the rest is for a
#: shared filesystem that is slow to show another client's new file: NFS caches a folder's
#: attributes up to acdirmax (60 s by default). Only a node that really does not share the folder
#: waits it out.
TOKEN_WAIT_S = 60.0

#: recovery.node_check gets this long before it is killed and the node marked unhealthy.
NODE_CHECK_TIMEOUT_S = 60.0

#: Where a real NVIDIA driver lists the node's GPUs (one folder each). Absent on nodes without
#: the driver, such as deploy/'s cluster, whose GPUs are GRES over character devices.
NVIDIA_GPUS_DIR = "/proc/driver/nvidia/gpus"

#: Where SLURM (and CUDA) say which GPUs this node's job step was given, most specific first:
#: the step's own binding before the job's (the job's is the batch node's on a multi-node job).
GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "GPU_DEVICE_ORDINAL")

_LINE_MAX = 300


@dataclass(frozen=True)
class NodeHealth:
    """One node's verdict: ``ok`` exactly when there are no problems."""

    node: str
    ok: bool
    problems: tuple[str, ...]  # one line each: what is wrong, and what to do
    seconds: float  # how long the checks took
    unshared: tuple[str, ...] = ()  # the fields (runs_dir, checkpoint.dir) whose agent token it did not see

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "ok": self.ok, "problems": list(self.problems), "seconds": self.seconds,
                "unshared": list(self.unshared)}

    @classmethod
    def from_dict(cls, data: Any) -> NodeHealth:
        """Raises ValueError on anything but what :meth:`to_dict` writes (a truncated or foreign file)."""
        if not isinstance(data, dict):
            raise ValueError("a health result is not a JSON object")
        node, ok, problems, seconds = (data.get(k) for k in ("node", "ok", "problems", "seconds"))
        unshared = data.get("unshared", [])
        if (not isinstance(node, str) or not isinstance(ok, bool) or not isinstance(problems, list)
                or not all(isinstance(p, str) for p in problems)
                or not isinstance(seconds, (int, float)) or isinstance(seconds, bool)
                or not isinstance(unshared, list) or not all(u in (RUNS_DIR, CHECKPOINT_DIR) for u in unshared)):
            raise ValueError("a health result lacks node, ok, problems or seconds, or has the wrong types")
        return cls(node=node, ok=ok, problems=tuple(problems), seconds=float(seconds), unshared=tuple(unshared))


def node_file_name(node: str) -> str:
    """A node name as a file name (a host name never holds '/', but the CLI's argument may)."""
    name = node.replace("/", "_").replace("\0", "_")
    return "_" + name if name in {"", ".", ".."} or name.startswith(".") else name


def result_name(node: str) -> str:
    """The file name of a node's verdict in the attempt's health folder."""
    return f"{node_file_name(node)}.json"


def check_node(node: str, run_dir: str, checkpoint_dir: str, attempt: int,
               interface: str | None = None, gpus: int = 0, node_check: Sequence[str] | None = None,
               disk_floor_mb: int = DISK_FLOOR_MB, token_wait_s: float = TOKEN_WAIT_S,
               environ: Mapping[str, str] | None = None) -> NodeHealth:
    """Run every check on this node (none stops the others) and say what failed.

    Whether this node shares the folders with the job's agent (its token, ``shared_folders``) is
    looked at last, so that a filesystem slow to show the token overlaps the other checks."""
    start = time.monotonic()
    env = os.environ if environ is None else environ
    problems: list[str] = []

    def guarded(what: str, check: Any, *args: Any) -> Any:
        try:
            return check(*args)
        except Exception as exc:  # a bug or an odd node must still give a verdict, not a traceback
            problems.append(f"the {what} check failed on {node}: {type(exc).__name__}: {exc}; "
                            "report this with the run folder")
            return None

    run_problem = guarded("folder", _writable, run_dir, node, False)
    ckpt_problem = guarded("folder", _writable, checkpoint_dir, node, True)
    problems += [p for p in (run_problem, ckpt_problem) if p]
    token_deadline = time.monotonic() + token_wait_s
    problems += [p for p in (guarded("disk", _disk, (run_dir, checkpoint_dir), disk_floor_mb),
                             guarded("interface", _interface, interface), guarded("GPU", _gpus, node, gpus, env),
                             guarded("node_check", _node_check, node, node_check, env)) if p]
    unshared: list[str] = []
    failed = {RUNS_DIR: run_problem, CHECKPOINT_DIR: ckpt_problem}
    for field, folder, named in token_folders(run_dir, checkpoint_dir, attempt):
        if failed[field]:
            continue  # said already; there is no point waiting
        problem = guarded("token", wait_for_agent_token, folder, node, named, field, token_deadline, token_wait_s)
        if problem:
            problems.append(problem)
            unshared.append(field)
    return NodeHealth(node=node, ok=not problems, problems=tuple(problems),
                      seconds=round(time.monotonic() - start, 3), unshared=tuple(unshared))


# -- 1. the folders are writable -----------------------------------------------------------------

def _writable(folder: str, node: str, create: bool) -> str | None:
    """Write, fsync, read back and remove a small file: a folder that is read-only, full, over
    quota or on a dead mount fails here, naming the folder and the kernel's reason."""
    what = "checkpoint folder" if create else "run folder"
    probe = Path(folder) / f".health-probe-{node_file_name(node)}-{os.getpid()}"
    data = f"{node} {os.getpid()}\n".encode()
    step = "create"
    try:
        if create:
            Path(folder).mkdir(parents=True, exist_ok=True)
        elif not os.path.isdir(folder):
            return (f"the {what} {shown(folder)} does not exist on {node} (or is not a folder): "
                    "is runs_dir mounted on every node?")
        step = "write a file in"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        step = "read back a file in"
        if probe.read_bytes() != data:
            return (f"the {what} {shown(folder)} on {node} gave back other bytes than were written: "
                    "the filesystem is failing; drain the node or fix the mount")
        step = "remove a file from"
        probe.unlink()
    except OSError as exc:
        try:
            probe.unlink(missing_ok=True)
        except OSError:
            pass
        return (f"cannot {step} the {what} {shown(folder)} on {node}: {errno_text(exc)}; make it writable "
                "there (permissions, quota, free space, a read-only or dead mount)")
    return None


# -- 3. free disk --------------------------------------------------------------------------------

def _disk(folders: Sequence[str], floor_mb: int) -> str | None:
    """Each filesystem once (the checkpoint folder is often inside the run folder). A folder that
    does not exist was reported by the writability check."""
    low: list[str] = []
    devices: set[int] = set()
    for folder in folders:
        try:
            device = os.stat(folder).st_dev
            fs = os.statvfs(folder)  # what shutil.disk_usage reads, without importing shutil
            free_mb = fs.f_bavail * fs.f_frsize // (1024 * 1024)
        except OSError:
            continue
        if device in devices:
            continue
        devices.add(device)
        if free_mb < floor_mb:
            low.append(f"under {shown(folder)} is {free_mb} MB")
    if not low:
        return None
    return (f"free disk {' and '.join(low)}, below the floor of {floor_mb} MB: free space there, or lower the "
            "floor (--disk-floor-mb) if the job's checkpoints and logs are smaller")


# -- 4. the interface ----------------------------------------------------------------------------

def _interface(setting: str | None) -> str | None:
    """Resolved as the ranks will resolve it (orchestrator.core.netif): names, prefixes, '=' exact.
    'auto' is settled by the route at launch, and an NCCL exclusion ('^...') is NCCL's to apply."""
    if not setting or setting == "auto" or setting.startswith("^"):
        return None
    from orchestrator.core.netif import expand_names

    try:
        expand_names(setting)
    except RuntimeError as exc:
        return str(exc)
    return None


# -- 5. GPUs -------------------------------------------------------------------------------------

def _granted(environ: Mapping[str, str]) -> tuple[int, str, bool] | None:
    """How many GPUs this node's step may use, the variable that says so, and whether they are
    MIG slices (several to a GPU); None when no variable says. A negative index ends CUDA's list
    (what follows it is ignored), and SLURM writes NoDevFiles when the step has no devices."""
    for name in GPU_VARIABLES:
        value = environ.get(name)
        if value is None:
            continue
        items: list[str] = []
        for item in (i.strip() for i in value.split(",")):
            if not item or item.startswith("-") or item == "NoDevFiles":
                break
            items.append(item)
        return len(items), f"{name}={value}", any(i.startswith("MIG-") for i in items)
    return None


def _driver_gpus() -> int | None:
    try:
        return len(os.listdir(NVIDIA_GPUS_DIR))
    except OSError:
        return None


def _gpus(node: str, wanted: int, environ: Mapping[str, str]) -> str | None:
    """SLURM granted the GPUs (deploy/'s fake GRES GPUs pass on that alone), and where a real
    driver is loaded it still sees them (a GPU fallen off the bus leaves the grant as it was).
    Without any variable every GPU the driver lists is visible, as CUDA sees it."""
    if wanted <= 0:
        return None
    driver = _driver_gpus()
    granted = _granted(environ)
    if granted is None and driver is None:
        return (f"no GPUs were granted on {node} (none of {', '.join(GPU_VARIABLES)} is set, and no NVIDIA "
                f"driver lists any), the job needs {wanted} per node: ask SLURM for them (gpus_per_node) "
                "or run on GPU nodes")
    count, source, mig = granted or (driver or 0, f"{NVIDIA_GPUS_DIR} lists {driver}", False)
    if count < wanted:
        return (f"{node} was granted {count} GPU(s) ({source}), the job needs {wanted} per node: check the "
                f"request (gpus_per_node) and the node's GRES (scontrol show node {node})")
    if driver is not None and driver < wanted and not mig:
        return (f"the NVIDIA driver on {node} lists {driver} GPU(s) under {NVIDIA_GPUS_DIR}, fewer than the "
                f"{wanted} the job needs ({source}): a GPU is lost (dmesg: Xid, fallen off the bus); drain "
                f"the node (scontrol update nodename={node} state=drain reason=gpu) and have it looked at")
    return None


# -- 6. the site's own check ---------------------------------------------------------------------

def _last_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if not lines:
        return "(no output)"
    line = lines[-1]
    return line if len(line) <= _LINE_MAX else line[:_LINE_MAX - 3] + "..."


def _node_check(node: str, argv: Sequence[str] | None, environ: Mapping[str, str]) -> str | None:
    """recovery.node_check, run without a shell in its own session (so a timeout kills what it
    started too), its output and errors read together for the last line."""
    if not argv:
        return None
    import shlex
    import signal
    import subprocess

    head = f"recovery.node_check ({shlex.join(argv)[:200]}) failed on {node}"
    env = {**environ, "ORCH_HEALTH_NODE": node}
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    except OSError as exc:
        reason = "program not found" if isinstance(exc, FileNotFoundError) else "cannot run it"
        return (f"{head}: {reason}: {errno_text(exc)}: install it on every node, or give its full path in "
                "recovery.node_check")
    try:
        out, _ = proc.communicate(timeout=NODE_CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        out, _ = proc.communicate()
        return (f"{head}: timed out after {NODE_CHECK_TIMEOUT_S:g}s: "
                f"{_last_line(out.decode(errors='replace'))}")
    if proc.returncode == 0:
        return None
    code = proc.returncode
    status = f"exit code {code}" if code > 0 else f"killed by {_signal_name(-code)}"
    return f"{head}: {status}: {_last_line(out.decode(errors='replace'))}"


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# -- results -------------------------------------------------------------------------------------

def write_result(run_dir: str, attempt: int, health: NodeHealth) -> Path:
    """``<health dir>/<node>.json``, replaced atomically: a reader never sees half a verdict."""
    path = health_dir(run_dir, attempt) / result_name(health.node)
    write_json_atomic(path, health.to_dict())
    return path


def read_results(run_dir: str, attempt: int, nodes: Sequence[str]) -> dict[str, NodeHealth]:
    """Every node's verdict; a node without a readable one failed the gate: silence from a node
    is what a dead node, a failed srun task or a hung filesystem look like."""
    folder = health_dir(run_dir, attempt)
    out: dict[str, NodeHealth] = {}
    for node in nodes:
        try:
            out[node] = NodeHealth.from_dict(json.loads((folder / result_name(node)).read_text(encoding="utf-8")))
        except (OSError, ValueError):
            out[node] = NodeHealth(node=node, ok=False, seconds=0.0, problems=(
                f"the health check did not report from {node} (it never started there, or died)",))
    return out


def unhealthy(results: Mapping[str, NodeHealth], agent_node: str | None = None,
              folders: Mapping[str, str] | None = None) -> dict[str, str]:
    """The failing nodes, each with its problems on one line (for status and the exclude list).
    With the agent's node and the folders (field -> folder) the nodes must share: every node when
    most of them do not see the agent's token in one (``shared_folders.not_shared``)."""
    bad = {node: "; ".join(h.problems) or "unhealthy" for node, h in results.items() if not h.ok}
    if agent_node is not None and folders:
        unseen = {node: h.unshared for node, h in results.items()}
        for node, line in not_shared(unseen, list(results), agent_node, folders).items():
            bad[node] = f"{bad[node]}; {line}" if node in bad and line not in bad[node] else line
    return bad


def this_node(environ: Mapping[str, str] | None = None) -> str:
    """This node's name as SLURM knows it (what socket.gethostname() says, elsewhere)."""
    env = os.environ if environ is None else environ
    return env.get("SLURMD_NODENAME") or os.uname().nodename


# -- the command ---------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m orchestrator.node.health",
                                description="Check this node before the job's ranks start; write the verdict "
                                "to <run-dir>/health/attempt-<K>/<node>.json. Exit 0 when healthy, 1 if not.")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--attempt", type=int, required=True)
    p.add_argument("--interface", default=None)
    p.add_argument("--gpus", type=int, default=0, help="GPUs the job needs on each node")
    p.add_argument("--disk-floor-mb", type=int, default=DISK_FLOOR_MB)
    p.add_argument("--token-wait-s", type=float, default=TOKEN_WAIT_S)
    p.add_argument("--node-check-json", default=None, help="recovery.node_check as a JSON list of strings")
    return p


def clear_staging_left(run_dir: str) -> int:
    """Remove what ranks killed in this run's earlier attempts left on this node (their heartbeat
    staging folders in /dev/shm: a rank that leaves removes its own); before any rank of this
    attempt starts, every such folder of the run is a leftover; so is any folder of this user's
    there that nothing touched for ``node_local.STALE_S``, whatever run left it). Returns how many
    were removed."""
    from orchestrator.core import node_local
    from orchestrator.core.progress import staging_dirs

    folders = staging_dirs(run_dir)
    removed = node_local.sweep_stale()
    if not folders:
        return removed
    import shutil

    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
        removed += not folder.exists()
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    node_check: list[str] | None = None
    if args.node_check_json:
        try:
            node_check = json.loads(args.node_check_json)
        except ValueError as exc:
            parser.error(f"--node-check-json is not JSON ({exc}): give a list of strings, e.g. '[\"/bin/true\"]'")
        if not isinstance(node_check, list) or not node_check or not all(isinstance(a, str) for a in node_check):
            parser.error("--node-check-json must be a non-empty JSON list of strings, e.g. '[\"/bin/true\"]'")
    node = this_node()
    cleared = clear_staging_left(args.run_dir)
    if cleared:
        print(f"health: {node}: removed {cleared} heartbeat staging folder(s) that killed ranks "
              "left in node-local memory", file=sys.stderr)
    health = check_node(node, args.run_dir, args.checkpoint_dir, args.attempt, interface=args.interface,
                        gpus=args.gpus, node_check=node_check, disk_floor_mb=args.disk_floor_mb,
                        token_wait_s=args.token_wait_s)
    for problem in health.problems:
        print(f"health: {node}: {problem}", file=sys.stderr)
    try:
        write_result(args.run_dir, args.attempt, health)
    except OSError as exc:
        print(f"health: {node}: cannot write the result under {shown(str(health_dir(args.run_dir, args.attempt)))}: "
              f"{errno_text(exc)}; the node will count as not reporting", file=sys.stderr)
        return 1
    return 0 if health.ok else 1


if __name__ == "__main__":
    sys.exit(main())
