"""Files a script writes beside its own ``__file__`` land in the code snapshot's tree (the ranks run
from it), and only that tree holds them: ``gc`` keeps such a tree and says so instead of removing
the files with it, and ``plan``/``run``/``submit`` warn when a run's previous tree holds some that
this attempt, from a new tree, will not see (BUG 4 of the tester's report)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.core.snapshot_writes import tree_writes
from orchestrator.core.states import State
from orchestrator.front import snapshot_prune
from orchestrator.front.snapshot_prune import prune
from tests.unit.test_remote_prune import Folder, _view

HOUR = 3600.0
NOW = 1_900_000_000.0


def _finished(folder: Folder, versions: int) -> list[dict]:
    """``versions`` snapshots, aged 10 hours, each used by one finished run ``r<v>``."""
    codes = [folder.snapshot(v) for v in range(versions)]
    folder.age_store(10)
    for v, code in enumerate(codes):
        folder.run(f"r{v}", code, State.CANCELLED, job=str(100 + v), age_h=9 - v)
    return codes


def _prune(folder: Folder, dry_run: bool = False) -> snapshot_prune.Pruned:
    report = prune(folder.store, keep=0, grace_s=HOUR, every_s=0, now=NOW, refresh=lambda records: records,
                   queued=lambda jobs: set(), dry_run=dry_run)
    assert report is not None and report.skipped is None, report
    return report


# ---- gc ------------------------------------------------------------------------------------------
def test_gc_keeps_a_tree_holding_files_a_run_wrote_and_names_them(tmp_path: Path) -> None:
    """r1's script saved ``ckpt.pt`` beside itself and ``outs/last.txt`` under a folder of its
    own: that tree stays (with its manifest and blobs), named with its run, a few files and the
    fix. What is no run's output does not hold a tree: Python's ``__pycache__``, the links to the
    live files, an empty folder (r0's and r2's trees go)."""
    folder = Folder(tmp_path)
    (folder.project / "data.bin").write_bytes(b"\0" * 10)  # not code: the trees link it, live
    codes = _finished(folder, 3)
    tree1, tree0 = Path(codes[1]["tree"]), Path(codes[0]["tree"])
    (tree1 / "ckpt.pt").write_bytes(b"step 3")
    (tree1 / "outs").mkdir()
    (tree1 / "outs" / "last.txt").write_text("3\n")
    (tree0 / "__pycache__").mkdir()
    (tree0 / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    (tree0 / "empty").mkdir()
    assert (tree0 / "data.bin").is_symlink()

    dry = _prune(folder, dry_run=True)
    assert sorted(dry.removed) == sorted(_view(codes[i]) for i in (0, 2)), dry.removed
    assert f"would keep {tree1} (used by run r1)" in dry.line() and "ckpt.pt, outs/" in dry.line(), dry.line()
    assert folder.trees() == {_view(c) for c in codes}

    report = _prune(folder)
    said = report.line().splitlines()
    assert len(said) == 2 and "kept 1 (0 used by runs that may still run, 1 holding files runs wrote)" in said[0]
    assert said[1] == (f"  kept {tree1} (used by run r1): it holds files the snapshot did not put there "
                       f"(ckpt.pt, outs/); move them out of {tree1} (they are your script's outputs), then run gc "
                       "again"), said
    assert folder.trees() == {_view(codes[1])}
    assert (tree1 / "ckpt.pt").read_bytes() == b"step 3" and (tree1 / "outs" / "last.txt").read_text() == "3\n"
    assert (folder.store / "manifests" / f"{codes[1]['id']}.json").is_file()
    assert (tree1 / "train.py").read_text() == "V = 1\n"

    (tree1 / "ckpt.pt").unlink()  # moved out, as the line says: the next gc removes the tree
    (tree1 / "outs" / "last.txt").unlink()
    assert _prune(folder).removed == [_view(codes[1])]


def test_a_file_written_beside_the_project_in_a_mirrored_parent_holds_its_tree_too(tmp_path: Path) -> None:
    """``Path(__file__).parent.parent / "x.pt"``: the tree mirrors the project's parent folders."""
    folder = Folder(tmp_path)
    codes = _finished(folder, 2)
    (Path(codes[0]["tree"]).parent / "up.pt").write_bytes(b"x")
    report = _prune(folder)
    assert report.removed == [_view(codes[1])] and "(../up.pt)" in report.line(), report.line()


def test_a_tree_whose_manifest_is_gone_is_kept_and_said(tmp_path: Path) -> None:
    """Without its manifest, what the snapshot put in a tree cannot be told from what runs wrote."""
    folder = Folder(tmp_path)
    codes = _finished(folder, 2)
    (folder.store / "manifests" / f"{codes[0]['id']}.json").unlink()
    report = _prune(folder)
    assert report.removed == [_view(codes[1])], report.removed
    view = folder.store / "trees" / _view(codes[0])
    assert f"kept {view} (used by run r0): its manifest" in report.line() and "is gone" in report.line()
    assert Path(codes[0]["tree"], "train.py").is_file()


