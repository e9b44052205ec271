"""What the site decides reaches the job (issue 32), on the deploy cluster's site profile.

- ``DefCpuPerGPU=2`` (deploy/cluster.sh, --profile site): a GPU spec that sets no
  ``slurm.cpus_per_task`` renders no ``--cpus-per-task`` and no ``--wckey``, so every rank gets
  the site's CPUs per GPU, bound to them (one rank per node: the nodes claim 6 CPUs on a 2-core
  machine, so two ranks of 2 CPUs each would share real ones).
- ``SBATCH_ACCOUNT`` and ``SBATCH_PARTITION`` exported by the user reach sbatch: the job is
  charged to that account and runs in that partition when the spec names none.
- ``AccountingStorageEnforce=associations`` with a required account (``physics``, root's default):
  a job charged to an account root has no association with is refused by sbatch, and the error
  names the account and where it came from; a job that names none is charged to the default, and
  (``TrackWCKey=yes``, no ``--wckey``) booked to root's default wckey.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from orchestrator.core.errors import SubmissionError
from orchestrator.backends.slurm.executor import SlurmExecutor
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


def test_an_account_without_an_association_is_refused_naming_it_and_the_default_one_works(
        cluster: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SBATCH_ACCOUNT", raising=False)
    # The account exists; root has no association with it (deploy/cluster.sh gives root 'physics').
    subprocess.run(["sacctmgr", "-i", "add", "account", "chemistry"], capture_output=True, timeout=60)
    script, out = _probe(cluster, "noassoc")
    refused = slurm_plan(cluster, name="noassoc", entrypoint=str(script), extra_args=[str(out)], nodes=1,
                         cpu_ranks_per_node=1, slurm={"time": "00:10:00", "account": "chemistry"})
    with pytest.raises(SubmissionError) as info:
        SlurmExecutor().submit(refused)
    message = str(info.value)
    assert "Invalid account" in message, message  # sbatch's own words
    assert "the account 'chemistry' (slurm.account) is not one user root may charge" in message, message
    assert "sacctmgr show assoc user=root" in message, message
    assert not list(out.glob("rank-*.json"))  # nothing ran

    default = slurm_plan(cluster, name="defacct", entrypoint=str(script), extra_args=[str(out)], nodes=1,
                         cpu_ranks_per_node=1)
    record = run(default)
    assert record.state == "COMPLETED", record.error
    seen = json.loads((out / "rank-0.json").read_text())
    assert seen["account"] == "physics", seen  # the user's default account, the site's required one
    # TrackWCKey: no --wckey (the spec sets none), so the user's default wckey ('*' marks a default).
    # Asked of the controller: sacct's copy of the job's wckey was still empty a moment after its end.
    shown = subprocess.run(["scontrol", "show", "job", record.job_ids[0]], capture_output=True, text=True,
                           timeout=60).stdout
    assert "Account=physics" in shown and "WCKey=*physics" in shown, shown
