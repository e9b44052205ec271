"""``recovery.survivors: keep``: the launcher's decisions on a rejoin, for every backend.

When a rank fails (or the stall watchdog names a straggler, killed alone) while its peers run on,
and every peer said it can rejoin (``jobs.Healer`` wrote ``<run>/heal/ready/rank-N``), the
attempt ends there and the next one begins without stopping anyone: ``Rejoins.announce`` writes
the generation file naming the replaced ranks and the rank whose state every rank takes (the
lowest survivor), and the backend starts each lost rank again with ``ORCH_HEAL_GENERATION``
(locally forked from the run's warm zygote, on SLURM as a step of one task on the rank's node).
The ranks do the rest (``jobs.heal``). A rejoin is complete once every rank wrote
``heal/rejoined/g<G>-rank-R``; one that never completes, or survivors that end before it does
(they had finished their work), make every rank restart as ``survivors: restart`` does.
Progress, for ``recovery.stop_without_progress``, is a new checkpoint or a step past the previous
attempt's: the same failure at the same step stops the run. Standard library only.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from orchestrator.core.attempt_logs import local_marker
from orchestrator.core.atomic_files import write_json_atomic
from orchestrator.core.recovery import Decision, Failure, History, decide
from orchestrator.core.run_folder import RunFolder
from orchestrator.core.states import Action

if TYPE_CHECKING:
    from orchestrator.core.payload import Payload
    from orchestrator.core.recovery import Attempt


class Rejoins:
    """One set of ranks' rejoins: which ranks were lost, the group's generation, when it began."""

    def __init__(self, payload: Payload) -> None:
        self.payload = payload
        self.folder = RunFolder(Path(payload.run_dir))
        self.lost: list[int] = []  # failed (or killed as the straggler) while the others ran on
        self.generation = 0
        self.began_at: float | None = None  # when the last generation's replacements were forked
        self.complete = False  # every rank holds the last generation's state (once seen, kept)
        self.furthest_step = -1.0  # the furthest step an attempt reached (the point's, kept across sets)

    def reset(self) -> None:
        """A new set of ranks (every rank started): no generation yet."""
        self.lost, self.generation, self.began_at, self.complete = [], 0, None, False

    def may_rejoin(self, failed: list[int], codes: list[int | None], stopping: bool, able: bool) -> bool:
        """Whether the ranks that failed may be replaced beside the others: asked for, not while
        stopping, some rank still running, every one of them able to rejoin, the backend able to
        start a replacement (``able``: locally the zygote alive), and the last rejoin (if any)
        complete."""
        if self.payload.recovery.survivors != "keep" or stopping or not able:
            return False
        if not failed or not any(c is None for c in codes) or len(failed) == len(codes):
            return False
        unready = [r for r, c in enumerate(codes) if c is None and not self.folder.heal_ready(r).is_file()]
        if unready:  # not on the rank API's Healer: handing on its state is the script's, it cannot rejoin
            say(f"recovery.survivors: keep, but rank(s) {', '.join(map(str, unready[:8]))} cannot rejoin (the script "
                "does not use jobs.Healer): every rank restarts")
            return False
        if self.began_at is not None and not self.is_complete(len(codes)):
            say(f"the rejoin of generation {self.generation} never completed: every rank restarts")
            return False
        return True

    def is_complete(self, world_size: int) -> bool:
        if not self.complete and self.began_at is not None:
            self.complete = all(self.folder.heal_rejoined(self.generation, r).is_file() for r in range(world_size))
        return self.complete

    def stranded(self, codes: list[int | None]) -> str | None:
        """Why the replacements can never be joined, or None: after a rejoin not yet complete, a
        rank ended (exit 0) while another still runs (the survivors had finished their work
        when a rank died in its exit)."""
        if self.began_at is None or self.complete or not any(c == 0 for c in codes):
            return None
        if all(c is not None for c in codes) or self.is_complete(len(codes)):
            return None
        ended = ", ".join(str(r) for r, c in enumerate(codes) if c == 0)
        return f"rank(s) {ended} ended before the replaced rank(s) rejoined them (generation {self.generation}): " \
               "every rank restarts"

    def announce(self, logs: Sequence[str | Path], attempt: int) -> list[int]:
        """Announce the next generation (the lost ranks, the survivor whose state every rank
        takes) and mark attempt ``attempt`` in every rank's log (``logs``, by rank): the ranks to
        start again, each with ``ORCH_HEAL_GENERATION`` = ``self.generation``."""
        lost, self.lost = self.lost, []
        self.generation += 1
        source = min(r for r in range(len(logs)) if r not in lost)
        self.folder.heal.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.folder.heal_generation, {"generation": self.generation, "replaced": lost,
                                                        "source": source})
        try:  # the lost ranks' tracebacks go with the attempt that ended, as before a restart
            self.folder.keep_failures()
        except OSError as exc:
            say(f"the failed attempt's tracebacks were not kept: {exc}")
        for rank in lost:  # a stand-in has not joined yet: its predecessor's markers go (the watchdog reads them)
            for marker in (self.folder.joined(rank), self.folder.calling(rank)):
                try:
                    marker.unlink()
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    say(f"rank {rank}'s join marker {marker} stays ({exc}): its stand-in counts as joined")
        self.began_at, self.complete = time.time(), False
        for rank, path in enumerate(logs):  # every rank's log marks the new attempt (logs --attempt)
            how = "replaced" if rank in lost else "kept its process"
            try:
                with open(path, "ab") as log:
                    log.write(f"{local_marker(attempt)}[orchestrator] rank {rank} {how}: "
                              f"rank(s) {', '.join(map(str, lost))} rejoin the survivors (generation "
                              f"{self.generation}, state from rank {source})\n".encode())
            except OSError:
                pass  # a log that cannot be written loses its marker, not the rejoin
        return lost

    def progressed(self, history: History, attempt: Attempt, times: dict[str, float]) -> bool:
        """The attempt's progress: a new checkpoint, or (survivors kept, so no checkpoint need be
        written to go on) a step past every earlier attempt's."""
        by_checkpoint = history.progressed(attempt, self.payload.checkpoint.dir)
        if self.payload.recovery.survivors != "keep":
            return by_checkpoint
        stepped = times.get("last_step", -1.0) > self.furthest_step
        if stepped and not by_checkpoint:
            times["stepped"] = 1.0  # status: "trained past the last attempt's step", not "new checkpoint"
        self.furthest_step = max(self.furthest_step, times.get("last_step", -1.0))
        return by_checkpoint or stepped

    def end_attempt(self, history: History, attempt: Attempt, failure: Failure, times: dict[str, float]) -> Decision:
        """Recovery's decision on the attempt a rejoin would end; recorded (a restart) if it allows one."""
        progressed = self.progressed(history, attempt, times)
        decision = decide(self.payload.recovery, history, failure, progressed)
        if decision.restart:
            history.finish(attempt, failure.kind, failure.why, progress=progressed, blamed=failure.blamed,
                           action=Action.RESTART)
            say(f"{decision.message}; rank(s) {', '.join(map(str, self.lost))} replaced beside the survivors")
        return decision



def say(line: str) -> None:
    print(f"[orchestrator] {line}", file=sys.stderr, flush=True)
