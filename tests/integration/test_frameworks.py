"""Lightning, Fabric, accelerate and the transformers Trainer, each with its own script run
unmodified through the real CLI (``orchestrator run``, 2 emulated nodes x 2 CPU ranks, gloo), train
as ONE world of 4: each rank writes what the framework itself made of the world to its own file
(opened with 'x', so two ranks that each think they are rank 0 fail), and accelerate's own test
script takes its distributed branch on every rank.

accelerate ships runnable test scripts (accelerate/test_utils/scripts); test_sync.py is the one
that runs at any world size on CPU with ``Accelerator()`` (test_script.py assumes 2 processes,
test_distributed_data_loop.py 2 GPUs, test_ops.py builds only ``PartialState()``, which on CPU never
reads ACCELERATE_USE_CPU: alone under ``accelerate launch --cpu`` too). Lightning and transformers
ship no runnable example: tests/integration/scripts/fw_*.py are the smallest user scripts, on the
shipped demo classes (Lightning's BoringModel) or a tiny BERT from a config on random data.
Each costs 15-25 s on 2 cores, almost all of it four ranks importing the framework.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

SCRIPTS = Path(__file__).parent / "scripts"
WORLD = 4
CASES = ["lightning", "fabric", "accelerate", "transformers"]


def accelerate_script(name: str) -> Path:
    """One of accelerate's shipped test scripts, found without importing accelerate."""
    found = importlib.util.find_spec("accelerate")
    assert found is not None and found.origin, "accelerate is not installed (pip install '.[frameworks]')"
    return Path(found.origin).parent / "test_utils" / "scripts" / name


def framework_spec(name: str, out: Path, **fields: Any) -> dict[str, Any]:
    """2 nodes x 2 CPU ranks of the framework's script, with no shape in its arguments: the
    framework gets the run's shape from what ``framework:`` exports."""
    spec: dict[str, Any] = {"name": f"fw-{name}", "framework": name, "nodes": 2, "cpu_ranks_per_node": 2, **fields}
    if name == "accelerate":
        spec["entrypoint"] = str(accelerate_script("test_sync.py"))
    elif name == "transformers":
        # HfArgumentParser reads booleans as values: dataloader_pin_memory defaults to true.
        spec.update(entrypoint=str(SCRIPTS / "fw_trainer.py"), bool_args="value",
                    args={"output_dir": str(out), "max_steps": 2, "per_device_train_batch_size": 2, "report_to": "none",
                          "save_strategy": "no", "disable_tqdm": True, "dataloader_pin_memory": False})
    else:
        spec.update(entrypoint=str(SCRIPTS / f"fw_{name}.py"), args={"out": str(out)})
    return spec


def rank_log(run_dir: Path, rank: int) -> str:
    """A rank's output: logs/rank-N.log locally, slurm/<job>_<task>_log.out on SLURM."""
    local = run_dir / "logs" / f"rank-{rank}.log"
    if local.exists():
        return local.read_text()
    return "".join(p.read_text() for p in sorted((run_dir / "slurm").glob(f"*_{rank}_log.out")))


def assert_one_world(name: str, out: Path, run_dir: Path, environment: str) -> None:
    """What each framework saw: world 4, every rank its own index, one world's collectives."""
    if name == "accelerate":
        logs = {r: rank_log(run_dir, r) for r in range(WORLD)}
        for r, log in logs.items():
            assert "NOOP `no_sync`" not in log, f"rank {r} ran alone (DistributedType.NO):\n{log[-2000:]}"
        for r in (0, 2):  # local process index 0 of each node prints the distributed tests' titles
            assert "**Test Distributed `no_sync` context manager**" in logs[r], logs[r][-2000:]
        assert sorted(p.name for p in (run_dir / "joined").glob("rank-?")) == [f"rank-{r}" for r in range(WORLD)]
        return
    prefix = {"lightning": "lightning", "fabric": "fabric", "transformers": "trainer"}[name]
    seen = {p.name: json.loads(p.read_text()) for p in out.glob(f"{prefix}-*.json")}
    assert sorted(seen) == [f"{prefix}-{r}.json" for r in range(WORLD)], sorted(seen)
    states = [seen[f"{prefix}-{r}.json"] for r in range(WORLD)]
    assert all(s["world_size"] == WORLD for s in states), states
    if name == "lightning":
        assert [(s["global_rank"], s["node_rank"]) for s in states] == [(0, 0), (1, 0), (2, 1), (3, 1)], states
        assert all(s["num_devices"] == 2 and s["num_nodes"] == 2 and s["steps"] == 2 for s in states), states
        assert all(s["strategy"] == "DDPStrategy" and s["environment"] == environment for s in states), states
    elif name == "fabric":
        assert [s["global_rank"] for s in states] == list(range(WORLD)), states
        assert all(s["gathered_ranks"] == list(range(WORLD)) and s["environment"] == environment for s in states)
    else:
        assert [s["process_index"] for s in states] == list(range(WORLD)), states
        assert all(s["parallel_mode"] == "ParallelMode.DISTRIBUTED" and s["steps"] == 2 for s in states), states
        assert all(s["pin_memory"] is False for s in states), states  # '--dataloader_pin_memory false' arrived


@pytest.mark.parametrize("name", CASES)
def test_framework_scripts_train_as_one_world_through_the_cli(tmp_path: Path, name: str) -> None:
    out, runs = tmp_path / "out", tmp_path / "runs"
    out.mkdir()
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(framework_spec(name, out, runs_dir=str(runs), local={"emulate_nodes": 2})))
    done = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(spec)], capture_output=True, text=True,
                          timeout=150, cwd=tmp_path)
    assert done.returncode == 0 and "COMPLETED" in done.stdout, (done.stdout[-3000:], done.stderr[-3000:])
    (run_dir,) = runs.glob(f"fw-{name}-*")
    assert_one_world(name, out, run_dir, environment="LightningEnvironment")