def test_gc_dry_run_prints_the_kept_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(snapshot_prune, "_refresh", lambda records: records)
    monkeypatch.setattr(snapshot_prune, "_queued", lambda jobs: set())
    folder = Folder(tmp_path)
    codes = [folder.snapshot(v) for v in range(2)]
    when = time.time() - 30 * HOUR
    for root, dirs, files in os.walk(folder.store):
        for name in [*dirs, *files]:
            os.utime(os.path.join(root, name), (when, when), follow_symlinks=False)
    for v, code in enumerate(codes):
        run = folder.run(f"r{v}", code, State.COMPLETED, job=str(100 + v), age_h=0)
        os.utime(run / "code.json", (when, when))
    (Path(codes[0]["tree"]) / "ckpt_beside.pt").write_bytes(b"x")
    assert main(["gc", "--dry-run", "--keep", "0", str(folder.runs)]) == 0
    said = capsys.readouterr().out
    assert "would remove 1 old code snapshot(s)" in said, said
    assert f"would keep {codes[0]['tree']} (used by run r0)" in said and "(ckpt_beside.pt)" in said, said
    assert "then run gc again" in said, said


def test_the_walk_stops_after_a_few_finds(tmp_path: Path) -> None:
    folder = Folder(tmp_path)
    code = folder.snapshot(0)
    for i in range(20):
        (Path(code["tree"]) / f"ckpt-{i:02d}.pt").write_bytes(b"x")
    found = tree_writes(code["tree"], code["manifest"], limit=3)
    assert found is not None and found.paths == ("ckpt-00.pt", "ckpt-01.pt", "ckpt-02.pt") and found.more
    assert found.listing() == "ckpt-00.pt, ckpt-01.pt, ckpt-02.pt and more"


# ---- the run that starts from a new tree -----------------------------------------------------------
@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    proj = tmp_path / "my proj"
    proj.mkdir()
    (proj / "beside.py").write_text("CKPT = __import__('pathlib').Path(__file__).parent / 'ckpt_beside.pt'\n")
    monkeypatch.chdir(proj)
    return proj


def _started(proj: Path) -> tuple[object, Path]:
    """Plan the spec and store its snapshot, as ``run`` does; the run folder's code.json names it."""
    from orchestrator.code.snapshot import store
    from orchestrator.front.planning import planned

    launch, snap = planned({"name": "beside", "entrypoint": "beside.py", "executor": "local",
                            "cpu_ranks_per_node": 1})
    assert snap is not None
    tree = Path(store(snap))
    Path(launch.run_dir).mkdir(parents=True, exist_ok=True)
    (Path(launch.run_dir) / "code.json").write_text(json.dumps(launch.code))
    return launch, tree


def _lines(proj: Path) -> list[str]:
    from orchestrator.front.planning import plan_for
    from orchestrator.spec.identity import plan_lines

    return plan_lines(plan_for({"name": "beside", "entrypoint": "beside.py", "executor": "local",
                                "cpu_ranks_per_node": 1}))


def _beside(lines: list[str]) -> list[str]:
    return [line for line in lines if "beside itself" in line]


def test_a_run_from_a_new_tree_is_told_of_the_files_its_previous_tree_holds(project: Path) -> None:
    launch, before = _started(project)
    (before / "__pycache__").mkdir()  # what importing from the tree leaves: no output of the script
    (before / "__pycache__" / "beside.cpython-311.pyc").write_bytes(b"\0")
    (project / "spec_beside2.yaml").write_text("name: beside\n")  # any edit makes a new tree: a .yaml too
    assert not _beside(_lines(project))  # the previous tree holds only what the snapshot and Python put there

    (before / "ckpt_beside.pt").write_bytes(b"step 3")
    lines = _lines(project)
    assert lines[0].startswith(f"identity: run {Path(launch.run_dir).name} exists with no checkpoint in "
                               "checkpoint.dir ("), lines
    warning = _beside(lines)
    assert len(warning) == 1, lines
    assert warning[0].startswith(f"warning: your script wrote files beside itself inside the code snapshot "
                                 f"({before}/...: ckpt_beside.pt); this attempt runs from a new snapshot and will "
                                 "not see them: write checkpoints to checkpoint.dir or a path outside the "
                                 "project's code, or copy them into the new tree ("), warning
    assert str(before) not in warning[0].split("new tree (")[1], warning  # the new tree, not the old one

    _, again = _started(project)  # the new tree, now the run's: the script writes there, and is not edited
    (again / "ckpt_beside.pt").write_bytes(b"step 4")
    assert not _beside(_lines(project))  # the same tree runs again: it finds its file
