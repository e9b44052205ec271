"""What the site decides reaches the job (issue 32), on the deploy cluster's site profile.

- ``DefCpuPerGPU=2`` (deploy/cluster.sh, --profile site): a GPU spec that sets no
  ``slurm.cpus_per_task`` renders no ``--cpus-per-task`` and no ``--wckey``, so every rank gets
  the site's CPUs per GPU, bound to them (one rank per node: the nodes claim 4 CPUs on a 2-core
  machine, so two ranks of 2 CPUs each would share real ones).
- ``SBATCH_ACCOUNT`` and ``SBATCH_PARTITION`` exported by the user reach sbatch: the job is
  charged to that account and runs in that partition when the spec names none.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.cluster.test_slurm import run, slurm_plan

PROBE = textwrap.dedent("""\
    import json, os, sys
    out = sys.argv[1]
    json.dump({"affinity": len(os.sched_getaffinity(0)), "threads": os.environ.get("OMP_NUM_THREADS"),
               "cpus_per_task": os.environ.get("SLURM_CPUS_PER_TASK"), "account": os.environ.get("SLURM_JOB_ACCOUNT"),
               "partition": os.environ.get("SLURM_JOB_PARTITION")},
              open(os.path.join(out, f"rank-{os.environ['RANK']}.json"), "w"))
""")


def _probe(cluster: dict[str, str], name: str) -> tuple[Path, Path]:
    folder = Path(cluster["runs_dir"]) / f"{name}-probe"
    folder.mkdir(exist_ok=True)
    (folder / "probe.py").write_text(PROBE)
    out = folder / "out"
    out.mkdir(exist_ok=True)
    return folder / "probe.py", out


def test_gpu_ranks_without_cpus_per_task_get_the_sites_cpus_per_gpu(cluster: dict[str, str]) -> None:
    script, out = _probe(cluster, "cpg")
    launch = slurm_plan(cluster, name="cpg", entrypoint=str(script), extra_args=[str(out)], nodes=2,
                        gpus_per_node=1, cpu_ranks_per_node=1, distributed={"backend": "gloo"})
    script_text = launch.sbatch_script or ""
    assert "--cpus-per-task" not in script_text and "--wckey" not in script_text, script_text
    record = run(launch)
    assert record.state == "COMPLETED", record.error
    for rank in (0, 1):
        seen = json.loads((out / f"rank-{rank}.json").read_text())
        assert seen["affinity"] == 2 and seen["threads"] == "2", seen  # DefCpuPerGPU=2, one GPU each


def test_the_users_sbatch_account_and_partition_reach_the_job(cluster: dict[str, str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    subprocess.run(["sacctmgr", "-i", "add", "account", "orch-site-acct"], capture_output=True, timeout=60)
    subprocess.run(["sacctmgr", "-i", "add", "user", "root", "account=orch-site-acct"], capture_output=True, timeout=60)
    monkeypatch.setenv("SBATCH_ACCOUNT", "orch-site-acct")
    monkeypatch.setenv("SBATCH_PARTITION", "high")
    script, out = _probe(cluster, "acct")
    launch = slurm_plan(cluster, name="acct", entrypoint=str(script), extra_args=[str(out)], nodes=1,
                        cpu_ranks_per_node=1)
    record = run(launch)
    assert record.state == "COMPLETED", record.error
    seen = json.loads((out / "rank-0.json").read_text())
    assert seen["account"] == "orch-site-acct" and seen["partition"] == "high", seen
    job = record.job_ids[0]
    acct = subprocess.run(["sacct", "-j", job, "-X", "-n", "-P", "-o", "account"], capture_output=True,
                          text=True, timeout=60, env={**os.environ})
    assert acct.stdout.strip().splitlines()[0] == "orch-site-acct", acct.stdout + acct.stderr  # charged to it
