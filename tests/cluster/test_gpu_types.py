"""Typed GPUs and node selection on the deploy/ cluster (2 nodes, 2 fake 'a100' GPUs each).

The typed request (--gpus-per-node=a100:2) and the quoted host lists submitit writes
(--nodelist='node[1-2]') go to the real sbatch 22.05; the ranks report what SLURM bound; a type
the cluster lacks is refused by `validate --cluster` with the types it has, where sbatch itself only
says "Requested node configuration is not available".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.core.errors import SubmissionError
from orchestrator.backends.slurm.executor import SlurmExecutor
from orchestrator.backends.slurm.slurm_checks import check_against_cluster
from orchestrator.spec.loading import spec_from_dict

from .test_slurm import run, slurm_plan

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).parent / "scripts"
GLOO = {"backend": "gloo", "interface": "eth0"}


def _gpu_job(cluster: dict[str, str], name: str, out: Path, **fields: Any) -> Any:
    out.mkdir(parents=True, exist_ok=True)
    return slurm_plan(cluster, name=name, entrypoint=str(SCRIPTS / "gpu_show.py"), extra_args=["--out", str(out)],
                      gpus_per_node=2, distributed=GLOO, **fields)


def _ranks(out: Path, world: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"gpu-{r}.json").read_text()) for r in range(world)]


def _validate(cluster: dict[str, str], tmp_path: Path, **fields: Any) -> subprocess.CompletedProcess[str]:
    spec = {"name": "v", "entrypoint": "jobs.train:main", "executor": "slurm", "gpus_per_node": 2,
            "runs_dir": cluster["runs_dir"],  # validate --cluster refuses the default 'runs' from a checkout in /tmp
            "distributed": {"backend": "gloo"}, **fields}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return subprocess.run([sys.executable, "-m", "orchestrator", "validate", str(path), "--cluster"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "SLURM_CONF": cluster["SLURM_CONF"]})


def test_typed_gpus_on_a_bracketed_nodelist(cluster: dict[str, str]) -> None:
    out = Path(cluster["runs_dir"]) / "typed-out"
    launch = _gpu_job(cluster, "typed", out, nodes=2, slurm={"time": "00:10:00", "gpu_type": "a100",
                                                             "nodelist": "node[1-2]"})
    lines = (launch.sbatch_script or "").splitlines()
    assert "#SBATCH --gpus-per-node=a100:2" in lines, lines
    assert "#SBATCH --nodelist='node[1-2]'" in lines, lines  # quoted by submitit; sbatch must strip the quotes
    check_against_cluster(spec_from_dict(launch.spec))
    record = run(launch)
    assert record.state == "COMPLETED", record.error
    # SLURM recorded the typed request on the job, and allocated exactly the listed nodes.
    job = subprocess.run(["scontrol", "show", "job", record.job_ids[0]], capture_output=True, text=True, timeout=30,
                         check=True).stdout
    assert "TresPerNode=gres:gpu:a100:2" in job, job
    assert "ReqNodeList=node[1-2] " in job and " NodeList=node[1-2]\n" in job, job
    ranks = _ranks(out, 4)
    assert [r["sum"] for r in ranks] == [10.0] * 4  # the four ranks formed one gloo group
    for node, pair in (("node1", ranks[:2]), ("node2", ranks[2:])):
        assert {r["SLURMD_NODENAME"] for r in pair} == {r["hostname"] for r in pair} == {node}, pair
        # The torchrun contract: each rank sees its node's two GPUs and LOCAL_RANK picks its own...
        assert all(r["CUDA_VISIBLE_DEVICES"] == "0,1" for r in pair), pair
        assert sorted(r["LOCAL_RANK"] for r in pair) == ["0", "1"], pair
        # ...out of what SLURM bound to the step, for the typed request.
        assert all(r["SLURM_STEP_GPUS"] == "0,1" and r["SLURM_JOB_GPUS"] == "0,1" for r in pair), pair
        assert all(r["SLURM_GPUS_PER_NODE"] == "a100:2" for r in pair), pair


def test_a_type_the_cluster_lacks_is_refused_before_sbatch(cluster: dict[str, str], tmp_path: Path) -> None:
    ok = _validate(cluster, tmp_path, nodes=2, slurm={"gpu_type": "a100"})
    assert ok.returncode == 0, ok.stderr
    for wrong, hint in (("h100", "set slurm.gpu_type to one of a100"),
                        ("A100", "did you mean slurm.gpu_type: a100?")):
        bad = _validate(cluster, tmp_path, slurm={"gpu_type": wrong})
        assert bad.returncode == 2, (bad.stdout, bad.stderr)
        assert f"slurm.gpu_type: partition debug has no '{wrong}' GPUs; its nodes have a100 (up to 2 per node, " \
               "on 2 node(s))" in bad.stderr, bad.stderr
        assert hint in bad.stderr, bad.stderr
        # sbatch refuses the same job, without saying why: what the check is for.
        launch = _gpu_job(cluster, f"wrongtype-{wrong}", tmp_path / "never",
                          slurm={"time": "00:10:00", "gpu_type": wrong})
        with pytest.raises(SubmissionError, match="Requested node configuration is not available"):
            SlurmExecutor().submit(launch)
    more = _validate(cluster, tmp_path, gpus_per_node=3, slurm={"gpu_type": "a100"})
    assert more.returncode == 2 and "gpus_per_node: 3 a100 GPU(s) requested but partition debug's nodes have at " \
        "most 2 a100 GPU(s)" in more.stderr, more.stderr


def test_exclude_keeps_the_job_off_a_node_and_untyped_gpus_still_bind(cluster: dict[str, str]) -> None:
    out = Path(cluster["runs_dir"]) / "exclude-out"
    launch = _gpu_job(cluster, "exclude", out, nodes=1, slurm={"time": "00:10:00", "exclude": "node1"})
    assert "#SBATCH --gpus-per-node=2" in (launch.sbatch_script or "").splitlines()  # untyped, on typed GPUs
    record = run(launch)
    assert record.state == "COMPLETED", record.error
    ranks = _ranks(out, 2)
    assert {r["SLURMD_NODENAME"] for r in ranks} == {r["hostname"] for r in ranks} == {"node2"}, ranks
    assert all(r["CUDA_VISIBLE_DEVICES"] == "0,1" for r in ranks), ranks
    assert sorted(r["LOCAL_RANK"] for r in ranks) == ["0", "1"], ranks
    assert all(r["SLURM_GPUS_PER_NODE"] == "2" for r in ranks), ranks


def test_hosts_the_cluster_lacks_are_refused(cluster: dict[str, str], tmp_path: Path) -> None:
    bad = _validate(cluster, tmp_path, nodes=2, slurm={"nodelist": "node[2-3]", "exclude": "gpu7"})
    assert bad.returncode == 2, (bad.stdout, bad.stderr)
    assert "slurm.nodelist: node3 is not a node of this cluster" in bad.stderr, bad.stderr
    assert "slurm.exclude: gpu7 is not a node of this cluster" in bad.stderr, bad.stderr
    assert "nodes here: node1, node2" in bad.stderr, bad.stderr
    launch = _gpu_job(cluster, "nohost", tmp_path / "never", nodes=2,
                      slurm={"time": "00:10:00", "nodelist": "node[2-3]"})
    with pytest.raises(SubmissionError, match="Invalid node name specified"):
        SlurmExecutor().submit(launch)
    too_few = _validate(cluster, tmp_path, nodes=2, slurm={"exclude": "node2"})
    assert too_few.returncode == 2 and "slurm.exclude: leaves 1 of partition debug's 2 node(s), fewer than nodes: 2" \
        in too_few.stderr, too_few.stderr
