"""A run folder whose disk takes no more writes never leaves a run RUNNING: the supervisor stops
the ranks and ends the run FAILED naming the disk (written over the record in place when no new
file fits), and where even the record cannot be written, `status` infers that the supervisor let
the run go and reports it FAILED, also while the process that supervised it lives on (a notebook,
a pipeline). Real local runs of a tiny standard-library script: the failing writes are injected
(ENOSPC, EROFS), or, as root, made real on a 2 MiB tmpfs. Every wait is bounded."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.core import records
from orchestrator.core.errors import JobFailedError
from orchestrator.core.records import RunRecord

SLEEP = Path(__file__).parent / "scripts" / "sleep.py"
FILL = """import os, sys, time
try:
    with open(os.path.join(os.environ["ORCH_RUN_DIR"], "filler"), "wb") as fh:
        while True:
            fh.write(b"x" * 65536)
            fh.flush()
except OSError as exc:
    print("filled:", exc.strerror, file=sys.stderr, flush=True)
time.sleep(float(sys.argv[sys.argv.index("--seconds") + 1]))
"""


def _spec(runs: Path, entrypoint: Path, name: str) -> dict[str, Any]:
    return {"name": name, "entrypoint": str(entrypoint), "nodes": 1, "cpu_ranks_per_node": 1,
            "runs_dir": str(runs), "code": {"snapshot": False}, "local": {"preload_torch": False},
            "recovery": {"health_check": False}, "args": {"seconds": 1}}


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _full_once_ranks_run(monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    """From the write that records the ranks' pids on, every new file for record.json fails with
    ``err`` (as on a full or read-only disk: what exists stays readable)."""
    real, full = records.write_json_atomic, []

    def write(path: Any, data: Any) -> None:
        if Path(path).name == "record.json" and (full or isinstance(data, dict) and data.get("rank_pids")):
            full.append(path)
            raise OSError(err, os.strerror(err))
        real(path, data)

    monkeypatch.setattr(records, "write_json_atomic", write)


def test_a_full_disk_ends_the_run_failed_naming_the_disk_written_in_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator import Run, run

    _full_once_ranks_run(monkeypatch, errno.ENOSPC)
    handle = run(_spec(tmp_path / "runs", SLEEP, "enospc"))
    assert handle.state == "FAILED"  # read back from the folder: the end was written
    error = handle.error or ""
    assert "disk holding the run folder" in error and "No space left on device" in error, error
    assert Run.get(str(handle.run_dir)).status() == "FAILED"
    pids = RunRecord.load(handle.run_dir).rank_pids  # written with the end, in place
    assert pids and not any(_alive(pid) for pid in pids)


def test_a_record_that_cannot_be_written_is_reported_failed_not_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator import Run, run

    _full_once_ranks_run(monkeypatch, errno.EROFS)
    with pytest.raises(JobFailedError, match="read-only") as info:
        run(_spec(tmp_path / "runs", SLEEP, "erofs"))
    assert "could not be recorded" in str(info.value)
    run_dir = next((tmp_path / "runs").glob("erofs-*"))
    on_disk = RunRecord.load(run_dir)
    assert on_disk.state == "RUNNING" and on_disk.supervisor_pid == os.getpid()  # this process lives on
    # The disk is still read-only: the verdict cannot be written, and is FAILED all the same.
    handle = Run.get(str(run_dir))
    assert handle.status() == "FAILED"
    assert "supervisor" in (handle._record.error or "") and "read-only" in (handle._record.error or "")
    assert handle.wait(timeout=5) == "FAILED"
    monkeypatch.undo()  # the disk is writable again: the next look records it
    assert Run.get(str(run_dir)).status() == "FAILED"
    assert RunRecord.load(run_dir).state == "FAILED"
    again = run(_spec(tmp_path / "runs", SLEEP, "erofs"))  # and the spec runs again in the same folder
    assert again.state == "COMPLETED" and RunRecord.load(run_dir).attempts == 2


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Any:
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("a real full disk needs root to mount a tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield disk
    finally:
        for _ in range(50):
            if subprocess.run(["umount", str(disk)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)


@pytest.mark.parametrize("detach", [False, True], ids=["foreground", "detached"])
def test_a_real_full_disk_ends_the_run_failed(tmp_path: Path, tiny_disk: Path, detach: bool) -> None:
    (tmp_path / "fill.py").write_text(FILL)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_spec(tiny_disk / "runs", tmp_path / "fill.py", "full")))
    cli = [sys.executable, "-m", "orchestrator"]
    out = subprocess.run([*cli, "run", *(["--detach"] if detach else []), str(spec)], capture_output=True,
                         text=True, timeout=120)
    run_dir = next((tiny_disk / "runs").glob("full-*"))
    if detach:
        assert out.returncode == 0, out.stderr
        deadline = time.monotonic() + 60
        while RunRecord.load(run_dir).state == "RUNNING" and _alive(RunRecord.load(run_dir).supervisor_pid or 0):
            assert time.monotonic() < deadline, "the supervisor never gave up"
            time.sleep(0.2)
    else:
        assert out.returncode == 1 and "FAILED" in out.stdout, (out.stdout, out.stderr)
        assert "disk holding the run folder" in out.stderr and "Traceback" not in out.stderr, out.stderr
    status = subprocess.run([*cli, "status", "--json", str(run_dir)], capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    shown = shown[0] if isinstance(shown, list) else shown
    assert shown["state"] == "FAILED", shown
    assert "disk holding the run folder" in (shown.get("error") or ""), shown
