"""Waiting on a scheduler politely, for any scheduled backend: when a waiting client asks the
scheduler next (``SchedulerPacing``), and what in a run folder tells it to ask sooner
(``folder_news``: the job's agent rewrote the attempts or wrote its verdict). Pure or a few
``stat`` calls; no scheduler is named here."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from orchestrator.core.records import RunRecord
from orchestrator.core.recovery import HISTORY_FILE
from orchestrator.core.run_folder import RunFolder

#: How a scheduled backend's record says that its scheduler no longer knows the job and nothing on
#: record tells how it ended ("job 12 is no longer known to SLURM ..."): a wait ends there (UNKNOWN).
FORGOTTEN = "is no longer known to"


class SchedulerPacing:
    """When a waiting client asks the scheduler next: the one policy for every loop that waits on
    SLURM (``api.Run.wait``, ``Run.tail`` and so ``logs -f``, ``--remote``'s status polling, and,
    with shorter delays, ``cancel``). Pure: it is told the time, each answer and each change seen
    in the run folder, and says when the next question is due; it never sleeps or asks itself.

    - The first question is due at once.
    - After an answer: ``first_s`` later if the answer differs from the last one (the state
      changed), else the last delay times ``factor``, at most ``most_s``.
    - The run folder changed (the job's agent recorded an attempt's start or end, or its
      verdict): the next question is due ``soon_s`` after it, and while the answers stay the same
      the delays grow from there (``soon_s``, x ``factor``...), so the end the agent recorded is
      confirmed within about a second while a job that ends slowly is not asked every second. At
      most one such early question per ``first_s``: a folder that keeps changing does not make
      the client ask more often than that.
    """

    FIRST_S = 10.0
    FACTOR = 1.5
    MOST_S = 60.0
    SOON_S = 1.0

    def __init__(self, first_s: float = FIRST_S, most_s: float = MOST_S, factor: float = FACTOR,
                 soon_s: float = SOON_S) -> None:
        if not 0 < soon_s <= first_s <= most_s or factor < 1:
            raise ValueError(f"pacing needs 0 < soon_s <= first_s <= most_s and factor >= 1, not soon_s={soon_s}, "
                             f"first_s={first_s}, most_s={most_s}, factor={factor}")
        self.first_s, self.most_s, self.factor, self.soon_s = first_s, most_s, factor, soon_s
        self.next_at = -math.inf  # due at once
        self.delay: float | None = None  # the delay set after the last answer
        self.last: Any = _NO_ANSWER
        self.answers = 0  # answers noted (for callers and tests)
        self._early_at = -math.inf  # when the last early question (after a folder change) was due

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def answered(self, now: float, answer: Any) -> float:
        """Note an answer got at ``now``; returns the delay until the next question."""
        self.answers += 1
        if answer != self.last or self.delay is None:
            self.delay = self.first_s
        else:
            self.delay = min(self.most_s, self.delay * self.factor)
        self.last = answer
        self.next_at = now + self.delay
        return self.delay

    def folder_changed(self, now: float) -> None:
        """The run folder shows news: ask ``soon_s`` from now (once per ``first_s``), then back off."""
        at = max(now + self.soon_s, self._early_at + self.first_s)
        if at < self.next_at:
            self.next_at = self._early_at = at
            self.delay = self.soon_s / self.factor  # the next unchanged answer waits soon_s

    def wait_s(self, now: float) -> float:
        """Seconds until the next question is due (0: now)."""
        return max(0.0, self.next_at - now)


_NO_ANSWER = object()


#: A sweep's point folders watched for news (beyond this many, the scheduler alone tells).
WATCHED_POINTS = 32


def folder_news(rec: RunRecord) -> tuple:
    """What changes in a SLURM run's folder when its job's agent has news, for the price of a few
    ``stat`` calls: each ``recovery.json`` (the agent rewrites it as an attempt starts and as it
    ends) and each ``end.json`` (its verdict), of the run and of up to WATCHED_POINTS sweep points."""
    run = RunFolder.of(rec.run_dir)
    folders = [run] + [run.point(i) for i in range(min(rec.sweep_size, WATCHED_POINTS))]
    return (*(file_stat(f.root / HISTORY_FILE) for f in folders), *(file_stat(f.end) for f in folders))


def file_stat(path: Path) -> tuple[int, int, int] | None:
    """What changes when a file is replaced (the run folder's files are written whole, then renamed)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino
