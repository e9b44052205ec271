"""The progress report format and the live line (orchestrator/progress.py)."""

from __future__ import annotations

import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.progress import Progress, ProgressWriter, read_progress, summarize


def test_writer_rate_limits_and_reader_reads_back(tmp_path: Path) -> None:
    w = ProgressWriter(tmp_path, rank=1, attempt=2, min_interval_s=3600)
    assert w.report(5, total=100, samples=64, force=True)
    assert not w.report(6, total=100, samples=64)  # within the interval: nothing written
    reports = read_progress(tmp_path, 3)
    assert reports[0] is None and reports[2] is None
    r = reports[1]
    assert r is not None and (r.rank, r.step, r.total, r.attempt) == (1, 5, 100, 2)
    assert not list((tmp_path / "progress").glob(".*tmp")), "a temporary file was left behind"


def test_rate_comes_from_two_reports(tmp_path: Path) -> None:
    w = ProgressWriter(tmp_path, rank=0, min_interval_s=0)
    w.report(10, total=110, samples=32, force=True)
    time.sleep(0.2)
    w.report(20, total=110, samples=32)
    r = read_progress(tmp_path, 1)[0]
    assert r is not None and r.steps_per_s is not None and 20 < r.steps_per_s < 60
    assert abs((r.samples_per_s or 0) - 32 * r.steps_per_s) < 1e-6
    s = summarize([r])
    assert s is not None and s.eta_s is not None and 90 / 60 < s.eta_s < 90 / 20
    assert "step 20/110" in s.line() and "samples/s" in s.line() and "ETA" in s.line()


def test_a_damaged_report_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "progress").mkdir()
    (tmp_path / "progress" / "rank-0.json").write_text("{not json")
    assert read_progress(tmp_path, 1) == [None]
    assert summarize([None, None]) is None


reports = st.lists(st.one_of(st.none(), st.builds(
    Progress, rank=st.integers(0, 7), time=st.floats(0, 1e9), step=st.integers(0, 10**9),
    total=st.one_of(st.none(), st.integers(1, 10**9)), steps_per_s=st.one_of(st.none(), st.floats(0.001, 1e6)),
    samples_per_s=st.one_of(st.none(), st.floats(0.001, 1e9)), attempt=st.integers(0, 5))), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(reports)
def test_summary_names_the_slowest_rank_and_never_fails(rs: list) -> None:
    s = summarize(rs)
    live = [r for r in rs if r is not None]
    if not live:
        assert s is None
        return
    assert s is not None
    assert s.step == min(r.step for r in live)
    assert s.slowest_rank in [r.rank for r in live if r.step == s.step]
    assert s.eta_s is None or s.eta_s >= 0
    assert s.line()
    later = summarize(rs, since=max(r.time for r in live) + 1)
    assert later is None
