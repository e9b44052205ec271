"""``orchestrator gc``: a runs folder's old code snapshots removed on demand (``--dry-run`` says
what would go and its size), never the tree of a run that may still run, never one of the last
``--keep`` used; with no folder named, every registered run's folder is cleaned. ``--remote``
runs the same command on the login node (``remote.REMOTE_COMMANDS``)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from orchestrator.front import snapshot_prune
from orchestrator.cli import main
from orchestrator.core.records import RunRecord, register
from orchestrator.remote import REMOTE_COMMANDS
from orchestrator.core.states import State
from tests.unit.test_remote_prune import Folder, _view

HOUR = 3600.0


@pytest.fixture
def aged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Folder, list[str]]:
    """Seven snapshots made 30 hours ago, each with one SLURM run: version 5's still queued, the
    others over; run ``v`` last started ``20 - v`` hours ago. The scheduler agrees with the records."""
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(snapshot_prune, "_refresh", lambda records: records)
    monkeypatch.setattr(snapshot_prune, "_queued", lambda jobs: set())
    folder = Folder(tmp_path)
    codes = [folder.snapshot(v) for v in range(7)]
    now = time.time()
    when = now - 30 * HOUR
    for root, dirs, files in os.walk(folder.store):
        for name in [*dirs, *files]:
            os.utime(os.path.join(root, name), (when, when), follow_symlinks=False)
    views = []
    for v, code in enumerate(codes):
        state = State.PENDING if v == 5 else State.COMPLETED
        run = folder.runs / f"run-{v}"
        run.mkdir()
        record = RunRecord(run_id=run.name, run_dir=str(run), executor="slurm", state=state, job_ids=[str(100 + v)])
        record.save()
        register(record)
        (run / "code.json").write_text(__import__("json").dumps(code))
        used = now - (20 - v) * HOUR
        os.utime(run / "code.json", (used, used))
        views.append(_view(code))
    return folder, views


def test_dry_run_says_what_would_go_and_removes_nothing(aged: tuple[Folder, list[str]], capsys) -> None:
    folder, views = aged
    before = folder.trees()
    assert main(["gc", "--dry-run", "--keep", "1", str(folder.runs)]) == 0
    said = capsys.readouterr().out
    assert f"would remove 5 old code snapshot(s) from {folder.store}" in said, said
    assert "kept 2 (1 used by runs that may still run)" in said, said
    assert re.search(r"from \S+ \([\d.]+ ?[kKMGT]?i?B\)", said), said  # the size it would free
    assert folder.trees() == before


def test_gc_removes_all_but_the_queued_runs_and_the_last_used(aged: tuple[Folder, list[str]], capsys) -> None:
    folder, views = aged
    assert main(["gc", "--keep", "1", str(folder.runs)]) == 0
    said = capsys.readouterr().out
    assert f"removed 5 old code snapshot(s) from {folder.store}" in said, said
    assert folder.trees() == {views[5], views[6]}  # the queued run's, and the one used last


def test_with_no_folder_named_every_registered_runs_folder_is_cleaned(aged: tuple[Folder, list[str]], capsys) -> None:
    folder, views = aged
    assert main(["gc", "--dry-run", "--keep", "0"]) == 0
    said = capsys.readouterr().out
    assert f"would remove 6 old code snapshot(s) from {folder.store}" in said, said  # all but the queued run's


def test_a_folder_without_snapshots_is_said_and_a_bad_keep_refused(tmp_path: Path, capsys) -> None:
    assert main(["gc", str(tmp_path)]) == 0
    assert "no code snapshots to clean" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["gc", "--keep", "-1", str(tmp_path)])
    assert "--keep takes a count" in capsys.readouterr().err


def test_gc_goes_to_the_login_node_with_remote() -> None:
    assert "gc" in REMOTE_COMMANDS
