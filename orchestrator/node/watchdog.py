"""The decisions both supervisors make about running ranks: the init deadline, the stall
watchdog, the straggler, the did-nothing warning. Pure (no processes, no files); the local
supervisor and the SLURM job's agent feed it what they observed (``observe``) and act on what
it says. Standard library only.

**Progress** of a rank, for ``watchdog.stall_s``: a heartbeat of this attempt from the rank API
(``<run>/progress/``, a file per node) for a rank that sends them; for a rank that sends none, new
output in its log; joining the process group counts too. The job has stalled when no rank has
progressed for ``stall_s``: a hung collective stops every rank, so the job-wide clock is the
signal, and the straggler is then named from evidence (``straggler``). The stall clock runs once
every rank is past its start (joined its group, or reported progress); before that, the init
deadline bounds the start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Optional, Sequence

from orchestrator.core.stacks import Where, where
from orchestrator.core.states import EndReason


@dataclass
class Watch:
    world_size: int
    started: float  # wall clock when the ranks were started (time.time())
    stall_s: Optional[float] = None
    init_timeout_s: Optional[float] = None
    log_sizes: dict[int, int] = field(default_factory=dict)
    log_grew: dict[int, float] = field(default_factory=dict)
    heartbeat: dict[int, float] = field(default_factory=dict)
    joined: dict[int, float] = field(default_factory=dict)
    #: The attempt's reports are those from here on (default: ``started``). Earlier than ``started``
    #: when the ranks start one after another: at 16 x 4 the first reported before the last was forked.
    reports_since: Optional[float] = None

    def observe(self, now: float, log_sizes: Mapping[int, int], heartbeats: Mapping[int, Optional[float]],
                joined: Sequence[int]) -> None:
        """One look at the ranks: their log sizes, their latest heartbeat times (None: none), and
        the ranks that have joined their process group."""
        for rank, size in log_sizes.items():
            if rank in self.log_sizes and size != self.log_sizes[rank]:
                self.log_grew[rank] = now
            self.log_sizes[rank] = size
        since = self.started if self.reports_since is None else self.reports_since
        for rank, t in heartbeats.items():
            if t is not None and t >= since:  # an earlier attempt's report is no progress
                self.heartbeat[rank] = max(t, self.heartbeat.get(rank, t))
        for rank in joined:
            self.joined.setdefault(rank, now)

    def restart(self, ranks: Sequence[int], at: float) -> None:
        """``ranks`` start again beside the others (recovery.survivors: keep) at ``at``: a new stall
        clock, and those ranks are new processes, not past their start until they join or report
        (their first group's join and reports were their predecessors'). Without this, a stand-in
        still importing was judged by the stall clock and blamed for a hang (site cluster, 2026-12-05)."""
        self.started = self.reports_since = at
        for rank in ranks:
            self.joined.pop(rank, None)
            self.heartbeat.pop(rank, None)
            self.log_grew.pop(rank, None)

    def progressed_since_join(self, rank: int, after_s: float) -> bool:
        """The rank showed progress (a report, or output) at least ``after_s`` after it joined its
        group: past its own start (model, data, DDP), not just past init_process_group."""
        joined, seen = self.joined.get(rank), self._seen(rank)
        return joined is not None and seen is not None and seen >= joined + after_s

    def last_progress(self, rank: int) -> float:
        """When the rank last progressed: its heartbeat if it sends them, else its log's growth;
        its join counts too; the start when nothing has happened yet."""
        return max(t for t in (self._seen(rank), self.joined.get(rank), self.started) if t is not None)

    def _seen(self, rank: int) -> Optional[float]:
        return self.heartbeat.get(rank) if rank in self.heartbeat else self.log_grew.get(rank)

    def past_start(self, rank: int) -> bool:
        """The rank joined its process group, or reported progress through the rank API: a
        heartbeat is proof it is past its start, group or not."""
        return rank in self.joined or rank in self.heartbeat

    def never_joined(self, now: float) -> list[int]:
        """The ranks past the init deadline without having joined or reported progress ([] before
        it, or when all did). A world of one rank waits for no peer: a single-process script that
        never joins a process group is just a script."""
        if self.init_timeout_s is None or self.world_size <= 1 or now - self.started <= self.init_timeout_s:
            return []
        return [r for r in range(self.world_size) if not self.past_start(r)]

    def settled(self) -> bool:
        """Nothing is left to judge: no stall watchdog, and the init deadline is off or every rank
        has joined. Looking again could change no verdict, so the supervisors stop reading the
        ranks' files (a look costs a few files per rank: on a shared filesystem, metadata load
        for the whole job)."""
        return not self.stall_s and not self._starting()

    def _starting(self) -> bool:
        """The init deadline watches: some rank of a world of several is not past its start yet."""
        return self.init_timeout_s is not None and self.world_size > 1 and \
            not all(self.past_start(r) for r in range(self.world_size))

    def stall_due(self) -> Optional[float]:
        """When ``stalled`` turns true if no rank progresses before then (wall clock); None while no
        stall clock runs. The supervisors look again then, not up to a look's interval later."""
        if not self.stall_s or self.world_size <= 0 or self._starting():
            return None
        return max(self.last_progress(r) for r in range(self.world_size)) + self.stall_s

    def next_look(self, now: float, interval_s: float) -> float:
        """The delay before the next look (``interval_s`` at most): sooner when the stall clock runs
        out first, so a hang is judged within a few ms of ``stall_s``, not up to a second after."""
        due = self.stall_due()
        return interval_s if due is None else max(0.01, min(interval_s, due - now + 0.01))

    def stalled(self, now: float) -> bool:
        """No rank progressed for stall_s. Until every rank is past its start (joined its process
        group, or reported progress: ``past_start``) the init deadline is the one watching (a
        world of one rank, or no deadline: from the start): the time before init_process_group
        (imports, reading data) is bounded by ``distributed.init_timeout_s``, which a user sets
        for exactly that, and a start slowed by a busy node never looks like a hang. Ranks that
        report progress without ever joining a group are watched from their first report (a
        16 x 4 job of heartbeats and no group once stalled unseen)."""
        if not self.stall_s or self._starting():
            return False
        return all(now - self.last_progress(r) >= self.stall_s for r in range(self.world_size))


