"""``orchestrator top RUN``: every rank of a running job side by side (issue 51, item 1).

One row per rank (a job of more than ``PER_RANK_MAX`` ranks: one row per node, its slowest rank):
its node, step of total, steps/s and samples/s, its own time a step outside collectives (the
rank API's ``busy_s``: ``orchestrator.core.stragglers`` names the straggler from it), seconds since
its last progress report, and its memory (RSS: read now for the ranks this host can see, else the
rank API's last report); above them the run's state, its attempt, the last recovery and the
goodput, as ``status`` counts them. The rank furthest behind is marked when it
trails the others' median step (a rank that reports no progress is shown without figures).
It reads what status reads: the per-node progress files (O(nodes)), the ranks' records and
recovery.json; it never asks the ranks anything, so it works the same locally, on SLURM and
through ``--remote``. ``--once`` prints one snapshot and exits (for scripts, tests and a pipe);
otherwise it refreshes every ``--interval`` seconds (at most 1) until the run ends or Ctrl-C
(redrawn in a terminal; in a pipe or through ``--remote``'s ssh, one snapshot after another).

A GPU rank on the rank API also reports its device's utilisation and the memory it holds there
(``jobs.progress.gpu_figures``): the two GPU columns appear when any rank reports them.
What it cannot say: for scripts that report no ``busy_s``, no straggler; for a script off the rank
API, no figures but its RSS.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from orchestrator.core.records import RunRecord

if TYPE_CHECKING:
    from orchestrator.core.progress import Progress
    from orchestrator.node.stack_requests import RankProc
    from rich.console import RenderableType  # rich is imported when top draws, not before

#: Above this many ranks, one row per node (its slowest rank) instead of one per rank.
PER_RANK_MAX = 32
#: A rank is marked as furthest behind when it trails the median step by this many steps.
BEHIND_STEPS = 2


@dataclass(frozen=True)
class Row:
    rank: int
    node: str
    step: Optional[int]
    total: Optional[int]
    steps_per_s: Optional[float]
    samples_per_s: Optional[float]
    since_s: Optional[float]  # since its last progress report
    rss_mb: Optional[float]
    busy_s: Optional[float] = None  # a step's time outside collectives (the rank API's busy_s)
    gpu_util: Optional[float] = None  # its GPU's utilisation (%), a GPU rank on the rank API
    gpu_mem_mb: Optional[float] = None  # the memory it holds on its GPU
    behind: bool = False
    straggler: Optional[float] = None  # its busy time over the others' median, when it is the straggler


def rows(run_dir: str, world_size: int, now: float) -> list[Row]:
    """One row per rank, from the progress files and the ranks' records."""
    from orchestrator.core.progress import read_progress
    from orchestrator.node.stack_requests import rank_procs

    reports = read_progress(run_dir, world_size) if world_size > 0 else []
    procs = rank_procs(run_dir)
    reported = ("step", "total", "steps_per_s", "samples_per_s", "busy_s", "gpu_util", "gpu_mem_mb")  # as they are
    out = []
    for rank in range(world_size):
        p = reports[rank] if rank < len(reports) else None
        rp = procs.get(rank)
        figures: dict[str, Any] = {k: getattr(p, k) if p else None for k in reported}
        out.append(Row(rank=rank, node=rp.host if rp is not None else "?", **figures,
                       since_s=max(0.0, now - p.time) if p else None, rss_mb=_rss_mb(rp, p)))
    return mark_straggler(mark_behind(out), straggler_factor(run_dir))


def straggler_factor(run_dir: str) -> float:
    """The run's ``watchdog.straggler_factor`` (its payload), else the default."""
    from orchestrator.core.payload import Payload
    from orchestrator.core.run_folder import RunFolder

    try:
        return Payload.load(RunFolder.of(run_dir).payload).watchdog.straggler_factor
    except Exception:  # an unreadable payload says nothing about the factor: the default
        return 1.5


def straggler_line(run_dir: str, world_size: int) -> Optional[str]:
    """For ``status`` of a running job: the straggler now, with its node, or None."""
    from orchestrator.core.stragglers import straggler

    table = rows(run_dir, world_size, time.time())
    found = straggler({r.rank: r.busy_s for r in table}, straggler_factor(run_dir))
    return found.line(table[found.rank].node) if found is not None else None


def mark_straggler(table: Sequence[Row], factor: float) -> list[Row]:
    """The straggler's row (``orchestrator.core.stragglers``), marked with its ratio."""
    from orchestrator.core.stragglers import straggler

    found = straggler({r.rank: r.busy_s for r in table}, factor)
    if found is None:
        return list(table)
    return [Row(**{**r.__dict__, "straggler": found.ratio}) if r.rank == found.rank else r for r in table]


def mark_behind(table: Sequence[Row]) -> list[Row]:
    """The row of the rank furthest behind, marked when it trails the median step by BEHIND_STEPS."""
    steps = [r.step for r in table if r.step is not None]
    if len(steps) < 2:
        return list(table)
    median, low = statistics.median(steps), min(steps)
    if median - low < BEHIND_STEPS:
        return list(table)
    last = min((r for r in table if r.step == low), key=lambda r: r.rank)
    return [Row(**{**r.__dict__, "behind": True}) if r is last else r for r in table]


