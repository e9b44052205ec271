"""Node-local files are ours alone (orchestrator.core.node_local): the private folder is checked
before use, writes never follow a link, reads never take a link, a FIFO or a stranger's file."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from orchestrator.core import node_local
from orchestrator.core.node_local import NotOurs
from orchestrator.backends.slurm.node import gate_step

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
OTHER_UID = 65534  # nobody


def _private(path: Path) -> Path:
    path.mkdir(mode=0o700)
    return path


def test_a_folder_we_made_is_private_and_reused(tmp_path: Path) -> None:
    folder = node_local.ensure_private(tmp_path / "orch")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert node_local.ensure_private(tmp_path / "orch") == folder


@pytest.mark.parametrize("plant", ["link", "file", "loose"])
def test_a_planted_or_open_folder_is_refused(tmp_path: Path, plant: str) -> None:
    target = tmp_path / "orch"
    if plant == "link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        target.symlink_to(tmp_path / "elsewhere")
    elif plant == "file":
        target.write_text("")
    else:
        target.mkdir(mode=0o700)
        target.chmod(0o777)
    with pytest.raises(NotOurs):
        node_local.ensure_private(target)


@ROOT_ONLY
def test_a_folder_another_user_made_is_refused(tmp_path: Path) -> None:
    target = _private(tmp_path / "orch")
    os.chown(target, OTHER_UID, OTHER_UID)
    with pytest.raises(NotOurs, match="another user"):
        node_local.ensure_private(target)


def test_the_next_candidate_is_used_when_the_first_is_not_ours(tmp_path: Path, monkeypatch, capsys) -> None:
    first, second = tmp_path / "xdg", tmp_path / "slurm"
    first.mkdir()
    second.mkdir()
    uid = os.geteuid()
    (first / f"orch-u{uid}").symlink_to(tmp_path)  # planted
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(first))
    monkeypatch.delenv("SLURM_TMPDIR", raising=False)
    monkeypatch.setattr(node_local, "_WARNED", set())
    got = node_local.private_root()
    assert got != first / f"orch-u{uid}" and got.name == f"orch-u{uid}"
    assert "not using" in capsys.readouterr().err
    monkeypatch.setenv("SLURM_TMPDIR", str(second))
    assert node_local.private_root() == second / f"orch-u{uid}"


def test_with_no_candidate_left_the_caller_is_told(tmp_path: Path, monkeypatch) -> None:
    bad = tmp_path / "bad"
    bad.write_text("")
    monkeypatch.setattr(node_local, "candidates", lambda environ=None: [tmp_path / "f1"])
    (tmp_path / "f1").write_text("not a folder")
    with pytest.raises(NotOurs, match="no node-local folder"):
        node_local.private_root()


def test_a_write_replaces_a_planted_link_and_never_writes_through_it(tmp_path: Path) -> None:
    folder = _private(tmp_path / "orch")
    victim = tmp_path / "victim"
    victim.write_text("mine")
    victim.chmod(0o600)
    (folder / ".published").symlink_to(victim)
    node_local.write_private(folder / ".published", b"1.0")
    assert victim.read_text() == "mine"
    assert not (folder / ".published").is_symlink() and (folder / ".published").read_bytes() == b"1.0"


def test_reads_refuse_links_fifos_and_strangers_files(tmp_path: Path) -> None:
    folder = _private(tmp_path / "orch")
    (folder / "real").write_text('{"go": true}')
    (folder / "link").symlink_to(folder / "real")
    os.mkfifo(folder / "fifo")
    assert node_local.read_private(folder / "real") == b'{"go": true}'
    with pytest.raises(OSError):
        node_local.read_private(folder / "link")
    done = threading.Event()

    def read_fifo() -> None:
        with pytest.raises(NotOurs):
            node_local.read_private(folder / "fifo")
        done.set()

    threading.Thread(target=read_fifo, daemon=True).start()
    assert done.wait(5), "reading a FIFO blocked"


@ROOT_ONLY
def test_a_gate_decision_another_user_wrote_is_never_taken(tmp_path: Path) -> None:
    """The node's other tasks accept only the copy this user wrote: a planted {"go": true} (or
    {"go": false}) never starts (or ends) an attempt."""
    folder = _private(tmp_path / "gate")
    planted = folder / "decision.json"
    planted.write_text(json.dumps({"go": True, "why": ""}))
    os.chown(planted, OTHER_UID, OTHER_UID)
    assert gate_step._take_copy(folder, 1, 1) is None
    planted.unlink()
    planted.symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text(json.dumps({"go": False, "why": "forged"}))
    assert gate_step._take_copy(folder, 1, 1) is None
    planted.unlink()
    gate_step._leave_copy(folder, {"go": True, "why": ""})
    assert gate_step._take_copy(folder, 1, 1) == {"go": True, "why": ""}


@ROOT_ONLY
def test_a_stranger_owned_copy_folder_is_not_waited_on(tmp_path: Path, monkeypatch) -> None:
    """A folder at the copy's name that is not ours is ignored: the task takes the shared decision."""
    folder = _private(tmp_path / "gate")
    (folder / "decision.json").write_text(json.dumps({"go": True, "why": ""}))
    os.chown(folder, OTHER_UID, OTHER_UID)
    monkeypatch.setattr(gate_step, "wait_for_decision", lambda *a, **k: {"go": False, "why": "the real one"})
    assert gate_step._wait_on_node(str(tmp_path), 1, folder, wait_s=3) == {"go": False, "why": "the real one"}


def test_stale_folders_of_killed_ranks_are_swept_and_live_ones_kept(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(node_local, "candidates", lambda environ=None: [tmp_path / "orch"])
    root = node_local.private_root()
    old, live = root / "old", root / "live"
    old.mkdir()
    live.mkdir()
    (old / "rank-0.json").write_text("{}")
    os.utime(old, (0, 0))
    assert node_local.sweep_stale() == 1
    assert not old.exists() and live.exists()


def test_a_progress_fifo_in_the_run_folder_never_hangs_the_reader(tmp_path: Path) -> None:
    from orchestrator.core.progress import read_progress

    (tmp_path / "progress").mkdir()
    os.mkfifo(tmp_path / "progress" / "node-9.json")
    (tmp_path / "progress" / "node-0.json").write_text(
        json.dumps({"node": 0, "time": 1.0, "ranks": {"0": {"rank": 0, "time": 1.0, "step": 3}}}))
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(read_progress(tmp_path, 1)), daemon=True)
    thread.start()
    thread.join(5)
    assert result, "a FIFO among the heartbeat files hung the reader"
    assert result[0][0].step == 3  # type: ignore[index]
