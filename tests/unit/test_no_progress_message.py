"""The "no progress" verdict (``recovery.decide``) tells a failure that repeats from a checkpoint
folder that never received a checkpoint (a script that saves its own elsewhere): only the first
says "the failure repeats"; the second names the folder and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from orchestrator.core.payload import RecoverySettings
from orchestrator.core.recovery import KINDS, Attempt, Failure, History, decide

CKPT = "/shared/ckpt/my job"


def _settings(**over: object) -> RecoverySettings:
    base = dict(max_restarts=3, on=KINDS, exclude_failed_nodes=True, health_check=True, node_check=None,
                stop_without_progress=2)
    base.update(over)
    return RecoverySettings(**base)  # type: ignore[arg-type]


def _attempt(number: int, at_start: str = "", progress: Optional[bool] = False, ended: bool = True,
             folder: str = CKPT) -> Attempt:
    if not ended:  # the attempt being decided on
        return Attempt(number=number, started=float(number), checkpoint_at_start=at_start, checkpoint_dir=folder)
    return Attempt(number=number, started=float(number), checkpoint_at_start=at_start, checkpoint_dir=folder,
                   ended=number + 0.5, outcome="crash", why="flaky node", progress=progress, action="restart")


def _history(*attempts: Attempt) -> History:
    return History(Path("/nonexistent/recovery.json"), list(attempts))


def test_a_folder_that_never_held_a_checkpoint_is_named_with_the_fix() -> None:
    d = decide(_settings(), _history(_attempt(1), _attempt(2, ended=False)), Failure("crash", "step 7"), False)
    assert (d.restart, d.reason) == (False, "no_progress")
    assert d.message.startswith("no progress: 2 attempt(s) in a row failed"), d.message
    assert f"no checkpoint ever appeared in {CKPT} (checkpoint.dir; recovery.stop_without_progress: 2)" in d.message
    assert "set checkpoint.dir to that folder" in d.message
    assert "recovery.stop_without_progress: 4 to use every restart" in d.message  # max_restarts 3: never stops early
    assert "the failure repeats" not in d.message


def test_only_a_folder_that_held_checkpoints_says_the_failure_repeats() -> None:
    never = decide(_settings(), _history(_attempt(1), _attempt(2, ended=False)), Failure("crash", "x"), False)
    wrote = _history(_attempt(1, progress=True), _attempt(2, at_start="ab12"), _attempt(3, at_start="cd34"),
                     _attempt(4, at_start="cd34", ended=False))
    resumed = _history(_attempt(1, at_start="ab12"), _attempt(2, at_start="ab12", ended=False))  # held one already
    assert "the failure repeats" not in never.message
    for history in (wrote, resumed):
        d = decide(_settings(max_restarts=5), history, Failure("crash", "x"), False)
        assert (d.restart, d.reason) == (False, "no_progress")
        assert d.message.endswith("the failure repeats, so fix it and submit again"), d.message
        assert "ever appeared" not in d.message


def test_survivors_keep_and_a_record_without_the_folder() -> None:
    keep = decide(_settings(survivors="keep", max_restarts=1000, stop_without_progress=3),
                  _history(_attempt(1), _attempt(2), _attempt(3, ended=False)), Failure("crash", "x"), False)
    assert "and no attempt trained past the last step" in keep.message
    assert "recovery.stop_without_progress: 1000 to use every restart" in keep.message  # the field's bound
    older = decide(_settings(), _history(_attempt(1, folder=""), _attempt(2, folder="", ended=False)),
                   Failure("crash", "x"), False)
    assert "no checkpoint ever appeared in checkpoint.dir (recovery.stop_without_progress: 2)" in older.message


def test_each_attempt_records_its_checkpoint_folder(tmp_path: Path) -> None:
    history = History(tmp_path / "recovery.json")
    history.begin(1, ["node1"], tmp_path / "ckpt")
    assert History.read(tmp_path).attempts[0].checkpoint_dir == str(tmp_path / "ckpt")
    assert History.read(tmp_path).checkpoints_never_seen()
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "step-1.pt").write_bytes(b"x")
    history.begin(2, ["node1"], tmp_path / "ckpt")
    assert not History.read(tmp_path).checkpoints_never_seen()
