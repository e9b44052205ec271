"""What ``plan`` shows is what every rank gets: the environment real local ranks see, compared
with the plan's rows (the spec's ``env`` and ``workdir`` included), with an unmodified script."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator import JobSpec, run
from orchestrator.plan import plan

SCRIPT = Path(__file__).parent / "scripts" / "env_dump.py"


def test_local_ranks_get_exactly_the_planned_environment(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work" / "here"
    out.mkdir()
    spec = JobSpec(name="contract", entrypoint=str(SCRIPT), nodes=2, cpu_ranks_per_node=2, args={"out": str(out)},
                   runs_dir=str(tmp_path / "runs"), env={"CONTRACT_VAR": "a b $HOME ;", "OMP_NUM_THREADS": "2"},
                   workdir=str(work))
    launch = plan(spec)
    handle = run(spec)
    assert handle.state == "COMPLETED", handle.error
    port = str(handle.record.master_port)
    for row in launch.ranks:
        seen = json.loads((out / f"env-{row.rank}.json").read_text())
        env = seen["env"]
        assert seen["cwd"] == str(work)
        for key, planned in row.env.items():
            if key == "MASTER_PORT":  # planned from the run id; the next free one if that is taken
                assert env[key] == port
            elif key == "ORCH_INIT_METHOD":
                assert env[key] == planned.replace(row.env["MASTER_PORT"], port)
            else:
                assert env.get(key) == planned, (row.rank, key, env.get(key), planned)
        assert env["CONTRACT_VAR"] == "a b $HOME ;"  # as written: no shell read it
        assert env["OMP_NUM_THREADS"] == "2"  # the spec's env wins over the thread default
        assert seen["heap_faults_per_cycle"] < 1000, seen["heap_faults_per_cycle"]  # orchestrator.malloc applied
