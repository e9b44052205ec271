"""``recovery.survivors: keep`` on the local executor: a rejoin's processes. The decisions are
``orchestrator.core.rejoins`` (shared with the SLURM agent); here each lost rank is forked again
from the run's warm zygote into the running set, and a straggler is killed alone (a rejoined
attempt's moments: ``attempt.mark``).
"""

from __future__ import annotations

import signal
import subprocess
from typing import TYPE_CHECKING, Any

from orchestrator.core.rejoins import Rejoins, say
from orchestrator.node.rank_env import OrchVar

if TYPE_CHECKING:
    from orchestrator.backends.local.forked import ForkedRank, ZygoteGroup

__all__ = ["Rejoins", "kill_rank", "replace", "say"]


def replace(rejoins: Rejoins, group: ZygoteGroup, ranks: list[ForkedRank], forks: list[dict[str, Any]],
            attempt: int) -> list[int]:
    """Announce the next generation and fork each lost rank again into the running set (in
    ``ranks``, the set's processes by rank), every rank's log marking attempt ``attempt``; the
    ranks replaced."""
    lost = rejoins.announce([fork["log"] for fork in forks], attempt)
    for rank in lost:
        ranks[rank] = group.add({**forks[rank], "env": {**forks[rank]["env"],
                                                         OrchVar.HEAL_GENERATION: str(rejoins.generation)}})
    return lost


def kill_rank(proc: ForkedRank) -> None:
    """SIGKILL one rank's session (a straggler its peers wait for) and wait for its end (≤ 5 s)."""
    if proc.poll() is None:
        proc.signal(signal.SIGKILL)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
