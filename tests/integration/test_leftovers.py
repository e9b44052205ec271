"""After any local run ends, no process it started remains: not a DataLoader-style child in a
rank's session, and not a grandchild that left for a session of its own and ignores SIGTERM."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator.core import procs
from orchestrator.core.records import RunRecord

from .helpers import SCRIPTS, make_plan, run_local


def _left_pids(run_dir: str) -> dict[str, int]:
    return {p.name: int(p.read_text()) for p in Path(run_dir).glob("left-*.pid")}


@pytest.mark.parametrize("mode,state,preload", [("exit", "COMPLETED", True), ("raise", "FAILED", True),
                                                 ("exit", "COMPLETED", False)])
def test_no_process_outlives_a_local_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, state: str,
                                         preload: bool) -> None:
    monkeypatch.setenv("LEAVE_MODE", mode)
    launch = make_plan(tmp_path, entrypoint=str(SCRIPTS / "leave_daemon.py"), nodes=1, cpu_ranks_per_node=2,
                       local={"preload_torch": preload, "timeout_s": 120})
    started = time.monotonic()
    record = run_local(launch)
    assert record.state == state, record.error
    pids = _left_pids(launch.run_dir)
    assert len(pids) == 4, pids  # a daemon and a child per rank were really started
    alive = {name: pid for name, pid in pids.items() if procs.alive(pid)}
    assert not alive, f"left running after the run ended: {alive}"
    leftovers = (Path(launch.run_dir) / "logs" / "leftovers.log").read_text()
    assert "stopped" in leftovers
    assert time.monotonic() - started < 60
    assert RunRecord.load(launch.run_dir).state == state
