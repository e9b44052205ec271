"""`status` over many registered SLURM runs: one scheduler query for all of them, each record
read once, and no record written when the scheduler said nothing new (a running job asked about
again). A stand-in sacct on PATH counts its calls; tests/benchmarks/bench_status.py times it."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_status  # noqa: E402

from orchestrator.front import operations  # noqa: E402
from orchestrator.core.records import RunRecord  # noqa: E402


def test_status_of_many_runs_asks_once_and_rewrites_only_what_changed(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    env, _ = bench_status.make_runs(tmp_path, 40)
    for key in ("ORCHESTRATOR_HOME", "PATH", "BENCH_CALLS"):
        monkeypatch.setenv(key, env[key])
    calls = Path(env["BENCH_CALLS"])
    records = sorted((tmp_path / "runs").glob("*/record.json"))
    assert len(records) == 40
    loads: list[str] = []
    real_load = RunRecord.load.__func__  # type: ignore[attr-defined]

    def counting(cls: type, run_dir: str | Path) -> RunRecord:
        loads.append(str(run_dir))
        return real_load(cls, run_dir)

    monkeypatch.setattr(RunRecord, "load", classmethod(counting))
    with contextlib.redirect_stdout(io.StringIO()) as out:
        operations.status([])
    assert calls.read_text().splitlines() == ["sacct"]  # one query for 40 jobs
    assert len(loads) == 40 and out.getvalue().count("COMPLETED") == 20 and out.getvalue().count("RUNNING") == 20
    before = {p: os.stat(p).st_mtime_ns for p in records}
    calls.unlink()
    with contextlib.redirect_stdout(io.StringIO()):
        operations.status([])
    assert calls.read_text().splitlines() == ["sacct"]
    assert {p: os.stat(p).st_mtime_ns for p in records} == before  # the ended were not asked; the running unchanged
