"""orchestrator top's table (orchestrator.front.top): which rank is marked as furthest behind, and a
big job's rows per node. The live run is tests/integration/test_top.py."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.front.top import BEHIND_STEPS, Row, mark_behind, per_node


def _row(rank: int, step: int | None, node: str = "n", since: float = 0.0) -> Row:
    return Row(rank=rank, node=node, step=step, total=100, steps_per_s=None, samples_per_s=None, since_s=since,
               rss_mb=None)


@given(steps=st.lists(st.one_of(st.none(), st.integers(0, 50)), min_size=1, max_size=12))
def test_at_most_one_rank_is_marked_and_only_when_it_trails_the_median(steps: list[int | None]) -> None:
    marked = [r for r in mark_behind([_row(i, s) for i, s in enumerate(steps)]) if r.behind]
    known = sorted(s for s in steps if s is not None)
    assert len(marked) <= 1
    if marked:
        assert marked[0].step == known[0] and sorted(known)[len(known) // 2] - known[0] >= 1
    elif len(known) >= 2:
        import statistics

        assert statistics.median(known) - known[0] < BEHIND_STEPS


def test_ranks_in_step_are_not_marked_and_a_rank_behind_is() -> None:
    assert not any(r.behind for r in mark_behind([_row(0, 10), _row(1, 10), _row(2, 9)]))
    table = mark_behind([_row(0, 10), _row(1, 4), _row(2, 10)])
    assert [r.behind for r in table] == [False, True, False]


def test_a_big_job_shows_each_nodes_slowest_rank() -> None:
    table = [_row(r, 10 - (r == 5), node=f"node{r // 4}", since=0.1 * r) for r in range(8)]
    shown = per_node(table)
    assert [(r.node, r.rank) for r in shown] == [("node0", 3), ("node1", 5)]  # node0: the oldest report


def test_a_rank_on_another_host_shows_the_memory_its_reports_carry(tmp_path: Path) -> None:
    """On SLURM (and through --remote) the ranks' processes are not this host's to read: their RSS
    comes from the rank API's progress reports (/proc/self/statm), where it used to show '-'."""
    import json
    import os

    from orchestrator.core.progress import ProgressWriter
    from orchestrator.front.top import rows
    from orchestrator.node import stack_requests

    for rank, host in ((0, "node-elsewhere"), (1, os.uname().nodename)):
        path = stack_requests.rank_record_path(tmp_path, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"rank": rank, "host": host, "pid": os.getpid(), "start_ticks": 1}))
        ProgressWriter(tmp_path, rank).report(5, force=True)
    shown = rows(str(tmp_path), 2, now=0.0)
    assert shown[0].node == "node-elsewhere" and shown[0].rss_mb is not None and shown[0].rss_mb > 1
    assert shown[1].rss_mb is None  # this host: read now, and the recorded process (other start time) is not ours


def test_a_gpu_rank_shows_its_devices_utilisation_and_memory_and_a_cpu_job_no_gpu_columns(tmp_path: Path) -> None:
    """The rank API's probe rides on the progress report (so SLURM and --remote show it too); the
    two GPU columns appear only when a rank reports them."""
    import time

    from rich.console import Console

    from orchestrator.core.progress import ProgressWriter, read_progress
    from orchestrator.core.records import RunRecord
    from orchestrator.front.top import render, rows

    ProgressWriter(tmp_path, 0, gpu=lambda: (87.0, 30512.4)).report(5, force=True)
    ProgressWriter(tmp_path, 1, gpu=lambda: (None, 2048.0)).report(5, force=True)  # no NVML: memory only
    reports = read_progress(tmp_path, 2)
    assert [(r.gpu_util, r.gpu_mem_mb) for r in reports if r] == [(87.0, 30512.4), (None, 2048.0)]
    assert [(r.gpu_util, r.gpu_mem_mb) for r in rows(str(tmp_path), 2, now=time.time())] == \
        [(87.0, 30512.4), (None, 2048.0)]

    def shown(run_dir: Path) -> str:
        console = Console(width=200, record=True)
        record = RunRecord(run_id="g", run_dir=str(run_dir), executor="local", state="RUNNING",
                           world_size=2, created=time.time())
        console.print(render(record, time.time()))
        return console.export_text()

    text = shown(tmp_path)
    assert "GPU %" in text and "GPU MB" in text and "30512" in text and " 87 " in text, text
    cpu = tmp_path / "cpu"
    for rank in (0, 1):
        ProgressWriter(cpu, rank).report(5, force=True)
    assert "GPU" not in shown(cpu)


def test_the_rank_apis_gpu_probe_says_nothing_on_a_cpu_rank_and_never_starts_cuda() -> None:
    import torch

    from jobs.progress import gpu_figures

    assert gpu_figures() == (None, None)
    assert not torch.cuda.is_initialized()
