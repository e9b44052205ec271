"""Restarts inside the SLURM allocation (recovery.in_allocation, recovery.spares), without processes:
which nodes the next step runs on, the job's attempt the ranks are told, what a step's task reads of
SLURM's variables, the spec's and the plan's side. The agent doing it on a real cluster:
tests/cluster/test_recovery_slurm.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.backends.slurm.node.agent_decisions import attempt_in_job, step_hosts
from orchestrator.core.errors import SpecError
from orchestrator.spec.loading import spec_from_dict
from orchestrator.core.recovery import History, describe
from orchestrator.backends.slurm.slurm_plan import submitit_parameters
from orchestrator.spec.models import allocated_nodes
from orchestrator.backends.slurm.node.slurm_task import ATTEMPT_VARIABLE, SlurmTask
from orchestrator.core.states import Action, Outcome

NAMES = st.lists(st.sampled_from([f"node{i}" for i in range(1, 9)]), unique=True, max_size=8)


@given(NAMES, NAMES, st.integers(min_value=0, max_value=9))
def test_the_next_step_takes_the_first_nodes_not_avoided_or_none(allocation: list[str], avoid: list[str],
                                                                 nodes: int) -> None:
    step = step_hosts(allocation, avoid, nodes)
    usable = [h for h in allocation if h not in avoid]
    if nodes == 0 or len(usable) < nodes:
        assert step is None
    else:
        assert step == tuple(usable[:nodes])  # the allocation's order: the batch host first when it is usable
        assert not set(step) & set(avoid) and len(set(step)) == nodes


def test_the_jobs_attempt_counts_every_attempt_of_that_job_from_zero() -> None:
    assert attempt_in_job([], 1) == 0
    assert attempt_in_job([1], 1) == 0
    assert attempt_in_job([1, 2], 3) == 2  # a requeue and a restart inside the job alike
    assert attempt_in_job([4], 5) == 1  # a spec submitted again: this job's first attempt was the run's 4th


def test_a_step_task_reads_the_steps_nodes_and_the_attempt_the_agent_gave() -> None:
    base = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-3]", "SLURM_JOB_NUM_NODES": "3", "SLURM_PROCID": "1",
            "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_NTASKS": "2", "SLURM_RESTART_COUNT": "1"}
    old = SlurmTask.from_environ(base)  # an agent that says nothing: SLURM's own variables, as before
    assert (old.hosts, old.nnodes, old.job.attempt, old.job.restart) == (("node1", "node2", "node3"), 3, 1, 1)
    task = SlurmTask.from_environ({**base, "SLURM_STEP_NODELIST": "node[1,3]", "SLURM_STEP_NUM_NODES": "2",
                                   ATTEMPT_VARIABLE: "2"})
    assert (task.hosts, task.nnodes, task.job.attempt, task.job.restart) == (("node1", "node3"), 2, 2, 1)
    assert task.job.hosts == ("node1", "node2", "node3")  # the allocation, spares included
    assert task.job.requeue_marker("/r").endswith("-7-2")  # one marker per attempt, restarts inside the job too


def test_the_ranks_master_is_the_steps_first_node(tmp_path: Path) -> None:
    from orchestrator.plan import plan
    from orchestrator.backends.slurm.node.slurm_task import rank_env_from_slurm

    spec = spec_from_dict({"name": "m", "entrypoint": "jobs.train:main", "executor": "slurm", "nodes": 2,
                           "cpu_ranks_per_node": 1, "runs_dir": str(tmp_path), "recovery": {"max_restarts": 1,
                                                                                          "spares": 1},
                           "distributed": {"backend": "gloo", "init_method": "tcp", "interface": "lo"}})
    launch = plan(spec, "slurm")
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-3]", "SLURM_JOB_NUM_NODES": "3", "SLURM_PROCID": "0",
           "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": "node[2-3]",
           "SLURM_STEP_NUM_NODES": "2", ATTEMPT_VARIABLE: "1"}
    rank = rank_env_from_slurm(SlurmTask.from_environ(env), launch.payload)
    assert (rank.master_addr, rank.nnodes, rank.world_size) == ("node2", 2, 2)


def test_spares_are_asked_of_sbatch_and_need_restarts(tmp_path: Path) -> None:
    fields = {"name": "s", "entrypoint": "jobs.train:main", "executor": "slurm", "nodes": 2, "cpu_ranks_per_node": 1,
              "runs_dir": str(tmp_path)}
    spec = spec_from_dict({**fields, "recovery": {"max_restarts": 2, "spares": 1}})
    assert allocated_nodes(spec) == 3 and spec.world_size == 2
    params = submitit_parameters(spec)
    assert params["nodes"] == 3 and params["additional_parameters"]["no-kill"] is True
    assert allocated_nodes(spec_from_dict({**fields, "recovery": {"max_restarts": 2}})) == 2
    with pytest.raises(SpecError, match="spares: 1 holds nodes only a restart can use.*max_restarts"):
        spec_from_dict({**fields, "recovery": {"spares": 1}})


def test_the_plan_says_the_spares_and_the_payload_carries_them(tmp_path: Path) -> None:
    from orchestrator.plan import plan

    spec = spec_from_dict({"name": "p", "entrypoint": "jobs.train:main", "executor": "slurm", "nodes": 2,
                           "cpu_ranks_per_node": 1, "runs_dir": str(tmp_path),
                           "recovery": {"max_restarts": 2, "spares": 1, "in_allocation": False}})
    launch = plan(spec, "slurm")
    assert any("recovery.spares: 1: the job holds 3 nodes" in n for n in launch.notes)
    assert (launch.payload.recovery.spares, launch.payload.recovery.in_allocation) == (1, False)
    assert "#SBATCH --nodes=3" in launch.sbatch_script


def test_the_plans_restart_sentence_follows_in_allocation(tmp_path: Path) -> None:
    """plan says what a restart is: inside the allocation (the default), a requeue only when too few
    healthy nodes are left; with in_allocation: false, a requeue every time. Never "requeues the job"
    for both."""
    from orchestrator.backends.slurm.slurm_plan import recovery_how
    from orchestrator.plan import plan

    fields = {"name": "r", "entrypoint": "jobs.train:main", "executor": "slurm", "nodes": 2, "cpu_ranks_per_node": 1,
              "runs_dir": str(tmp_path)}

    def how(**recovery: object) -> str:
        spec = spec_from_dict({**fields, "recovery": {"max_restarts": 2, **recovery}})
        return recovery_how(plan(spec, "slurm").payload.recovery)

    inside = how(spares=1)
    assert inside.startswith("restarts the ranks inside the allocation (no requeue), a lost or blamed node swapped for "
                             "one of its 1 spare(s); requeues the job without the nodes blamed only when too few"), inside
    assert how().startswith("restarts the ranks inside the allocation (no requeue); requeues the job without")
    assert "a lost node swapped" in how(spares=1, exclude_failed_nodes=False)
    assert how(in_allocation=False) == "requeues the job without the nodes blamed (recovery.in_allocation: false)"
    assert how(in_allocation=False, exclude_failed_nodes=False) == "requeues the job (recovery.in_allocation: false)"


def test_a_payload_written_before_spares_existed_restarts_inside_the_job(tmp_path: Path) -> None:
    from orchestrator.core.payload import Payload
    from orchestrator.plan import plan

    spec = spec_from_dict({"name": "o", "entrypoint": "jobs.train:main", "executor": "slurm", "nodes": 1,
                           "cpu_ranks_per_node": 1, "runs_dir": str(tmp_path), "recovery": {"max_restarts": 1}})
    data = plan(spec, "slurm").payload.to_dict()
    for key in ("spares", "in_allocation"):
        data["recovery"].pop(key)
    old = Payload.from_dict(data, where="an old payload")
    assert (old.recovery.spares, old.recovery.in_allocation) == (0, True)


def test_status_tells_a_restart_inside_the_job_from_a_requeue(tmp_path: Path) -> None:
    history = History(tmp_path / "recovery.json")
    first = history.begin(1, ["node1", "node2"], tmp_path, job="7")
    first.inside_job = True
    history.finish(first, Outcome.CRASH, "rank 1 raised RuntimeError: boom", action=Action.RESTART)
    second = history.begin(2, ["node1", "node3"], tmp_path, job="7")
    history.finish(second, Outcome.NODE_FAILURE, "lost node(s) node3", action=Action.RESTART, blamed=["node3"])
    history.begin(3, ["node1", "node2"], tmp_path, job="7")
    shown = "\n".join(describe(History.load(tmp_path)))
    assert "attempt 1 on node1,node2: crash, restarted inside the job: rank 1 raised" in shown
    assert "attempt 2 on node1,node3: node_failure, restarted: lost node(s) node3" in shown
    loaded = History.load(tmp_path)
    assert (loaded.restarts(), loaded.restarts_by_requeue()) == (2, 1)


def test_the_health_gate_clears_what_killed_ranks_left_in_node_memory(tmp_path: Path) -> None:
    """Ranks killed by a restart never left their node's heartbeat staging folder (/dev/shm); the
    next attempt's gate, on every node before any rank starts, removes this run's, and only its."""
    from orchestrator.node.health import clear_staging_left
    from orchestrator.core.progress import staging_dir

    run, other = tmp_path / "run", tmp_path / "other"
    left = [staging_dir(run, 0, 0), staging_dir(run, 1, 1)]
    theirs = staging_dir(other, 0, 0)
    try:
        for folder in (*left, theirs):
            folder.mkdir()
            (folder / "rank-0.json").write_text("{}")
        assert clear_staging_left(str(run)) == 2
        assert not any(f.exists() for f in left) and theirs.exists()
        assert clear_staging_left(str(run)) == 0
    finally:
        import shutil

        for folder in (*left, theirs):
            shutil.rmtree(folder, ignore_errors=True)
