"""The init deadline and the did-nothing warning for plain scripts that never call into jobs/:
the launcher sees init_process_group return (orchestrator.node.join_hook), the supervisor enforces
distributed.init_timeout_s from outside the ranks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.core.records import RunRecord
from tests.integration.helpers import SCRIPTS, leftover_ranks, make_plan, run_local

ROOT = Path(__file__).resolve().parents[2]


# The deadline counts from the ranks' start: fresh interpreters (no preload) import torch first,
# on 2 cores beside the cluster suite (four at once have taken over 10 s): that case runs two ranks,
# with a longer deadline; the forked ranks (preload) run four, on two emulated nodes.
@pytest.mark.parametrize("preload,deadline,nodes,absent,waiting",
                         [(True, 10, 2, 2, "ranks 0, 1, 3"), (False, 20, 1, 1, "rank 0")],
                         ids=["forked-4-ranks", "fresh-2-ranks"])
def test_a_rank_that_never_joins_ends_the_job_naming_it(tmp_path: Path, preload: bool, deadline: int, nodes: int,
                                                        absent: int, waiting: str) -> None:
    launch = make_plan(tmp_path, entrypoint=str(SCRIPTS / "never_joins.py"), extra_args=[str(absent)], nodes=nodes,
                       cpu_ranks_per_node=2, distributed={"backend": "gloo", "init_timeout_s": deadline},
                       local={"preload_torch": preload})
    t0 = time.monotonic()
    record = run_local(launch)
    took = time.monotonic() - t0
    print(f"never-joining rank -> job ended: {took:.1f}s (init_timeout_s {deadline})")
    assert record.state == "FAILED" and record.failed_rank == absent, record.error
    assert took < deadline + 15
    assert f"rank {absent} never called init_process_group" in (record.error or "")
    assert f"{waiting} waited" in (record.error or ""), record.error
    assert "wait_for_data" in record.waits[str(absent)] and "waiting in init_process_group" in record.waits["0"]
    assert not leftover_ranks(launch.run_dir)


def test_ranks_that_join_are_not_ended_by_the_deadline(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    # joins at once, then runs well past the deadline (twice its length after joining)
    launch = make_plan(tmp_path, entrypoint=str(SCRIPTS / "busy_loop.py"), extra_args=[str(out), "6"], nodes=1,
                       cpu_ranks_per_node=2, distributed={"backend": "gloo", "init_timeout_s": 3})
    record = run_local(launch)
    assert record.state == "COMPLETED", record.error
    assert record.warning is None
    assert sorted(p.name for p in (Path(launch.run_dir) / "joined").iterdir() if p.suffix != ".calling") == \
        ["rank-0", "rank-1"]


def test_did_nothing_is_completed_with_a_warning_everywhere(tmp_path: Path) -> None:
    spec = {"name": "nothing", "entrypoint": str(SCRIPTS / "no_group.py"), "nodes": 2, "cpu_ranks_per_node": 2,
            "runs_dir": str(tmp_path / "runs"), "distributed": {"backend": "gloo"}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "ORCHESTRATOR_HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(path)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "COMPLETED" in run.stdout and "warning: all 4 ranks exited 0 but none joined a process group" in run.stderr
    status = subprocess.run([sys.executable, "-m", "orchestrator", "status"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert "COMPLETED" in status.stdout and "warning: all 4 ranks exited 0" in status.stdout, status.stdout


def test_a_real_ddp_script_is_not_warned_about(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    launch = make_plan(tmp_path, entrypoint=str(SCRIPTS / "byo_ddp.py"), extra_args=["--out", str(out)], nodes=1,
                       cpu_ranks_per_node=2, distributed={"backend": "gloo"})
    record = run_local(launch)
    assert record.state == "COMPLETED" and record.warning is None, record
    assert RunRecord.load(launch.run_dir).warning is None