@dataclass(frozen=True)
class Verdict:
    """Why the job must end now, whom to blame, and what to tell the user (``<run>`` stands for
    the run folder). ``dumps``: the stacks taken to decide, for the record."""

    reason: EndReason  # INIT_DEADLINE or STALL
    rank: Optional[int]
    message: str
    dumps: Mapping[int, str]


INIT_DEADLINE = "the init deadline (distributed.init_timeout_s)"


class Dumps(dict[int, str]):
    """What a capture gives ``judge``: each asked rank's dump ('' for one that did not answer in
    time), and ``stopped``, the ranks not asked because their process is stopped (SIGSTOP, ^Z, a
    debugger: ``stack_requests.STOPPED``), named as stopped, not as ranks that did not answer. A
    plain dict is a capture that knows of no stopped rank."""

    def __init__(self, dumps: Optional[Mapping[int, str]] = None, stopped: Iterable[int] = ()) -> None:
        super().__init__(dumps or {})
        self.stopped: frozenset[int] = frozenset(stopped)


#: Why a stopped rank is the straggler (rule 2 of ``straggler``).
STOPPED_WHY = "it is stopped (SIGSTOP, ^Z or a debugger): not asked for its stacks"


def judge(watch: Watch, now: float, calling: Callable[[], Sequence[int]],
          capture: Callable[[str, bool], Mapping[int, str]]) -> Optional[Verdict]:
    """The one judgement both supervisors act on, after they fed ``watch`` a look: the init
    deadline first, then the stall watchdog; None while the job may go on. ``calling()``: the
    ranks inside init_process_group now; ``capture(reason, always)``: the ranks' stacks (taken
    only when ``always`` or the spec's ``watchdog.stacks_on_failure`` says so), a ``Dumps`` where
    it knows which ranks are stopped."""
    missing = watch.never_joined(now)
    if missing:
        inside = calling()
        message = never_joined_message(missing, inside, watch.world_size, watch.init_timeout_s or 0)
        dumps = capture(INIT_DEADLINE, False)
        return Verdict(EndReason.INIT_DEADLINE, init_culprits(missing, inside)[0], message, dumps)
    if watch.stalled(now):
        last = {r: watch.last_progress(r) for r in range(watch.world_size)}
        dumps = capture(f"no progress for {watch.stall_s or 0:g}s (watchdog.stall_s)", True)
        wheres = {r: where(dumps[r]) if dumps.get(r) else None for r in last}
        rank, why = straggler(wheres, last, dumps.stopped if isinstance(dumps, Dumps) else ())
        message = stall_message(watch.stall_s or 0, rank, why, wheres.get(rank) if rank is not None else None)
        return Verdict(EndReason.STALL, rank, message, dumps)
    return None


