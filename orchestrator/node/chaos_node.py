"""One rank of a run ended, frozen or slowed on purpose, on its own node: ``python -m
orchestrator.node.chaos_node RUN_DIR RANK KILL|STOP`` or ``RUN_DIR RANK SLOW FACTOR SECONDS``, the node's side of ``orchestrator chaos`` (run there by ``srun --overlap``,
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


#: A slowed rank's duty cycle (``SLOW``): it runs 1/factor of each period and is stopped the rest.
SLOW_PERIOD_S = 0.2


def slow_rank(run_dir: str | Path, rank: int, factor: float, seconds: float) -> str | None:
    """Make the rank about ``factor`` times slower for ``seconds`` (a SIGSTOP/SIGCONT duty cycle, as a
    throttled GPU or a noisy neighbour would): says ``SENT`` once it began, and leaves the rank
    running (SIGCONT) at the end, or when it is gone. None once done, else why it could not begin."""
    import time

    rp = rank_procs(run_dir).get(rank)
    why = signal_rank(run_dir, rank, "STOP")
    if why is not None or rp is None:
        return why or f"rank {rank} has not recorded itself"
    print(f"{SENT} a {factor:g}x slow-down to rank {rank} for {seconds:g}s", flush=True)
    end, run_s = time.monotonic() + seconds, SLOW_PERIOD_S / factor
    try:
        while time.monotonic() < end:
            time.sleep(SLOW_PERIOD_S - run_s)
            if not procs.signal_if_same(rp.pid, rp.start_ticks, signal.SIGCONT):
                return None  # it ended: nothing left to slow
            time.sleep(run_s)
            if not procs.signal_if_same(rp.pid, rp.start_ticks, signal.SIGSTOP):
                return None
    finally:
        procs.signal_if_same(rp.pid, rp.start_ticks, signal.SIGCONT)
    return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    slow = len(args) == 5 and args[2] == "SLOW"
    if not (slow or len(args) == 3 and args[2] in SIGNALS) or not args[1].isdigit():
        print("usage: python -m orchestrator.node.chaos_node RUN_DIR RANK KILL|STOP|SLOW FACTOR SECONDS "
              "(run by orchestrator chaos)", file=sys.stderr)
        return 2
    why = slow_rank(args[0], int(args[1]), float(args[3]), float(args[4])) if slow else \
        signal_rank(args[0], int(args[1]), args[2])
    if why is not None:
        print(why, file=sys.stderr)
        return 1
    if not slow:
        print(f"{SENT} SIG{args[2]} to rank {args[1]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
