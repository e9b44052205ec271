"""On SLURM too, what ``plan`` shows is what every rank gets: the environment real srun tasks see
(an unmodified script), compared with the plan's rows. A value known only at run time is shown in
the plan as the rule that produces it; here the rule is checked against what the rank got."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.backends.slurm.slurm_plan import SLURM_RULES
from orchestrator.node.rank_env import cpu_share_rule, granted_cpus
from orchestrator.core.rendezvous import derive_port
from orchestrator.backends.slurm.node.slurm_task import SlurmJob

from .test_slurm import no_job_processes, run, slurm_plan

SCRIPTS = Path(__file__).parents[1] / "integration" / "scripts"
SCRIPT = SCRIPTS / "env_dump.py"
#: What torchrun and the orchestrator set: every one of them a rank has must be in its plan row.
CONTRACT = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "NNODES",
            "MASTER_ADDR", "MASTER_PORT", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}


def test_slurm_ranks_get_exactly_the_planned_environment(cluster: dict[str, str]) -> None:
    out = Path(cluster["runs_dir"]) / "contract-out"
    work = Path(cluster["runs_dir"]) / "contract-work"
    out.mkdir(exist_ok=True)
    launch = slurm_plan(cluster, name="contract", entrypoint=str(SCRIPT), extra_args=["--out", str(out)],
                        env={"CONTRACT_VAR": "a b $HOME ;", "NCCL_DEBUG": "WARN"}, workdir=str(work))
    record = run(launch)
    assert record.state == "COMPLETED", record.error
    for row in launch.ranks:
        seen = json.loads((out / f"env-{row.rank}.json").read_text())
        env = seen["env"]
        assert seen["cwd"] == str(work)
        job = SlurmJob.from_environ(env)
        # No slurm.cpus_per_task: each rank's share of the CPUs SLURM granted its node (the fewest
        # of any node), which the agent gave srun as --cpus-per-task
        share = str(max(1, (granted_cpus({"SLURM_JOB_CPUS_PER_NODE": env["SLURM_JOB_CPUS_PER_NODE"]}) or 0)
                        // launch.ranks_per_node))
        rules = {SLURM_RULES["master_addr"]: job.hosts[0], SLURM_RULES["port"]: str(derive_port(job.raw_job_id, job.attempt)),
                 SLURM_RULES["attempt"]: str(job.attempt), SLURM_RULES["job"]: job.job_id,
                 SLURM_RULES["restart"]: str(job.attempt), cpu_share_rule(launch.ranks_per_node): share}
        for key, planned in row.env.items():
            if planned == "<interface that routes to MASTER_ADDR>":
                assert env.get(key) == seen["routing_interface"], (row.rank, key, env.get(key), seen["routing_interface"])
                continue
            for rule, value in rules.items():
                planned = planned.replace(rule, value)
            assert "<" not in planned, f"no check for the planned rule {planned!r}"
            assert env.get(key) == planned, (row.rank, key, env.get(key), planned)
        ours = {k for k in env if k.startswith("ORCH_") or k in CONTRACT}
        assert ours <= set(row.env), f"rank {row.rank} got variables plan does not show: {sorted(ours - set(row.env))}"
        # the site profile: each node's own name is loopback there, as with Debian's /etc/hosts, and
        # still no rank of this 2-node job is bound to lo (the others could never reach it)
        assert seen["own_name_ip"] == "127.0.1.1", seen["own_name_ip"]
        # auto: gloo gets the route to the master; NCCL is left to choose for itself (issue 32)
        assert env["GLOO_SOCKET_IFNAME"] == "eth0" and "NCCL_SOCKET_IFNAME" not in env, \
            (env["GLOO_SOCKET_IFNAME"], env.get("NCCL_SOCKET_IFNAME"))
        assert env["CONTRACT_VAR"] == "a b $HOME ;"
        assert env["OMP_NUM_THREADS"] == env["SLURM_CPUS_PER_TASK"] == share  # the rank's share of its node's CPUs
        # orchestrator.node.malloc: srun started the rank without the heap settings; the launcher applied them
        assert seen["heap_faults_per_cycle"] < 1000, seen["heap_faults_per_cycle"]
    assert no_job_processes()


def test_startup_variables_take_effect_on_slurm_ranks(cluster: dict[str, str]) -> None:
    """PYTHONHASHSEED and PYTHONPATH from the spec's env are in place when srun starts each rank's
    interpreter: every rank of both nodes hashes alike and imports from that folder."""
    out = Path(cluster["runs_dir"]) / "startup-out"
    lib = Path(cluster["runs_dir"]) / "startup-lib"
    out.mkdir(exist_ok=True)
    lib.mkdir(exist_ok=True)
    (lib / "startup_probe_module.py").write_text("VALUE = 1\n")
    launch = slurm_plan(cluster, name="startup", entrypoint=str(SCRIPTS / "startup_env.py"),
                        extra_args=["--out", str(out)], env={"PYTHONHASHSEED": "0", "PYTHONPATH": str(lib)})
    record = run(launch)
    assert record.state == "COMPLETED", record.error
    seen = [json.loads((out / f"startup-{r}.json").read_text()) for r in range(launch.world_size)]
    assert len({s["hash"] for s in seen}) == 1, seen
    assert all(s["module"] == str(lib / "startup_probe_module.py") for s in seen)
    assert no_job_processes()
