"""One rank of a run ended or frozen on purpose, on its own node: ``python -m orchestrator.backends.slurm.node.chaos_node
RUN_DIR RANK SIGNAL``, the node's side of ``orchestrator chaos`` (run there by ``srun --overlap``,
or called in-process for a local run). The rank is found by its own record (``<run>/ranks/rank-N.json``)
and signalled only while its PID still names it (``procs.signal_if_same``). Once sent, it says so on
stdout (``SENT``) before anything else can happen: ``orchestrator chaos`` takes that line as the
proof, since srun's own exit may report the step torn down as the job restarts its ranks.
Standard library only.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from orchestrator.core import procs
from orchestrator.node.stack_requests import rank_procs

#: The signals chaos sends: SIGKILL (a crash with no traceback, as the OOM killer's) and SIGSTOP (a
#: hang: the rank stops, its peers wait for it in their next collective).
SIGNALS = {"KILL": signal.SIGKILL, "STOP": signal.SIGSTOP}
#: The start of the line this module prints once the signal is sent (``orchestrator.front.chaos`` looks for it).
SENT = "chaos-node: sent"


def signal_rank(run_dir: str | Path, rank: int, name: str) -> str | None:
    """Send ``SIG<name>`` to the rank if it runs here and is still that rank: None when sent, else why not."""
    rp = rank_procs(run_dir).get(rank)
    if rp is None:
        return f"rank {rank} has not recorded itself (not started yet, or the run is not on this version)"
    if not rp.here():
        return f"rank {rank} runs on {rp.host}, not here"
    if not procs.can_identify():
        return "this system cannot confirm that the recorded PID still names the rank (no /proc, no psutil)"
    if not procs.signal_if_same(rp.pid, rp.start_ticks, SIGNALS[name]):
        return f"rank {rank} is not running (it ended, or its attempt is over)"
    return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[2] not in SIGNALS or not args[1].isdigit():
        print("usage: python -m orchestrator.backends.slurm.node.chaos_node RUN_DIR RANK KILL|STOP (run by orchestrator chaos)",
              file=sys.stderr)
        return 2
    why = signal_rank(args[0], int(args[1]), args[2])
    if why is not None:
        print(why, file=sys.stderr)
        return 1
    print(f"{SENT} SIG{args[2]} to rank {args[1]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
