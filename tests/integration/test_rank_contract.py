"""What ``plan`` shows is what every rank gets: the environment real local ranks see, compared
with the plan's rows (the spec's ``env`` and ``workdir`` included), with an unmodified script."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator import JobSpec, run
from orchestrator.plan import plan

SCRIPTS = Path(__file__).parent / "scripts"
SCRIPT = SCRIPTS / "env_dump.py"


@pytest.mark.parametrize("preload", [True, False], ids=["forked", "fresh"])
def test_local_ranks_get_exactly_the_planned_environment(tmp_path: Path, preload: bool) -> None:
    """Every variable of every rank equals its plan row, and every variable the orchestrator adds to
    what the rank inherits (ORCH_* included) is in that row: nothing is added behind plan's back."""
    out, work = tmp_path / "out", tmp_path / "work" / "here"
    out.mkdir()
    spec = JobSpec(name="contract", entrypoint=str(SCRIPT), nodes=2, cpu_ranks_per_node=2, args={"out": str(out)},
                   runs_dir=str(tmp_path / "runs"), env={"CONTRACT_VAR": "a b $HOME ;", "OMP_NUM_THREADS": "2"},
                   workdir=str(work), local={"preload_torch": preload})
    launch = plan(spec)
    assert launch.rank_start == ("fork" if preload else "fresh")
    inherited = dict(os.environ)
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
        added = {k for k in env if inherited.get(k) != env[k]} - set(row.env)
        assert not added, f"rank {row.rank} got variables plan does not show: {sorted(added)}"
        assert {k for k in env if k.startswith("ORCH_")} <= set(row.env)
        assert env["CONTRACT_VAR"] == "a b $HOME ;"  # as written: no shell read it
        assert env["OMP_NUM_THREADS"] == "2"  # the spec's env wins over the thread default
        assert seen["heap_faults_per_cycle"] < 1000, seen["heap_faults_per_cycle"]  # orchestrator.node.malloc applied


def test_startup_variables_take_effect_on_forked_ranks(tmp_path: Path) -> None:
    """PYTHONHASHSEED and PYTHONPATH are read only when an interpreter starts: a job whose env sets
    them runs each rank as a fresh interpreter (plan says so), so every rank hashes alike and
    imports from that folder, as under torchrun or srun."""
    out, lib = tmp_path / "out", tmp_path / "lib"
    out.mkdir()
    lib.mkdir()
    (lib / "startup_probe_module.py").write_text("VALUE = 1\n")
    spec = JobSpec(name="startup", entrypoint=str(SCRIPTS / "startup_env.py"), nodes=1, cpu_ranks_per_node=2,
                   args={"out": str(out)}, runs_dir=str(tmp_path / "runs"),
                   env={"PYTHONHASHSEED": "0", "PYTHONPATH": str(lib)})
    launch = plan(spec)
    assert launch.rank_start == "fresh"
    assert any("PYTHONHASHSEED" in note and "PYTHONPATH" in note for note in launch.notes), launch.notes
    handle = run(spec)
    assert handle.state == "COMPLETED", handle.error
    seen = [json.loads((out / f"startup-{r}.json").read_text()) for r in range(2)]
    assert seen[0]["hash"] == seen[1]["hash"]
    assert all(s["module"] == str(lib / "startup_probe_module.py") for s in seen)
    # the value a PYTHONHASHSEED=0 interpreter computes, not the zygote's random one
    import subprocess
    import sys

    expected = subprocess.run([sys.executable, "-c", "print(hash('the same string on every rank'))"],
                              env={**os.environ, "PYTHONHASHSEED": "0"}, capture_output=True, text=True).stdout
    assert seen[0]["hash"] == int(expected)
