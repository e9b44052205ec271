"""What a job's start will do at its size, as ``plan`` says it (issue 36): the srun steps, the
rendezvous every rank joins, and what the job's watchdog then reads each second. One line, built
from the plan and from the constants of the modules that do the work, so a 1,024-node job's start
is read before it is paid for. Pure: no file, no scheduler, no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional

from orchestrator.backends import planner

if TYPE_CHECKING:
    from orchestrator.plan import LaunchPlan

#: PyTorch's published figure for the rendezvous at scale: its TCPStore's libuv server connects
#: 96K ranks in about 100 s. Quoted (issue 36), not measured here.
TCPSTORE_ANCHOR = "PyTorch measured about 100 s for 96K ranks on the libuv server"
#: From how many ranks the plan quotes that anchor: below it the rendezvous takes well under a second.
ANCHOR_FROM_RANKS = 1024


def start_line(launch: LaunchPlan) -> str:
    """``start-up: ...``: the steps, the rendezvous and the steady reads of this plan."""
    nodes, world, per_node = launch.nodes, launch.world_size, launch.ranks_per_node
    spec, payload = launch.spec, launch.payload
    parts = [planner(launch.executor).steps_line(nodes, world, per_node, payload)]
    if world > 1:
        parts.append(_rendezvous(spec.distributed.init_method, world, spec.distributed.init_timeout_s, spec.env))
    parts.append(_watchdog_reads(nodes, world, payload.watchdog.stall_s))
    return "start-up: " + "; ".join(parts)


def _rendezvous(init_method: str, world: int, init_timeout_s: float, env: Mapping[str, str]) -> str:
    bound = f"within distributed.init_timeout_s, {init_timeout_s:g}s"
    if init_method == "file":
        scale = (f"; at {world} ranks that file is a lock storm on the shared filesystem: use init_method env "
                 "(a TCPStore)" if world >= ANCHOR_FROM_RANKS else "")
        return f"the {world} ranks meet in a FileStore, one shared file every rank locks and reads ({bound}){scale}"
    libuv = env.get("USE_LIBUV", "1").strip() not in ("0", "false", "False")
    server = "its libuv server (torch's default)" if libuv else \
        "the old server, not libuv (USE_LIBUV=0 in env: remove it at large worlds)"
    anchor = f"; {TCPSTORE_ANCHOR}" if world >= ANCHOR_FROM_RANKS else ""
    return f"the {world} ranks connect to rank 0's TCPStore, {server} ({bound}){anchor}"


def _watchdog_reads(nodes: int, world: int, stall_s: Optional[float]) -> str:
    """What the job's watchdog reads a second once every rank runs (``orchestrator.node.forensics``)."""
    if not stall_s:
        return "once every rank has joined, nothing is read of the ranks' files (watchdog.stall_s is off)"
    from orchestrator.node.forensics import cover_looks, files_per_look

    def every(share: int, of: int) -> str:
        return "each a second" if share >= of else f"each at least every {cover_looks(stall_s)}s"

    share, logs = files_per_look(nodes, stall_s), files_per_look(world, stall_s)
    return (f"the stall watchdog reads {share} of the {nodes} heartbeat file(s) a second, one a node "
            f"({every(share, nodes)}); a rank that sends no heartbeat (a script without the rank API) has its "
            f"log's size read instead: {logs} of the {world} log(s) a second ({every(logs, world)})")
