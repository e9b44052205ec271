"""``recovery.survivors: keep`` on the local executor: the supervisor's side of a rejoin.

When a rank fails (or the stall watchdog names a straggler, killed alone) while its peers run on,
and every peer said it can rejoin (``jobs.Healer`` wrote ``<run>/heal/ready/rank-N``), the
attempt ends there (``rejoin_attempt``) and the next one begins without stopping anyone: the
generation file names the replaced ranks and the rank whose state every rank takes (the lowest
survivor), and each lost rank is forked again from the run's warm zygote with
``ORCH_HEAL_GENERATION`` (``Rejoins.replace``). The ranks do the rest (``jobs.heal``). A rejoin
is complete once every rank wrote ``heal/rejoined/g<G>-rank-R``; one that never completes, or
survivors that end before it does (they had finished their work), make every rank restart as
``survivors: restart`` does. Progress, for ``recovery.stop_without_progress``, is a new checkpoint
or a step past the previous attempt's: the same failure at the same step stops the run.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core import procs
from orchestrator.core.atomic_files import write_json_atomic
from orchestrator.core.recovery import Decision, Failure, History, decide
from orchestrator.core.run_folder import RunFolder
from orchestrator.core.states import Action
from orchestrator.node.rank_env import OrchVar

if TYPE_CHECKING:
    from orchestrator.backends.local.forked import ForkedRank, ZygoteGroup
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

    def may_rejoin(self, failed: list[int], codes: list[int | None], stopping: bool,
                   group: ZygoteGroup | None) -> bool:
        """Whether the ranks that failed may be replaced beside the others: asked for, not while
        stopping, some rank still running, every one of them able to rejoin, the zygote alive,
        and the last rejoin (if any) complete."""
        if self.payload.recovery.survivors != "keep" or stopping or group is None or group.lost:
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

    def replace(self, group: ZygoteGroup, ranks: list[ForkedRank], forks: list[dict[str, Any]],
                attempt: int) -> None:
        """Announce the next generation and fork each lost rank again into the running set (in
        ``ranks``, the set's processes by rank), every rank's log marking attempt ``attempt``."""
        lost, self.lost = self.lost, []
        self.generation += 1
        source = min(r for r in range(len(ranks)) if r not in lost)
        self.folder.heal.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.folder.heal_generation, {"generation": self.generation, "replaced": lost,
                                                        "source": source})
        try:  # the lost ranks' tracebacks go with the attempt that ended, as before a restart
            self.folder.keep_failures()
        except OSError as exc:
            say(f"the failed attempt's tracebacks were not kept: {exc}")
        self.began_at, self.complete = time.time(), False
        for rank, fork in enumerate(forks):  # every rank's log marks the new attempt (logs --attempt)
            how = "replaced" if rank in lost else "kept its process"
            with open(fork["log"], "ab") as log:
                log.write(f"=== attempt {attempt} started {time.ctime()} ===\n[orchestrator] rank {rank} {how}: "
                          f"rank(s) {', '.join(map(str, lost))} rejoin the survivors (generation {self.generation}, "
                          f"state from rank {source})\n".encode())
        for rank in lost:
            ranks[rank] = group.add({**forks[rank], "env": {**forks[rank]["env"],
                                                             OrchVar.HEAL_GENERATION: str(self.generation)}})

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


def kill_rank(proc: ForkedRank) -> None:
    """SIGKILL one rank's session (a straggler its peers wait for) and wait for its end (≤ 5 s)."""
    if proc.poll() is None:
        procs.signal_group(proc.pid, signal.SIGKILL)  # it leads its session (zygote.child)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def mark_rejoin(times: dict[str, float], run_dir: str, world_size: int) -> None:
    """The moments of an attempt that began as a rejoin (its first and last steps; no joins: the
    watchdog's are the ranks' first group's)."""
    from orchestrator.core import attempt_times

    if "ranks_at" not in times:
        return
    try:
        times.update(attempt_times.progress_marks(run_dir, world_size, times["ranks_at"]))
    except OSError:
        pass


def say(line: str) -> None:
    print(f"[orchestrator] {line}", file=sys.stderr, flush=True)
