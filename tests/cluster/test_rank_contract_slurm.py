"""On SLURM too, what ``plan`` shows is what every rank gets: the environment real srun tasks see
(an unmodified script), compared with the plan's rows. A value known only at run time is shown in
the plan as the rule that produces it; here the rule is checked against what the rank got."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.rank_env import derive_port, expand_nodelist, slurm_job_id

from .test_slurm import no_job_processes, run, slurm_plan

SCRIPT = Path(__file__).parents[1] / "integration" / "scripts" / "env_dump.py"


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
        addr = expand_nodelist(env["SLURM_JOB_NODELIST"])[0]
        port = str(derive_port(slurm_job_id(env), int(env.get("SLURM_RESTART_COUNT", "0"))))
        rules = {"<first host of SLURM_JOB_NODELIST>": addr,
                 "<derive_port(SLURM_JOB_ID, restart): 20000-31999>": port}
        for key, planned in row.env.items():
            if planned == "<interface that routes to MASTER_ADDR>":
                assert env.get(key) == seen["routing_interface"], (row.rank, key, env.get(key), seen["routing_interface"])
                continue
            for rule, value in rules.items():
                planned = planned.replace(rule, value)
            assert "<" not in planned, f"no check for the planned rule {planned!r}"
            assert env.get(key) == planned, (row.rank, key, env.get(key), planned)
        assert env["CONTRACT_VAR"] == "a b $HOME ;"
        assert env["OMP_NUM_THREADS"] == "1"  # slurm.cpus_per_task
        # orchestrator.malloc: srun started the rank without the heap settings; the launcher applied them
        assert seen["heap_faults_per_cycle"] < 1000, seen["heap_faults_per_cycle"]
    assert no_job_processes()
