"""Whether ranks told to stop can still end on their own, or are stuck for good.

``orchestrator cancel`` sends SIGTERM and gives the ranks ``stop_grace_s`` to checkpoint and
exit. A Python signal handler runs between bytecodes of the main thread only: a rank blocked in
C++ (a gloo collective, DDP's gradient all-reduce at the end of ``backward``) runs it only once
that returns. When SIGTERM finds the ranks at different places, a handler that does a collective
(Lightning's broadcasts a flag from rank 0) on one rank is matched against another collective on
its peers, and neither ever completes: every rank waits until the collective timeout (30 min by
default), and the stop takes all of ``stop_grace_s`` before SIGKILL. Under a plain ``scancel``
srun ends such ranks at once (it SIGKILLs its tasks on SIGTERM); this tells the orchestrator's
own stop when no grace can help, so it ends them as soon.

The judgement, the same for the local supervisor and the SLURM job's agent (they differ only in
how they ask for the stacks: ``stack_requests.request_local``, ``stacks_probe.request_slurm``):
the ranks are stuck when, at two looks at least ``STUCK_S`` apart, every rank's main thread waits
in a torch.distributed collective (``stacks.in_collective``), each one in the same stack both
times, and the ranks are not all in one and the same stack. Ranks all in one call are a
collective under way (a large all-reduce takes its time); ranks that wait in different calls and
stay there have nothing left to match. Any rank that did not answer, or that runs outside a
collective (writing a checkpoint, in its own code), means the stop is under way: the ranks keep
their grace. So a script that checkpoints on SIGTERM (the rank API agrees on the stop at a step
boundary, then writes) keeps its ``stop_grace_s``; only a stop that no grace can finish is cut
short. The one state this misjudges: one collective called from different lines on different
ranks (``if rank == 0: broadcast(...) else: broadcast(...)``) whose transfer takes longer than
``STUCK_S`` while a stop is under way.

Standard library only (the SLURM job's agent imports it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from orchestrator.core import stacks

#: The first look, this long after SIGTERM: the ranks' handlers have started by then.
FIRST_LOOK_S = 1.0
#: A stuck picture must hold this long (between two looks) to count.
STUCK_S = 2.0
#: While the ranks are not stuck, the looks space out from FIRST_LOOK_S up to this (on SLURM a
#: look is an ``srun --overlap`` step on every node: a few while the ranks checkpoint, no more).
MOST_GAP_S = 8.0

#: A rank's main-thread stack, innermost frame first: (file, line, function) per frame.
Stack = tuple[tuple[str, int, str], ...]


@dataclass(frozen=True)
class Stuck:
    """The verdict: every rank waits in a collective that cannot complete."""

    after_s: float  # seconds from the stop's SIGTERM to the verdict
    waits: dict[str, str]  # rank -> where its main thread waits (``stacks.Where.text``)

    def message(self, grace_s: float) -> str:
        """The run's error line (``status`` shows it, with the ranks' places from ``waits``)."""
        return (f"the ranks were stuck after SIGTERM, each waiting in a collective that cannot complete (as when a "
                f"SIGTERM handler's collective meets another one on its peers; where each waited is below): killed "
                f"{self.after_s:.0f}s after SIGTERM instead of after stop_grace_s ({grace_s:g}s)")


@dataclass
class StopJudge:
    """Looks at the ranks' stacks while a stop is under way (``due``, then ``look``)."""

    started: float  # monotonic time the ranks were sent SIGTERM
    world: int  # ranks 0..world-1: every one must answer for a verdict
    _next: float = field(init=False)
    _gap: float = field(init=False, default=FIRST_LOOK_S)
    _candidate: tuple[float, dict[int, Stack]] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self._next = self.started + FIRST_LOOK_S

    def due(self, now: float) -> bool:
        """Whether it is time to ask the ranks for their stacks."""
        return now >= self._next

    def look(self, at: float, dumps: Mapping[int, str]) -> Stuck | None:
        """Judge the ranks' dumps, asked for at ``at`` (monotonic); ''/missing: no answer."""
        blocked = blocked_stacks(dumps, self.world)
        if blocked is None or len(set(blocked.values())) < 2:
            self._candidate = None
            self._gap = min(MOST_GAP_S, self._gap * 2)
            self._next = at + self._gap
            return None
        if self._candidate is not None and self._candidate[1] == blocked and at - self._candidate[0] >= STUCK_S:
            return Stuck(after_s=at - self.started, waits={str(r): stacks.where(dumps[r]).text()
                                                           for r in sorted(blocked)})
        if self._candidate is None or self._candidate[1] != blocked:
            self._candidate = (at, blocked)
        self._next = self._candidate[0] + STUCK_S
        return None


def blocked_stacks(dumps: Mapping[int, str], world: int) -> dict[int, Stack] | None:
    """Every rank's main-thread stack, if every rank of the world answered and waits in a
    collective; else None."""
    out: dict[int, Stack] = {}
    for rank in range(world):
        thread = stacks.main_thread(stacks.parse(dumps.get(rank) or ""))
        if thread is None or stacks.in_collective(thread.frames) is None:
            return None
        out[rank] = tuple((f.filename, f.line, f.function) for f in thread.frames)
    return out