def straggler(wheres: Mapping[int, Optional[Where]], last: Mapping[int, float],
              stopped: Iterable[int] = ()) -> tuple[Optional[int], str]:
    """The rank the others wait for, and why it was chosen.

    1. A rank whose main thread is not inside a torch.distributed collective while the job is
       stuck is not waiting for anyone: it is the straggler (several: the one that progressed
       least recently).
    2. A rank that is stopped (``stopped``: SIGSTOP, ^Z, a debugger; it was not asked for its
       stacks) is next, said as such; then one that could not answer (no stack): it may be stuck
       in the kernel.
    3. Otherwise every rank waits in a collective: the one whose progress is oldest.
    """
    if not last:
        return None, "no rank to judge"
    oldest = lambda ranks: min(ranks, key=lambda r: (last.get(r, 0.0), r))  # noqa: E731
    outside = [r for r, w in wheres.items() if w is not None and w.answered and not w.collective]
    if outside:
        rank = oldest(outside)
        waiting = sorted(r for r, w in wheres.items() if w is not None and w.collective)
        if waiting:
            verb = "waits" if len(waiting) == 1 else "wait"
            return rank, f"{_ranks_word(waiting)} {verb} in a collective while it is outside any"
        return rank, "its stack is not inside a collective"
    halted = sorted(set(stopped) & last.keys())
    if halted:
        return oldest(halted), STOPPED_WHY
    silent = [r for r in last if wheres.get(r) is None or not wheres[r].answered]  # type: ignore[union-attr]
    if silent and len(silent) < len(last):
        rank = oldest(silent)
        return rank, "it did not answer the stack request while the others wait in a collective"
    rank = oldest(list(last))
    return rank, "every rank waits in a collective; it progressed least recently"


def did_nothing(world_size: int, codes: Sequence[Optional[int]], joined: Sequence[int]) -> Optional[str]:
    """The warning for a run whose ranks all exited 0 without any of them joining a process group
    while the world size is above 1 (e.g. a script that found no GPU and returned); else None."""
    if world_size <= 1 or joined or any(c != 0 for c in codes):
        return None
    return (f"all {world_size} ranks exited 0 but none joined a process group: the script may have done "
            "nothing distributed (no GPU found? an early return?). Check the rank logs; a job that is "
            "not distributed wants nodes: 1 and one rank")


def init_culprits(missing: Sequence[int], calling: Sequence[int]) -> list[int]:
    """Of the ranks that never joined, those that never even called init_process_group (the
    others wait inside it for them); all of them when every one called it."""
    absent = [r for r in missing if r not in set(calling)]
    return absent or list(missing)


def never_joined_message(missing: Sequence[int], calling: Sequence[int], world_size: int,
                         init_timeout_s: float) -> str:
    culprits = init_culprits(missing, calling)
    waiting = [r for r in missing if r not in set(culprits)]
    if waiting:
        head = (f"rank{'s' if len(culprits) > 1 else ''} {_ranks(culprits)} never called init_process_group within "
                f"distributed.init_timeout_s ({init_timeout_s:g}s); {_ranks_word(waiting)} waited in it for "
                f"{'them' if len(culprits) > 1 else 'it'}")
    else:
        verb = "called init_process_group but never joined" if calling else "never joined the process group"
        head = f"rank{'s' if len(culprits) > 1 else ''} {_ranks(culprits)} {verb} within distributed.init_timeout_s " \
               f"({init_timeout_s:g}s; {world_size - len(missing)} of {world_size} joined)"
    return (head + ". Their stacks are in <run>/stacks/. A script that prepares data before init_process_group "
            "wants a longer distributed.init_timeout_s; one that never calls it, a single rank")


def stall_message(stall_s: float, rank: Optional[int], why: str, where: Optional[Where]) -> str:
    head = f"no rank made progress for {stall_s:g}s (watchdog.stall_s)"
    if rank is None:
        return head + "; every rank's stack is in <run>/stacks/"
    place = f" at {where.text()}" if where is not None else ""
    return f"{head}; straggler: rank {rank}{place}: {why}"


def _ranks_word(ranks: Sequence[int]) -> str:
    """'rank 3' or 'ranks 0, 1'."""
    return f"rank{'s' if len(ranks) > 1 else ''} {_ranks(ranks)}"


def _ranks(ranks: Sequence[int]) -> str:
    ranks = sorted(ranks)
    return ", ".join(map(str, ranks[:20])) + (f" ... ({len(ranks)} in all)" if len(ranks) > 20 else "")
