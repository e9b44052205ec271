"""Old code snapshots are removed from a runs folder's store after a remote submission
(``snapshot_prune``), past a bound: never the tree of a run that may still run (queued, running,
requeued), never one of the last few, never one made a moment ago; and nothing at all when a run
or the scheduler cannot be read."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import pytest

from orchestrator.core.errors import OrchestratorError
from orchestrator.core.records import RunRecord
from orchestrator.code.snapshot import scan, store
from orchestrator.front.snapshot_prune import LOCK_NAME, Use, prune, removable, store_lock
from orchestrator.core.states import State

HOUR = 3600.0
NOW = 1_900_000_000.0


# ---- the rule ------------------------------------------------------------------------------------
def test_the_trees_of_runs_that_may_still_run_are_kept_whatever_their_age() -> None:
    views = {"a": NOW - 9 * HOUR, "b": NOW - 8 * HOUR, "c": NOW - 7 * HOUR}
    uses = [Use("a", NOW - 9 * HOUR, live=True), Use("b", NOW - 8 * HOUR, live=False),
            Use("b", NOW - 8 * HOUR, live=True), Use("c", NOW - 7 * HOUR, live=False)]
    assert removable(views, uses, NOW, keep=0) == ["c"]


def test_the_last_n_used_are_kept_by_their_newest_use() -> None:
    views = {name: NOW - 9 * HOUR for name in "abcde"}
    uses = [Use("a", NOW - 2 * HOUR, False), Use("b", NOW - 5 * HOUR, False), Use("c", NOW - 3 * HOUR, False),
            Use("d", NOW - 8 * HOUR, False), Use("d", NOW - 4 * HOUR, False)]
    assert removable(views, uses, NOW, keep=3) == ["b", "e"]  # kept: a (2 h), c (3 h), d (its newest use: 4 h)
    assert removable(views, uses, NOW, keep=0) == list("abcde")
    assert removable(views, uses, NOW, keep=10) == []


def test_a_tree_made_or_used_within_the_grace_is_kept() -> None:
    """A submission stores its tree before it records its run: a tree no run names yet is new."""
    views = {"new": NOW - 60, "used": NOW - 9 * HOUR, "old": NOW - 9 * HOUR}
    uses = [Use("used", NOW - 600, False)]
    assert removable(views, uses, NOW, keep=0, grace_s=HOUR) == ["old"]


def test_uses_of_trees_the_store_does_not_hold_change_nothing() -> None:
    assert removable({"a": NOW - 9 * HOUR}, [Use("gone", NOW, True)], NOW, keep=0) == ["a"]


# ---- a real store --------------------------------------------------------------------------------
class Folder:
    """A project, its runs folder and the store, with runs recorded as a submission records them."""

    def __init__(self, root: Path) -> None:
        self.project = root / "proj"
        self.runs = self.project / "runs"
        self.store = self.runs / ".code"
        self.project.mkdir(parents=True)
        (self.project / "helper.py").write_text("SHARED = 1\n")

    def snapshot(self, version: int) -> dict:
        (self.project / "train.py").write_text(f"V = {version}\n")
        snap = scan(str(self.project), "folder", str(self.store), exclude=[str(self.runs)])
        store(snap)
        return snap.summary()

    def run(self, name: str, code: dict, state: State, job: str, age_h: float) -> Path:
        folder = self.runs / name
        folder.mkdir(parents=True)
        RunRecord(run_id=name, run_dir=str(folder), executor="slurm", state=state, job_ids=[job]).save()
        (folder / "code.json").write_text(json.dumps(code))
        os.utime(folder / "code.json", (NOW - age_h * HOUR, NOW - age_h * HOUR))
        return folder

    def age_store(self, hours: float) -> None:
        """Everything in the store made ``hours`` before NOW (trees, manifests, blobs)."""
        when = NOW - hours * HOUR
        for folder, dirs, files in os.walk(self.store):
            for name in [*dirs, *files]:
                os.utime(os.path.join(folder, name), (when, when), follow_symlinks=False)

    def trees(self) -> set[str]:
        return {p.name for p in (self.store / "trees").iterdir() if not p.name.startswith(".")}

    def blobs(self) -> set[str]:
        return {p.name for p in (self.store / "blobs").rglob("*") if p.is_file()}


def _view(code: dict) -> str:
    return Path(code["tree"]).relative_to(Path(code["manifest"]).parent.parent / "trees").parts[0]


def _no_refresh(records: list) -> list:
    return records


def _nothing_queued(jobs: Sequence[str]) -> set[str]:
    return set()


@pytest.fixture
def folder(tmp_path: Path) -> Folder:
    return Folder(tmp_path)


def test_old_snapshots_go_and_the_live_and_recent_stay(folder: Folder) -> None:
    codes = [folder.snapshot(v) for v in range(8)]
    folder.age_store(10)
    states = [State.COMPLETED, State.PENDING, State.COMPLETED, State.FAILED, State.CANCELLED, State.COMPLETED,
              State.TIMEOUT, State.COMPLETED]
    for i, (code, state) in enumerate(zip(codes, states)):
        folder.run(f"r{i}", code, state, job=str(100 + i), age_h=9 - i if i < 7 else 0.1)
    asked: list[list[str]] = []

    def queued(jobs: Sequence[str]) -> set[str]:  # r2's job was requeued: COMPLETED in its record, queued again
        asked.append(list(jobs))
        return {"102"}

    blob_of = {v: _sha(f"V = {v}\n") for v in range(8)}
    report = prune(folder.store, keep=3, grace_s=HOUR, now=NOW, refresh=_no_refresh, queued=queued)
    assert report is not None and report.skipped is None
    gone = {_view(codes[i]) for i in (0, 3, 4)}
    assert sorted(report.removed) == sorted(gone) and report.kept == 5 and report.live == 2
    assert folder.trees() == {_view(c) for c in codes} - gone
    assert not Path(codes[0]["tree"]).exists() and Path(codes[1]["tree"], "train.py").read_text() == "V = 1\n"
    assert {p.stem for p in (folder.store / "manifests").iterdir()} == {codes[i]["id"] for i in (1, 2, 5, 6, 7)}
    assert folder.blobs() >= {blob_of[i] for i in (1, 2, 5, 6, 7)} | {_sha("SHARED = 1\n")}
    assert not folder.blobs() & {blob_of[i] for i in (0, 3, 4)}
    assert report.freed_bytes > 0 and "removed 3 old code snapshot(s)" in report.line()
    assert asked and "101" not in asked[0]  # the pending run is live by its record; the ended ones are asked
    # the kept trees still serve a rebuild: a new submission of an old version stores it again
    again = folder.snapshot(0)
    assert Path(again["tree"], "train.py").read_text() == "V = 0\n"


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def test_a_stale_record_is_asked_of_the_scheduler_first(folder: Folder) -> None:
    codes = [folder.snapshot(v) for v in range(3)]
    folder.age_store(10)
    for i, code in enumerate(codes):
        folder.run(f"r{i}", code, State.RUNNING, job=str(200 + i), age_h=9 - i)  # r2 the newest: kept (keep=1)

    def refresh(records: list) -> list:  # the scheduler says r0 ended long ago
        return [RunRecord(**{**r.__dict__, "state": State.COMPLETED}) if r.run_id == "r0" else r for r in records]

    report = prune(folder.store, keep=1, grace_s=HOUR, now=NOW, refresh=refresh, queued=_nothing_queued)
    assert report is not None and report.removed == [_view(codes[0])]


@pytest.mark.parametrize("what", ["code", "scheduler", "queue"])
def test_nothing_is_removed_when_a_run_or_the_scheduler_cannot_be_read(folder: Folder, what: str) -> None:
    codes = [folder.snapshot(v) for v in range(4)]
    folder.age_store(10)
    for i, code in enumerate(codes):
        folder.run(f"r{i}", code, State.COMPLETED if what != "scheduler" else State.RUNNING, job=str(300 + i),
                   age_h=9)
    if what == "code":
        (folder.runs / "r2" / "code.json").write_text("{damaged")

    def refresh(records: list) -> list:
        if what == "scheduler" and records:
            raise OrchestratorError("sacct: the controller does not answer")
        return records

    def queued(jobs: Sequence[str]) -> set[str]:
        if what == "queue":
            raise OrchestratorError("squeue: the controller does not answer")
        return set()

    before = folder.trees()
    report = prune(folder.store, keep=1, grace_s=HOUR, now=NOW, refresh=refresh, queued=queued)
    assert report is not None and report.removed == [] and report.skipped, report
    assert folder.trees() == before and "left in place" in report.line()


def test_an_unreadable_record_keeps_its_runs_tree(folder: Folder) -> None:
    codes = [folder.snapshot(v) for v in range(3)]
    folder.age_store(10)
    for i, code in enumerate(codes):
        folder.run(f"r{i}", code, State.COMPLETED, job=str(400 + i), age_h=9)
    (folder.runs / "r0" / "record.json").write_text("{damaged")
    report = prune(folder.store, keep=0, grace_s=HOUR, now=NOW, refresh=_no_refresh, queued=_nothing_queued)
    assert report is not None and sorted(report.removed) == sorted(_view(codes[i]) for i in (1, 2))


def test_a_small_store_is_only_listed(folder: Folder) -> None:
    code = folder.snapshot(0)
    folder.run("r0", code, State.COMPLETED, job="1", age_h=9)
    folder.age_store(10)
    before = sorted(p.name for p in folder.store.iterdir())
    assert prune(folder.store, keep=1, now=NOW, refresh=_no_refresh, queued=_nothing_queued) is None
    assert sorted(p.name for p in folder.store.iterdir()) == before  # not even the lock file is made


def test_a_submission_storing_its_snapshot_holds_the_prune_off(folder: Folder) -> None:
    codes = [folder.snapshot(v) for v in range(3)]
    folder.age_store(10)
    for i, code in enumerate(codes):
        folder.run(f"r{i}", code, State.COMPLETED, job=str(500 + i), age_h=9)
    with store_lock(folder.store, exclusive=False):
        report = prune(folder.store, keep=0, grace_s=HOUR, now=NOW, refresh=_no_refresh, queued=_nothing_queued)
    assert report is not None and report.removed == [] and "a submission is storing" in (report.skipped or "")
    assert (folder.store / LOCK_NAME).is_file() and len(folder.trees()) == 3


def test_runs_of_another_store_are_not_this_stores(folder: Folder, tmp_path: Path) -> None:
    """A run folder whose code record names another runs folder's store says nothing about this one."""
    codes = [folder.snapshot(v) for v in range(2)]
    folder.age_store(10)
    elsewhere = dict(codes[0], tree=str(tmp_path / "other" / ".code" / "trees" / _view(codes[0]) / "x"))
    folder.run("r0", elsewhere, State.RUNNING, job="600", age_h=9)
    folder.run("r1", codes[1], State.COMPLETED, job="601", age_h=9)
    report = prune(folder.store, keep=0, grace_s=HOUR, now=NOW, refresh=_no_refresh, queued=_nothing_queued)
    assert report is not None and sorted(report.removed) == sorted(_view(c) for c in codes)


