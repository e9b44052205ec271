"""The live echo of a local run (``LogTails``): a rank's last line without a newline is shown once
the ranks have ended (``pump(final=True)``), and mid-run a partial line waits for its newline."""

from __future__ import annotations

from pathlib import Path

from orchestrator.core.failures import FAILED_MARK
from orchestrator.core.run_folder import RunFolder
from orchestrator.executors.console import LogTails


def _tails(run_dir: Path, ranks: int) -> tuple[LogTails, list[tuple[int, str]]]:
    RunFolder(run_dir).logs.mkdir(parents=True)
    echoed: list[tuple[int, str]] = []
    return LogTails(run_dir, [0] * ranks, lambda rank, line: echoed.append((rank, line))), echoed


def _write(run_dir: Path, rank: int, data: bytes) -> None:
    with open(RunFolder(run_dir).log(rank), "ab") as fh:
        fh.write(data)


def test_last_line_without_newline_is_echoed_at_the_end(tmp_path: Path) -> None:
    tails, echoed = _tails(tmp_path, 2)
    for rank in range(2):
        _write(tmp_path, rank, f"epoch 1 done\nfinal accuracy of rank {rank}: 0.97".encode())
    tails.pump()
    assert echoed == [(0, "epoch 1 done"), (1, "epoch 1 done")]
    tails.pump(final=True)
    assert echoed[2:] == [(0, "final accuracy of rank 0: 0.97"), (1, "final accuracy of rank 1: 0.97")]
    tails.pump(final=True)  # echoed once only
    assert len(echoed) == 4


def test_final_pump_reads_what_came_since_and_echoes_nothing_empty(tmp_path: Path) -> None:
    tails, echoed = _tails(tmp_path, 2)
    _write(tmp_path, 0, b"no newline at the end")
    _write(tmp_path, 1, b"a whole line\n")
    tails.pump(final=True)
    assert echoed == [(0, "no newline at the end"), (1, "a whole line")]


def test_mid_run_a_partial_line_waits_for_its_newline(tmp_path: Path) -> None:
    tails, echoed = _tails(tmp_path, 1)
    _write(tmp_path, 0, b"loading ")
    tails.pump()
    assert echoed == []
    _write(tmp_path, 0, b"done\nstep 1")
    tails.pump()
    assert echoed == [(0, "loading done")]
    _write(tmp_path, 0, b"/10\n")
    tails.pump(final=True)
    assert echoed == [(0, "loading done"), (0, "step 1/10")]


def test_a_failed_ranks_last_partial_line_stays_in_its_log(tmp_path: Path) -> None:
    tails, echoed = _tails(tmp_path, 1)
    _write(tmp_path, 0, f"{FAILED_MARK.format(rank=0)}ValueError: bad\nTraceback (most recent".encode())
    tails.pump(final=True)
    assert len(echoed) == 1 and echoed[0][1].startswith(FAILED_MARK.format(rank=0))
