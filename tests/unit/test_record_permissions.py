"""Run folders shared within a group: records are created with the user's umask (not 0600), a
teammate who may read but not write a run folder gets its status, and a record one may not read
says "no permission" (whose, and the fix), never "damaged ... remove the run folder".

The tests run as root, for whom no mode bit refuses a read: the refusals are injected."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.front import operations
from orchestrator.core import records
from orchestrator.backends.slurm.node import slurm_controller
from orchestrator.cli import main
from orchestrator.core.errors import RunNotFoundError
from orchestrator.backends.slurm import executor as slurm
from orchestrator.core.safe_read import NoPermission
from orchestrator.core.records import RunRecord, register, resolve_run, write_json_atomic, write_text_atomic
from orchestrator.core.states import State


@pytest.fixture
def umask():
    """Set the process umask for one test."""
    old = os.umask(0o022)
    os.umask(old)
    yield lambda mask: os.umask(mask)
    os.umask(old)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600), (0o027, 0o640)])
def test_records_follow_the_umask(tmp_path: Path, umask, mask: int, mode: int) -> None:
    umask(mask)
    rec = RunRecord(run_id="u-0123abcd", run_dir=str(tmp_path), executor="slurm")
    rec.save()
    assert stat.S_IMODE(os.stat(rec.path).st_mode) == mode
    rec.update(state=State.RUNNING)  # rewritten (a new file, renamed over): the same mode
    assert stat.S_IMODE(os.stat(rec.path).st_mode) == mode
    write_json_atomic(tmp_path / "end.json", {"reason": "x"})
    write_text_atomic(tmp_path / "note.txt", "x")
    assert {stat.S_IMODE(os.stat(tmp_path / n).st_mode) for n in ("end.json", "note.txt")} == {mode}


def _record(tmp_path: Path, executor: str = "slurm") -> Path:
    run_dir = tmp_path / "runs" / "team-0123abcd"
    run_dir.mkdir(parents=True)
    rec = RunRecord(run_id="team-0123abcd", run_dir=str(run_dir), executor=executor, job_ids=["31"])
    rec.save()
    register(rec)
    return run_dir


def _refuse_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(path: Path, max_bytes: int) -> bytes:
        raise NoPermission(path, "it cannot be read: no permission (EACCES)")

    monkeypatch.setattr(records, "read_regular", refused)


def test_a_record_one_may_not_read_says_no_permission_not_damaged(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = _record(tmp_path)
    _refuse_reads(monkeypatch)
    with pytest.raises(RunNotFoundError) as caught:
        RunRecord.load(run_dir)
    text = str(caught.value)
    assert text.startswith(f"no permission to read the run's record {run_dir / 'record.json'}")
    assert "owned by " in text and "-rw-" in text  # whose it is, and its mode
    assert f"chmod -R g+rX {run_dir}" in text and "group" in text
    assert "damaged" not in text and "remove" not in text


def test_status_and_list_say_no_permission(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _record(tmp_path)
    _refuse_reads(monkeypatch)
    assert main(["status", str(run_dir)]) != 0
    err = capsys.readouterr().err
    assert "no permission to read" in err and "damaged" not in err
    assert main(["list"]) == 0  # over the registry: the run is skipped, with the reason
    err = capsys.readouterr().err
    assert "skipping 'team-0123abcd': no permission to read" in err and "damaged" not in err


def test_a_folder_one_may_not_enter_says_no_permission(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _record(tmp_path)
    record = str(run_dir / "record.json")
    real_lstat, real_stat = os.lstat, os.stat

    def lstat(path, *a, **kw):
        if os.fspath(path) == record:
            raise PermissionError(errno.EACCES, "Permission denied", record)
        return real_lstat(path, *a, **kw)

    def stat_(path, *a, **kw):
        if os.fspath(path) == record:
            raise PermissionError(errno.EACCES, "Permission denied", record)
        return real_stat(path, *a, **kw)

    monkeypatch.setattr(os, "lstat", lstat)
    monkeypatch.setattr(os, "stat", stat_)
    with pytest.raises(RunNotFoundError, match="^no permission to read the run's record"):
        resolve_run(str(run_dir))
    assert operations._records([]) == []
    err = capsys.readouterr().err
    assert "skipping 'team-0123abcd': no permission to read" in err and "damaged" not in err


def test_a_teammate_who_cannot_write_the_folder_still_gets_the_status(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """status refreshes the record from the scheduler; a reader who may not write it keeps the answer."""
    run_dir = _record(tmp_path)
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr(slurm_controller, "subprocess", SimpleNamespace(
        run=lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, "31|RUNNING\n", ""),
        TimeoutExpired=subprocess.TimeoutExpired))

    def refused(path, data) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(records, "write_json_atomic", refused)
    [fresh] = slurm.SlurmExecutor().refresh([RunRecord.load(run_dir)])
    assert fresh.state == State.RUNNING
    assert RunRecord.load(run_dir).state == State.PENDING  # nothing was written
    monkeypatch.setattr(records, "write_json_atomic", lambda path, data: (_ for _ in ()).throw(OSError(errno.EIO, "EIO")))
    with pytest.raises(OSError):  # any other write error is still an error
        slurm.SlurmExecutor().refresh([RunRecord.load(run_dir)])


def test_a_run_whose_folder_is_gone_is_named_gone_not_a_damaged_folder(tmp_path: Path) -> None:
    """The registry still names a run whose folder was moved, removed, or never kept (a first
    submission sbatch refused): asking for it by id says the folder is gone and what to give instead."""
    import shutil

    import pytest

    from orchestrator.core.errors import RunNotFoundError

    run_dir = tmp_path / "runs" / "gone-1234abcd"
    run_dir.mkdir(parents=True)
    record = RunRecord(run_id="gone-1234abcd", run_dir=str(run_dir), executor="local")
    record.save()
    register(record)
    assert resolve_run("gone") == run_dir.resolve()
    shutil.rmtree(run_dir)
    with pytest.raises(RunNotFoundError, match=r"no run 'gone' any more: its folder .* is gone \(moved or removed\)"):
        resolve_run("gone")
