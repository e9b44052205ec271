from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from orchestrator.executors.base import prepare_run_dir
from orchestrator.backends.local.supervisor import Supervisor
from orchestrator.spec.loading import spec_from_dict
from orchestrator.plan import LaunchPlan, plan
from orchestrator.core.records import RunRecord

SCRIPTS = Path(__file__).parent / "scripts"


def make_plan(tmp_path: Path, **fields: Any) -> LaunchPlan:
    spec = {"name": "t", "entrypoint": "jobs.train:main", "runs_dir": str(tmp_path / "runs"), **fields}
    return plan(spec_from_dict(spec), "local")


def run_local(launch: LaunchPlan) -> RunRecord:
    return Supervisor(launch, *prepare_run_dir(launch)).run()


def start_detached(launch: LaunchPlan) -> RunRecord:
    """Start the run with its supervisor in the background (as ``run --detach`` does); pair with
    ``wait_ended``. A test's reference run goes there, so that it trains while the test's own run
    is being started, slowed or interrupted, instead of before it."""
    from orchestrator.backends.local.executor import LocalExecutor

    return LocalExecutor().submit(launch)


def wait_ended(launch: LaunchPlan, within: float = 300) -> RunRecord:
    """The run's record once it reached a terminal state (started by ``start_detached``)."""
    import time

    from orchestrator.core.states import TERMINAL

    deadline = time.monotonic() + within
    while (record := RunRecord.load(launch.run_dir)).state not in TERMINAL:
        assert time.monotonic() < deadline, f"{launch.run_dir} did not end within {within:.0f}s: {record.state}"
        time.sleep(0.1)
    return record


def final_weights(launch: LaunchPlan) -> dict[str, torch.Tensor]:
    from jobs.checkpoint import latest_checkpoint, load_checkpoint

    path = latest_checkpoint(Path(launch.payload.checkpoint.dir))
    assert path is not None, f"no checkpoint in {launch.payload.checkpoint.dir}"
    return load_checkpoint(path)["model"]


def alive_processes_mentioning(text: str) -> list[int]:
    """PIDs of live (non-zombie) processes whose command line contains text."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if text in cmd and state != "Z":
            found.append(int(pid))
    return found


def leftover_ranks(run_dir: str) -> list[str]:
    """Ranks (and their children) of a run still alive: any process whose command line names the
    run folder, or any live member of a rank's process group (each rank leads its own session,
    forked or spawned)."""
    left = [f"pid {p}" for p in alive_processes_mentioning(run_dir)]
    record = RunRecord.load(run_dir)
    for pid in record.rank_pids:
        for other in os.listdir("/proc"):
            if not other.isdigit():
                continue
            try:
                fields = Path(f"/proc/{other}/stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if fields[0] != "Z" and int(fields[2]) == pid:  # field 5 of stat: the process group
                left.append(f"pid {other} in rank group {pid}")
    return left
