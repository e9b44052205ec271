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


# ---- a runs folder's store as hostile input: never a removal through a link ------------------------
WEEK = 7 * 24 * HOUR


def _week_old(*paths: Path) -> None:
    when = time.time() - WEEK
    for path in paths:
        os.utime(path, (when, when), follow_symlinks=False)


def _outside(tmp_path: Path, inside: str) -> tuple[Path, Path]:
    """A folder outside every store holding a week-old thesis, laid out as the store's ``inside``
    folder would be (trees/<tree>/, blobs/<ab>/<sha>, manifests/<id>.json), so gc would take it for one."""
    outside = tmp_path / "home" / "thesis"
    parent = {"trees": outside / "chapter1", "blobs": outside / "ab", "manifests": outside}[inside]
    parent.mkdir(parents=True)
    thesis = parent / ("thesis.json" if inside == "manifests" else "thesis.tex")
    thesis.write_text("\\chapter{Introduction}\n")
    _week_old(thesis, parent, outside)
    return outside, thesis


def _listing(folder: Path) -> list[str]:
    """Every path under ``folder``, never through a link (a tree may hold links out of it)."""
    return sorted(os.path.relpath(os.path.join(root, name), folder)
                  for root, dirs, files in os.walk(folder) for name in [*dirs, *files])


@pytest.mark.parametrize("inside", ["trees", "blobs", "manifests"])
def test_a_store_folder_that_is_a_link_is_refused_by_name_and_nothing_is_removed(
        aged: tuple[Folder, list[str]], tmp_path: Path, capsys, inside: str) -> None:
    """``.code/trees`` (``blobs``, ``manifests``) linked to a folder outside: ``gc --keep 0`` once
    deleted the week-old thesis there. Now the link is named in one line, and nothing goes."""
    folder, views = aged
    outside, thesis = _outside(tmp_path, inside)
    real = folder.store / f"{inside}.real"
    os.rename(folder.store / inside, real)
    if inside == "trees":  # gc still sees the snapshots it would remove, through the link
        for view in views:
            os.rename(real / view, outside / view)
    os.symlink(outside, folder.store / inside)
    before = _listing(outside)
    assert main(["gc", "--keep", "0", str(folder.runs)]) == 1
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and f"{folder.store / inside} is a symbolic link to {outside}" in said[0], said
    assert "nothing was removed" in said[0], said
    assert thesis.read_text() == "\\chapter{Introduction}\n"
    assert _listing(outside) == before


def test_a_store_that_links_to_another_runs_folders_store_is_refused(aged: tuple[Folder, list[str]],
                                                                      tmp_path: Path, capsys) -> None:
    """``other/runs/.code`` links to this folder's store, and none of this folder's runs is in
    ``other/runs``: pruning through the link would take the queued run's tree for unused."""
    folder, views = aged
    other = tmp_path / "other" / "runs"
    other.mkdir(parents=True)
    os.symlink(folder.store, other / ".code")
    before = folder.trees()
    assert main(["gc", "--keep", "0", str(other)]) == 1
    said = capsys.readouterr().out
    assert f"{other / '.code'} is a symbolic link to {folder.store}" in said, said
    assert folder.trees() == before and views[5] in before  # the queued run's tree is there
    # named together, the real store is still pruned (never shadowed by the link to it), the link refused
    assert main(["gc", "--keep", "0", str(other), str(folder.runs)]) == 1
    said = capsys.readouterr().out
    assert f"removed 6 old code snapshot(s) from {folder.store}" in said and "is a symbolic link" in said, said
    assert folder.trees() == {views[5]}


def test_a_code_record_that_is_a_fifo_leaves_the_store_alone_without_blocking(aged: tuple[Folder, list[str]],
                                                                              capsys) -> None:
    import threading

    folder, _ = aged
    code = folder.runs / "run-2" / "code.json"
    code.unlink()
    os.mkfifo(code)
    before = folder.trees()
    outcome: list[int] = []
    worker = threading.Thread(target=lambda: outcome.append(main(["gc", "--keep", "0", str(folder.runs)])),
                              daemon=True)
    worker.start()
    worker.join(10)
    if not outcome:  # unblock the reader so the thread ends, then fail
        with open(code, "w"):
            pass
        pytest.fail("gc blocked on a FIFO where a run's code.json belongs")
    said = capsys.readouterr().out
    assert outcome == [1] and "left in place" in said and "FIFO" in said and "run-2" in said, said
    assert folder.trees() == before
