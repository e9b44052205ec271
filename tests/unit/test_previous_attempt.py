"""A new attempt that never starts (sbatch refuses it, the disk fills) loses nothing: the previous
attempt is put back exactly as it was; one that starts keeps the previous failures under
attempts/K and forgets the rest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hypothesis import given, settings, strategies as st

from orchestrator.executors.previous_attempt import ASIDE, PreviousAttempt
from orchestrator.core.run_folder import RunFolder

#: Where an attempt leaves files, relative to a run or sweep point folder.
ATTEMPT_FILES = ["result.json", "errors/rank-0.json", "errors/rank-3.json", "end.json", "ranks/rank-0.json",
                 "joined/rank-1", "stacks/live/rank-0.txt", "point-payload.json"]
RUN_FILES = ["record.json", "spec.yaml", "plan.json", "payload.json", "code.json", "slurm/7_0_log.out",
             "logs/rank-0.log", "checkpoints/step-3.pt", "attempts/1/errors/rank-2.json"]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _dirs(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir()}


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    if rel.endswith("/"):  # an empty folder
        path.mkdir(parents=True, exist_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if rel.endswith(".json") and "errors/" in rel:
        text = json.dumps({"rank": 0, "attempt": 0, "message": text})
    path.write_text(text)


def _folders(run_dir: Path) -> list[RunFolder]:
    points = RunFolder(run_dir).points
    return [RunFolder(run_dir), *(RunFolder(p) for p in sorted(points.iterdir()))] if points.is_dir() \
        else [RunFolder(run_dir)]


def _new_attempt(run_dir: Path, previous: PreviousAttempt, files: list[str], points: int) -> None:
    """What a new attempt writes before sbatch (base._start_attempt, SlurmExecutor._submit_locked):
    its record, spec, plan and payload, its code snapshot's id or none, point payloads, a rotated
    log folder."""
    for rel in ("record.json", "spec.yaml", "plan.json", "payload.json"):
        _write(run_dir, rel, "new " + rel)
    if "code.json" in files:
        _write(run_dir, "code.json", "new code.json")
    else:
        (run_dir / "code.json").unlink(missing_ok=True)
    for index in range(points):
        _write(RunFolder(run_dir).point(index).root, "point-payload.json", "new point")
    from orchestrator.backends.slurm.executor import rotate_folder

    slurm = RunFolder(run_dir).slurm
    previous.moved(slurm, rotate_folder(slurm))
    _write(run_dir, "slurm/submission.sh", "new script")


old_files = st.lists(st.sampled_from(RUN_FILES + ATTEMPT_FILES + ["slurm/"] + [f"points/000{i}/{f}" for i in range(2)
                                                                               for f in ATTEMPT_FILES]), unique=True)
new_files = st.lists(st.sampled_from(["record.json", "spec.yaml", "plan.json", "payload.json", "code.json"]),
                     unique=True)


@settings(max_examples=60, deadline=None)
@given(old=old_files, new=new_files, points=st.integers(0, 3))
def test_a_refused_attempt_leaves_the_run_exactly_as_it_was(tmp_path_factory, old: list[str], new: list[str],
                                                            points: int) -> None:
    run_dir = tmp_path_factory.mktemp("run")
    for rel in old:
        _write(run_dir, rel, "old " + rel)
    before, dirs = _tree(run_dir), _dirs(run_dir)
    previous = PreviousAttempt.put_aside(run_dir, _folders(run_dir))
    assert not any(rel in _tree(run_dir) for rel in ("result.json", "end.json", "errors/rank-0.json"))
    assert ("record.json" in _tree(run_dir)) == ("record.json" in old)  # status still finds the run meanwhile
    _new_attempt(run_dir, previous, new, points)
    previous.restore()
    assert _tree(run_dir) == before
    assert _dirs(run_dir) == dirs  # no folder left behind either (attempts/K, points/N, .previous-attempt)


@settings(max_examples=30, deadline=None)
@given(old=old_files, new=new_files, points=st.integers(0, 3))
def test_a_started_attempt_keeps_the_previous_failures_and_forgets_the_rest(tmp_path_factory, old: list[str],
                                                                            new: list[str], points: int) -> None:
    run_dir = tmp_path_factory.mktemp("run")
    for rel in old:
        _write(run_dir, rel, "old " + rel)
    before = _tree(run_dir)
    previous = PreviousAttempt.put_aside(run_dir, _folders(run_dir))
    _new_attempt(run_dir, previous, new, points)
    previous.drop()
    after = _tree(run_dir)
    assert not (run_dir / ASIDE).exists()
    for rel in (r for r in old if not r.endswith("/")):
        base, inner = (rel[:len("points/0000/")], rel[len("points/0000/"):]) if rel.startswith("points/") else ("", rel)
        if inner.startswith("errors/") or inner == "end.json":  # a failure: kept, under attempts/K
            assert any(k.startswith(base + "attempts/") and k.endswith("/" + inner) and v == before[rel]
                       for k, v in after.items()), f"{rel} is not kept: {sorted(after)}"
        elif inner in ATTEMPT_FILES or rel in ("record.json", "spec.yaml", "plan.json", "payload.json", "code.json"):
            assert after.get(rel) != before[rel], f"{rel}: the previous attempt's, still there"
        elif rel.startswith("slurm/"):
            assert after["slurm.1/" + rel[len("slurm/"):]] == before[rel]  # rotated, as before this module
        else:
            assert after[rel] == before[rel], f"{rel} is not the attempt's: it stays"


def test_a_start_killed_before_the_scheduler_answered_leaves_nothing_that_blocks_the_next(tmp_path: Path) -> None:
    for rel in ("record.json", "result.json", "errors/rank-0.json"):
        _write(tmp_path, rel, "old")
    PreviousAttempt.put_aside(tmp_path, _folders(tmp_path))  # then killed: neither restored nor dropped
    _write(tmp_path, "record.json", "killed start")
    again = PreviousAttempt.put_aside(tmp_path, _folders(tmp_path))
    _write(tmp_path, "record.json", "next start")
    again.drop()
    assert not (tmp_path / ASIDE).exists() and (tmp_path / "record.json").read_text() == "next start"
    assert not (tmp_path / "result.json").exists()
    shutil.rmtree(tmp_path)


def test_a_rerun_whose_start_fails_half_way_leaves_the_completed_attempt(tmp_path: Path, monkeypatch) -> None:
    """The disk fills while a new attempt writes its plan: the error says so, and the COMPLETED
    attempt (record, spec, result, logs) is exactly as it was."""
    import pytest

    from orchestrator.core.errors import OrchestratorError
    from orchestrator.executors import base
    from orchestrator.spec.loading import spec_from_dict
    from orchestrator.plan import plan

    launch = plan(spec_from_dict({"name": "again", "entrypoint": "jobs.train:main", "runs_dir": str(tmp_path / "runs")}),
                  "local")
    record, lock = base.prepare_run_dir(launch)
    lock.release()
    record.update(state="COMPLETED", ended=1.0)
    run_dir = Path(launch.run_dir)
    for rel in ("result.json", "logs/rank-0.log", "ranks/rank-0.json"):
        _write(run_dir, rel, "the completed attempt's " + rel)
    before = {k: v for k, v in _tree(run_dir).items() if k not in ("lock", "lease.json")}

    def full(path, data):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(base, "write_json_atomic", full)
    with pytest.raises((OSError, OrchestratorError)):
        base.prepare_run_dir(launch)
    after = {k: v for k, v in _tree(run_dir).items() if k not in ("lock", "lease.json")}
    assert after == before
