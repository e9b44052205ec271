"""`orchestrator validate --cluster` on the deploy cluster's site profile (issue 32).

The site profile has two partitions over the same nodes (debug, high: MaxTime one day) and sets
DefCpuPerGPU=2 cluster-wide (deploy/cluster.sh), so:

- a partition list whose partitions all exist validates, and one with a partition that does not
  is refused naming it (sbatch refuses the whole list: 'invalid partition specified');
- a GPU spec with no CPU count gets the site's 2 CPUs per GPU: no one-CPU warning; one that asks
  for slurm.cpus_per_task: 1 is warned, on stderr, and still validates (exit code 0).

Each case is one ``orchestrator validate`` (the CLI's own main, in this process): three scontrol
calls, well under a second each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli import main
from .conftest import CPUS, RUNS_DIR


def _validate(tmp_path: Path, capsys: pytest.CaptureFixture[str], **slurm: Any) -> tuple[int, str, str]:
    spec = {"name": "vc", "entrypoint": "jobs.train:main", "executor": "slurm", "nodes": 2, "gpus_per_node": 1,
            "runs_dir": str(RUNS_DIR),  # validate --cluster refuses the default 'runs' from a checkout in /tmp
            "distributed": {"backend": "gloo"}, "slurm": {"time": "00:10:00", **slurm}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    capsys.readouterr()
    code = main(["validate", str(path), "--cluster"])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_partition_lists_and_cpus_per_gpu_rank_on_the_site_profile(cluster: dict[str, str], tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _validate(tmp_path, capsys, partition="debug,high")
    assert code == 0 and out.startswith("ok: vc"), (out, err)
    assert "warning" not in err, err  # DefCpuPerGPU=2 cluster-wide: each GPU rank gets 2 CPUs

    code, out, err = _validate(tmp_path, capsys, partition="debug,nosuch")
    assert code == 2, (out, err)
    assert "slurm.partition: 'nosuch' does not exist" in err and "partitions here: debug, high" in err, err
    assert "'debug'" not in err, err

    code, out, err = _validate(tmp_path, capsys, partition="high", time="2-00:00:00")
    assert code == 2 and "exceeds partition high's MaxTime 1-00:00:00" in err, (out, err)

    code, out, err = _validate(tmp_path, capsys, cpus_per_task=1)
    assert code == 0, (out, err)
    assert "warning: CPUs: each GPU rank would get 1 CPU in partition debug" in err, err
    assert f"raise slurm.cpus_per_task (up to {CPUS}" in err, err  # what the deploy nodes claim