def test_a_store_is_looked_at_once_an_hour_at_most(folder: Folder) -> None:
    """Deciding asks the scheduler about every run of the folder: not on every submission."""
    from orchestrator.front.snapshot_prune import STAMP_NAME

    codes = [folder.snapshot(v) for v in range(3)]
    folder.age_store(10)
    for i, code in enumerate(codes):
        folder.run(f"r{i}", code, State.COMPLETED, job=str(700 + i), age_h=9)
    (folder.store / STAMP_NAME).touch()
    os.utime(folder.store / STAMP_NAME, (NOW - 60, NOW - 60))
    assert prune(folder.store, keep=0, grace_s=HOUR, now=NOW, refresh=_no_refresh, queued=_nothing_queued) is None
    assert len(folder.trees()) == 3
    os.utime(folder.store / STAMP_NAME, (NOW - 2 * HOUR, NOW - 2 * HOUR))
    report = prune(folder.store, keep=0, grace_s=HOUR, now=NOW, refresh=_no_refresh, queued=_nothing_queued)
    assert report is not None and len(report.removed) == 3 and folder.trees() == set()


def test_the_login_node_prunes_after_a_submission_it_held_the_store_for(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The receiver submits with the store's lock held shared (a prune then skips, never racing the
    snapshot being recorded), and prunes the runs folder's store once the run is recorded."""
    import fcntl

    import orchestrator.front.snapshot_prune
    from tests.unit.test_remote_receive_hostile import HONEST_STREAM, Arena, feed, honest_header

    arena = Arena(tmp_path / "arena")
    held: list[bool] = []
    pruned: list[Path] = []

    def try_the_lock() -> None:  # in submit: where the run's snapshot is stored and recorded
        fd = os.open(Path.cwd() / "runs" / ".code" / LOCK_NAME, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(False)
        except BlockingIOError:
            held.append(True)
        finally:
            os.close(fd)

    monkeypatch.setattr(orchestrator.front.snapshot_prune, "prune", lambda store: pruned.append(store))
    code, messages, calls = feed(arena, honest_header(), HONEST_STREAM, also=try_the_lock)
    assert code == 0 and len(calls) == 1, messages
    assert held == [True] and pruned == [arena.checkout() / "pkg" / "runs" / ".code"]
