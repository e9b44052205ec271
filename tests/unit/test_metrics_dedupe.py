"""After a resume, the metrics show each step once, as the latest attempt trained it: the writer
records each attempt and where it starts, the report's reader drops what was rolled back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.metrics import MetricsWriter
from orchestrator.front.report import current_records, read_metrics


def _attempt(run_dir: Path, monkeypatch: pytest.MonkeyPatch, attempt: int, steps: range, rank: int = 0,
             start: tuple[int, int] | None = None, epoch_of_end: dict[int, int] | None = None) -> None:
    """One attempt of a job logging every step in ``steps`` (loss = attempt + step / 1000), and
    the throughput of each epoch that ends at a step of ``epoch_of_end``."""
    monkeypatch.setenv("ORCH_ATTEMPT", str(attempt))
    kwargs = {} if start is None else {"start_step": start[0], "start_epoch": start[1]}
    with MetricsWriter(run_dir, rank=rank, **kwargs) as metrics:
        for step in steps:
            metrics.train(step, attempt + step / 1000)
            if epoch_of_end and step in epoch_of_end:
                metrics.throughput(epoch_of_end[step], samples=100, seconds=1.0 + attempt)
                metrics.evaluation(epoch_of_end[step] + 1, step, accuracy=0.5, loss=1.0)


def _steps(run_dir: Path, kind: str = "train") -> list[tuple[int, int]]:
    return [(m["step"], m["attempt"]) for m in read_metrics(run_dir) if m["kind"] == kind]


def test_records_carry_their_attempt_and_the_start_of_each_attempt(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _attempt(tmp_path, monkeypatch, 3, range(6, 8), start=(5, 0))
    rows = [json.loads(line) for line in (tmp_path / "metrics" / "rank-0.jsonl").read_text().splitlines()]
    assert [(r["kind"], r.get("step"), r["attempt"]) for r in rows] == [("start", 5, 3), ("train", 6, 3),
                                                                       ("train", 7, 3)]
    assert rows[0]["epoch"] == 0
    monkeypatch.delenv("ORCH_ATTEMPT")  # under torchrun: no attempt, and no field for it
    with MetricsWriter(tmp_path, rank=1) as metrics:
        metrics.throughput(0, 8, 1.0)
    assert "attempt" not in json.loads((tmp_path / "metrics" / "rank-1.jsonl").read_text())


def test_steps_after_the_checkpoint_are_shown_once_from_the_resumed_attempt(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # Attempt 0 checkpoints at step 5 and is killed at step 8; attempt 1 resumes from step 5.
    _attempt(tmp_path, monkeypatch, 0, range(1, 9), start=(0, 0))
    _attempt(tmp_path, monkeypatch, 1, range(6, 11), start=(5, 0))
    assert _steps(tmp_path) == [(s, 0) for s in range(1, 6)] + [(s, 1) for s in range(6, 11)]
    raw = [json.loads(line) for line in (tmp_path / "metrics" / "rank-0.jsonl").read_text().splitlines()]
    assert sum(r["kind"] == "train" for r in raw) == 13, "the file keeps what the killed attempt logged"


def test_a_report_mid_resume_drops_the_rolled_back_steps_not_yet_redone(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _attempt(tmp_path, monkeypatch, 0, range(1, 9), start=(0, 0))
    _attempt(tmp_path, monkeypatch, 1, range(6, 7), start=(5, 0))  # the new attempt is at step 6 so far
    assert _steps(tmp_path) == [(1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (6, 1)]


def test_without_a_start_record_a_step_logged_again_replaces_the_earlier_one(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _attempt(tmp_path, monkeypatch, 0, range(1, 9))  # a writer not told where the attempt starts
    _attempt(tmp_path, monkeypatch, 1, range(6, 11))
    assert _steps(tmp_path) == [(s, 0) for s in range(1, 6)] + [(s, 1) for s in range(6, 11)]


def test_a_fresh_start_voids_every_earlier_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _attempt(tmp_path, monkeypatch, 0, range(1, 9), epoch_of_end={4: 0, 8: 1})
    _attempt(tmp_path, monkeypatch, 1, range(1, 4), start=(0, 0))  # checkpoint.resume: false
    assert [m["attempt"] for m in read_metrics(tmp_path)] == [1, 1, 1]


def test_throughput_and_eval_one_record_per_epoch_and_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Epochs of 4 steps. Attempt 0 ends epoch 0 at step 4, and is stopped at step 6: it records the
    # throughput of that part of epoch 1 and checkpoints there. Attempt 1 trains on from step 6.
    for rank in (0, 1):
        _attempt(tmp_path, monkeypatch, 0, range(1, 7), rank=rank, start=(0, 0), epoch_of_end={4: 0})
        with MetricsWriter(tmp_path, rank=rank) as metrics:
            metrics.throughput(1, samples=50, seconds=0.5)
    for rank in (0, 1):
        _attempt(tmp_path, monkeypatch, 1, range(7, 13), rank=rank, start=(6, 1), epoch_of_end={8: 1, 12: 2})
    thr = [(m["rank"], m["epoch"], m["attempt"]) for m in read_metrics(tmp_path) if m["kind"] == "throughput"]
    assert thr == [(r, e, a) for r in (0, 1) for e, a in ((0, 0), (1, 1), (2, 1))]
    evals = [(m["epoch"], m["step"], m["attempt"]) for m in read_metrics(tmp_path) if m["kind"] == "eval"]
    assert evals == [(1, 4, 0), (2, 8, 1), (3, 12, 1)]


def test_the_reader_never_trips_on_hostile_start_records() -> None:
    records = [{"kind": "train", "step": 3, "loss": 1.0}, {"kind": "start", "step": "x"}, {"kind": "start"},
               {"kind": "start", "step": 2, "epoch": "y"}, {"kind": "throughput", "rank": 0, "epoch": 0, "samples": 1,
                                                            "seconds": 1, "samples_per_s": 1, "step": None},
               {"kind": "start", "step": 1.5, "epoch": 0}, "text", [1]]
    assert current_records(records) == []
    assert current_records([{"kind": "train", "step": 1, "loss": 2.0}, {"kind": "start", "step": float("nan")},
                            {"kind": "train", "step": 1, "loss": 3.0}]) == [{"kind": "train", "step": 1, "loss": 3.0}]