def per_node(table: Sequence[Row]) -> list[Row]:
    """For big jobs: each node's slowest rank (its lowest step, else its oldest report)."""
    nodes: dict[str, Row] = {}
    for r in table:
        worst = nodes.get(r.node)
        if worst is None or _slower(r, worst):
            nodes[r.node] = r
    return sorted(nodes.values(), key=lambda r: r.rank)


def _slower(a: Row, b: Row) -> bool:
    if (a.straggler is not None) != (b.straggler is not None):  # a node's straggler is its row
        return a.straggler is not None
    return (a.step if a.step is not None else -1, -(a.since_s or 0.0)) < (b.step if b.step is not None else -1,
                                                                          -(b.since_s or 0.0))


def _rss_mb(rp: Optional[RankProc], report: Optional[Progress]) -> Optional[float]:
    """Read now where this host sees the rank's process (still that rank: its recorded start time);
    else its last progress report's figure (the rank API's, on SLURM and through --remote); None for
    neither, or for a PID that names another process now."""
    if rp is None or not rp.here():
        return report.rss_mb if report is not None else None
    from orchestrator.core import procs

    if not procs.same_process(rp.pid, rp.start_ticks):
        return None
    try:
        import psutil

        return float(psutil.Process(rp.pid).memory_info().rss / 2**20)
    except Exception:  # gone, or not ours to read
        return None


def header(rec: RunRecord, now: float) -> list[str]:
    """The run, its attempt, its last recovery and its goodput (as status counts them)."""
    from orchestrator.core.attempt_times import goodput, phases_line, recovery_shown, with_live_marks
    from orchestrator.core.recovery import History

    history, _ = History.shown(rec.run_dir)
    attempts = with_live_marks(history.attempts, rec.run_dir, rec.world_size)
    lines = [f"{rec.run_id}  {rec.state}  {rec.executor}  ranks={rec.world_size}  "
             f"attempt {attempts[-1].number if attempts else 1}"]
    for before, after in reversed(list(zip(attempts, attempts[1:]))):
        phases = recovery_shown(before, after)
        if phases is not None:
            why = (before.why or str(before.outcome or "")).splitlines()[:1]
            lines.append(f"last recovery: attempt {after.number} {phases_line(phases, before.number)}"
                         + (f": {why[0]}" if why else ""))
            break
    measured = goodput(attempts, rec.created, now) if attempts else None
    if measured is not None:
        lines.append(measured.line())
    return lines


def render(rec: RunRecord, now: float) -> RenderableType:
    """The snapshot as a rich renderable."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table_rows = rows(rec.run_dir, rec.world_size, now)
    by_node = len(table_rows) > PER_RANK_MAX
    shown = per_node(table_rows) if by_node else table_rows
    table = Table(title=f"{'slowest rank per node' if by_node else 'ranks'} (progress reports of the rank API)",
                  title_justify="left")
    gpus = any(r.gpu_util is not None or r.gpu_mem_mb is not None for r in shown)
    names = ("rank", "node", "step", "steps/s", "samples/s", "own ms/step", "last report", "RSS MB",
             *(("GPU %", "GPU MB") if gpus else ()), "")
    for name in names:
        table.add_column(name, justify="right" if name not in ("node", "") else "left")
    for r in shown:
        mark = f"STRAGGLER ({r.straggler:.1f}x the others)" if r.straggler else "furthest behind" if r.behind else ""
        gpu = (_num(r.gpu_util, 0), _num(r.gpu_mem_mb, 0)) if gpus else ()
        table.add_row(str(r.rank), r.node, _step(r), _num(r.steps_per_s, 2), _num(r.samples_per_s, 0),
                      _num(r.busy_s * 1000 if r.busy_s is not None else None, 0),
                      f"{r.since_s:.1f}s ago" if r.since_s is not None else "-", _num(r.rss_mb, 0), *gpu, mark)
    if not any(r.step is not None for r in table_rows):
        note = Text("no progress reports yet (a script off the rank API sends none: see 'orchestrator logs')")
        return Group(*[Text(line) for line in header(rec, now)], table, note)
    return Group(*[Text(line) for line in header(rec, now)], table)


def _step(r: Row) -> str:
    if r.step is None:
        return "-"
    return f"{r.step}/{r.total}" if r.total else str(r.step)


def _num(value: Optional[float], digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def top(ref: str, once: bool, interval: float = 1.0) -> int:
    from rich.console import Console
    from rich.live import Live

    from orchestrator.api import Run

    run = Run.get(ref)
    # A pipe (or --remote's ssh) gets every column whole, not a table cut to 80 characters.
    console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
    if once:
        run.status()
        console.print(render(run.record, time.time()))
        return 0
    interval = min(max(interval, 0.2), 1.0)

    def follow(show: Callable[[RenderableType], None]) -> int:
        """Show a fresh snapshot every ``interval`` until the run ends (or Ctrl-C)."""
        try:
            while True:
                state = run.status()
                show(render(run.record, time.time()))
                if state.terminal:
                    return 0
                time.sleep(interval)
        except KeyboardInterrupt:
            return 0

    if not console.is_terminal:  # a pipe, or --remote's ssh: a snapshot after another, never redrawn
        return follow(console.print)
    with Live(render(run.record, time.time()), console=console, refresh_per_second=4) as live:
        return follow(live.update)
