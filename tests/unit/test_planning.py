from __future__ import annotations

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.core import lean_record
from orchestrator.spec.loading import load_spec, spec_from_dict
from orchestrator.plan import plan, render_argv, run_id_for
from orchestrator.backends.slurm.slurm_plan import array_chunks
from orchestrator.node.rank_env import RankEnv, node_devices, slurm_visible_devices
from orchestrator.core.rendezvous import PORT_BASE, PORT_SPAN, derive_port
from orchestrator.backends.slurm.node.slurm_task import SlurmTask, expand_nodelist
from orchestrator.spec.validators import EPHEMERAL_PORTS, slurm_time_minutes

# A shared-looking runs_dir: a SLURM plan refuses the default 'runs' from a checkout in /tmp.
SHARED_RUNS = "/shared/runs"
CLUSTER = {"name": "c", "entrypoint": "jobs.train:main", "nodes": 2, "gpus_per_node": 8, "runs_dir": SHARED_RUNS,
           "distributed": {"backend": "nccl", "init_method": "tcp", "interface": "ib0"}}


def test_cluster_spec_downscales_honestly_on_local() -> None:
    launch = plan(spec_from_dict(CLUSTER), "local")
    assert (launch.nodes, launch.ranks_per_node, launch.backend) == (2, 2, "gloo")
    assert any("nccl -> gloo" in n for n in launch.notes)
    assert any("2 emulated node(s) x 2" in n for n in launch.notes)
    envs = [r.env for r in launch.ranks]
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["NODE_RANK"] for e in envs] == ["0", "0", "1", "1"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"]
    assert all(e["ORCH_INIT_METHOD"] == f"tcp://127.0.0.1:{e['MASTER_PORT']}" for e in envs)
    assert all(e["GLOO_SOCKET_IFNAME"] == "lo" for e in envs)


def test_slurm_plan_rank_table() -> None:
    launch = plan(spec_from_dict(CLUSTER), "slurm")
    assert launch.world_size == 16 and len(launch.ranks) == 16
    assert launch.submitit["ntasks_per_node"] == 8 and launch.submitit["gpus_per_node"] == 8
    assert "--kill-on-bad-exit=1" in launch.payload.srun
    # No CPU count asked of sbatch (the site's DefCpuPerGPU applies); srun gets each rank's share of
    # what SLURM granted, as the rule the job's agent resolves (SLURM 22.05's srun does not inherit it)
    assert "cpus_per_task" not in launch.submitit
    assert "--cpus-per-task=<SLURM_CPUS_ON_NODE / 8>" in launch.payload.srun
    launch = plan(spec_from_dict({**CLUSTER, "slurm": {"cpus_per_task": 6}}), "slurm")
    assert launch.submitit["cpus_per_task"] == 6 and "--cpus-per-task=6" in launch.payload.srun
    assert launch.ranks[9].env["NODE_RANK"] == "1" and launch.ranks[9].env["LOCAL_RANK"] == "1"
    assert launch.ranks[0].env["NCCL_SOCKET_IFNAME"] == "ib0"


def test_plan_is_deterministic_and_serialisable() -> None:
    a, b = plan(spec_from_dict(CLUSTER), "slurm"), plan(spec_from_dict(CLUSTER), "slurm")
    assert a == b
    assert json.loads(a.model_dump_json())["run_id"] == run_id_for(spec_from_dict({**CLUSTER, "executor": "slurm"}))


def test_dp_is_one_process_with_all_devices() -> None:
    spec = spec_from_dict({"name": "dp", "entrypoint": "jobs.train:main", "gpus_per_node": 4, "strategy": "dp",
                           "local": {"devices": [0, 1, 2, 3]}})
    launch = plan(spec, "local")
    assert launch.world_size == 1
    assert launch.ranks[0].env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_local_devices_are_the_nodes_and_local_rank_indexes_them() -> None:
    spec = spec_from_dict({"name": "g", "entrypoint": "jobs.train:main", "gpus_per_node": 2,
                           "local": {"devices": [2, 3]}})
    launch = plan(spec, "local")
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in launch.ranks] == ["2,3", "2,3"]
    assert [r.env["LOCAL_RANK"] for r in launch.ranks] == ["0", "1"]
    assert launch.backend == "nccl"


def test_port_is_derived_outside_ephemeral_range() -> None:
    ports = {derive_port(str(j), r) for j in range(2000) for r in range(3)}
    assert min(ports) >= PORT_BASE and max(ports) < PORT_BASE + PORT_SPAN < EPHEMERAL_PORTS[0]
    assert derive_port("123", 0) == derive_port("123", 0) != derive_port("123", 1)


@given(first=st.integers(0, 10**9), offset=st.integers(1, PORT_SPAN - 1), restart=st.integers(0, 20))
def test_jobs_with_nearby_ids_never_share_a_port(first: int, offset: int, restart: int) -> None:
    """At one restart count, jobs less than PORT_SPAN ids apart get distinct ports (a hash gave 44
    repeats among an array's 1,000 tasks); within 1,333 ids, restart counts up to 8 apart too."""
    assert derive_port(str(first), restart) != derive_port(str(first + offset), restart)
    for other in range(max(0, restart - 8), restart + 9):
        if offset < 1333 or other == restart:
            assert derive_port(str(first), restart) != derive_port(str(first + offset), other)
    assert len({derive_port(str(first), r) for r in range(9)}) == 9  # a job's first 9 attempts


def test_an_array_of_1000_tasks_gets_1000_ports() -> None:
    assert len({derive_port(str(5000 + task)) for task in range(1000)}) == 1000


@pytest.mark.parametrize("nodelist,hosts", [
    ("node1", ["node1"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("gpu[01-02,7],cpu1", ["gpu01", "gpu02", "gpu7", "cpu1"]),
    # Brackets multiply, as scontrol show hostnames does (this parser once gave gpu-1-[3-4], gpu-2-[3-4]).
    ("gpu-[1-2]-[3-4]", ["gpu-1-3", "gpu-1-4", "gpu-2-3", "gpu-2-4"]),
    ("(null)", []),
])
def test_expand_nodelist(nodelist: str, hosts: list[str]) -> None:
    assert expand_nodelist(nodelist) == hosts


def test_gpu_rules_are_the_torchrun_contract() -> None:
    """Every rank of a node sees the node's GPUs; LOCAL_RANK indexes them. Nothing is narrowed."""
    assert slurm_visible_devices({"CUDA_VISIBLE_DEVICES": "2,3"}) == "2,3"  # --gpus-per-node: the node's list
    assert slurm_visible_devices({"CUDA_VISIBLE_DEVICES": "3"}) == "3"  # a binding SLURM made: kept
    assert slurm_visible_devices({}) is None and slurm_visible_devices({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}) is None
    assert node_devices([4, 5, 6, 7], 1, 2) == "6,7" and node_devices([4, 5, 6, 7], 0, 1) == "4,5,6,7"
    assert node_devices(None, 0, 1) is None


def test_local_gpu_ranks_see_their_nodes_gpus_and_index_them_by_local_rank() -> None:
    launch = plan(spec_from_dict({"name": "g", "entrypoint": "jobs.train:main", "nodes": 2, "gpus_per_node": 2,
                                  "distributed": {"backend": "nccl"}, "local": {"devices": [0, 1, 2, 3]}}), "local")
    for row in launch.ranks:
        visible = row.env["CUDA_VISIBLE_DEVICES"].split(",")
        assert visible == [str(2 * row.node_rank), str(2 * row.node_rank + 1)], row.env
        assert int(row.env["LOCAL_RANK"]) < len(visible)  # torch.cuda.set_device(LOCAL_RANK) is valid
    assert len({(r.env["CUDA_VISIBLE_DEVICES"], r.env["LOCAL_RANK"]) for r in launch.ranks}) == 4  # no GPU shared


def test_rank_env_roundtrip() -> None:
    from orchestrator.core.netif import NcclConf, choose_interfaces

    env = RankEnv(rank=3, local_rank=1, world_size=4, local_world_size=2, node_rank=1, nnodes=2,
                  master_addr="10.0.0.1", master_port=23456, init_method="env://", interface="eth0",
                  visible_devices="1", source="scheduler",
                  interfaces=choose_interfaces("eth0", "nccl", {}, {}, NcclConf(), None))
    back = RankEnv.from_environ(env.to_environ())
    assert back.rank == 3 and back.node_rank == 1 and back.interface == "eth0" and back.source == "env"


@pytest.mark.parametrize("text,minutes", [("90", 90), ("1:30", 2), ("02:00:00", 120), ("1-0", 1440),
                                          ("1-02:30", 1590), ("0-00:00:30", 1)])
def test_slurm_time_formats(text: str, minutes: int) -> None:
    assert slurm_time_minutes(text) == minutes


def test_argv_rendering() -> None:
    assert render_argv({"lr": 0.1, "amp": True, "off": False, "sizes": [1, 2]}, ["--x"]) == \
        ["--lr", "0.1", "--amp", "--sizes", "1", "2", "--x"]


def test_array_chunks_fit_max_array_size() -> None:
    assert array_chunks(5, 1001) == [[0, 1, 2, 3, 4]]
    chunks = array_chunks(2500, 1001)
    assert [len(c) for c in chunks] == [1000, 1000, 500] and chunks[2][-1] == 2499


def test_override_precedence(tmp_path) -> None:
    a = tmp_path / "a.yaml"
    a.write_text("name: a\nentrypoint: jobs.train:main\nnodes: 2\ndistributed: {port: 29500, backend: gloo}\n")
    b = tmp_path / "b.json"
    b.write_text('{"distributed": {"port": 29501}}')
    spec = load_spec(a, b, overrides=["distributed.port=29502", "distributed.interface=[eth0,ib0]"], executor="slurm")
    assert spec.distributed.port == 29502 and spec.distributed.backend == "gloo"
    assert spec.distributed.interface == ["eth0", "ib0"] and spec.executor == "slurm" and spec.nodes == 2


def test_examples_validate(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    monkeypatch.chdir(tmp_path)  # planned from a project folder, never under /tmp (the examples' runs_dir is 'runs')
    examples = sorted((Path(__file__).resolve().parents[2] / "orchestrator" / "examples").glob("*.yaml"))
    assert len(examples) >= 5
    for path in examples:
        spec = load_spec(path)
        plan(spec)


def test_slurm_rank_env_from_slurm_variables(tmp_path) -> None:
    from orchestrator.backends.slurm.node.slurm_task import rank_env_from_slurm

    launch = plan(spec_from_dict({"name": "s", "entrypoint": "jobs.train:main", "nodes": 2, "gpus_per_node": 2,
                                  "runs_dir": SHARED_RUNS,
                                  "distributed": {"backend": "gloo", "interface": "lo", "init_method": "file",
                                                  "rendezvous_dir": str(tmp_path), "rendezvous_dir_is_shared": True}}), "slurm")
    env = {"SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "1",
           "SLURM_NTASKS": "4", "SLURM_JOB_NUM_NODES": "2", "SLURM_LOCALID": "1", "SLURM_PROCID": "3",
           "SLURM_NODEID": "1", "CUDA_VISIBLE_DEVICES": "0,1"}
    rank = rank_env_from_slurm(SlurmTask.from_environ(env), launch.payload)
    assert (rank.rank, rank.local_rank, rank.node_rank, rank.world_size) == (3, 1, 1, 4)
    assert rank.master_addr == "gpu07" and rank.master_port == derive_port("4242", 1)
    assert rank.init_method == f"file://{tmp_path}/rendezvous-4242-1"
    assert rank.visible_devices == "0,1" and rank.source == "scheduler"  # the node's GPUs; LOCAL_RANK=1 picks
    with pytest.raises(RuntimeError, match="interface ib9 does not exist"):
        rank_env_from_slurm(SlurmTask.from_environ(env), lean_record.replace(launch.payload, interface="ib9"))


def test_local_thread_default_counts_the_cpus_the_process_may_use() -> None:
    """Under taskset (or an salloc on a big node) the default counts the affinity mask, not the
    machine's cores: one rank on one allowed CPU gets OMP_NUM_THREADS=1."""
    import subprocess
    import sys

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs at least 2 CPUs to restrict")
    code = ("import os, sys; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from orchestrator.spec.loading import spec_from_dict; from orchestrator.plan import plan; "
            "p = plan(spec_from_dict({'name': 't', 'entrypoint': 'jobs.train:main'}), 'local'); "
            "print(p.ranks[0].env['OMP_NUM_THREADS'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "1", out


def test_the_job_asks_for_requeue_whenever_requeues_are_allowed() -> None:
    """Sites with JobRequeue=0 refuse `scontrol requeue` for a job that did not ask for --requeue."""
    def lines(**slurm: object) -> list[str]:
        spec = spec_from_dict({"name": "r", "entrypoint": "jobs.train:main", "executor": "slurm", "runs_dir": SHARED_RUNS,
                               "slurm": slurm})
        return (plan(spec, "slurm").sbatch_script or "").splitlines()

    assert "#SBATCH --requeue" in lines() and "#SBATCH --no-requeue" not in lines()
    assert "#SBATCH --requeue" in lines(requeue="always")
    assert "#SBATCH --no-requeue" in lines(max_requeues=0) and "#SBATCH --requeue" not in lines(max_requeues=0)
    assert "#SBATCH --requeue" not in lines(requeue="never")


# ---- CPUs per rank on SLURM (issue 32) -------------------------------------------------------
def _slurm(**fields: object):
    return plan(spec_from_dict({"name": "c", "entrypoint": "jobs.train:main", "executor": "slurm", "runs_dir": SHARED_RUNS,
                                **fields}))


def test_without_cpus_per_task_the_plan_shows_each_ranks_share_as_a_rule() -> None:
    launch = _slurm(nodes=2, gpus_per_node=4)
    rule = "<SLURM_CPUS_ON_NODE / 4>"
    assert "--cpus-per-task" not in (launch.sbatch_script or "") and "cpus_per_task" not in launch.submitit
    assert f"--cpus-per-task={rule}" in launch.payload.srun
    assert launch.payload.env["OMP_NUM_THREADS"] == rule and all(r.env["OMP_NUM_THREADS"] == rule for r in launch.ranks)
    assert launch.cpus is not None and launch.cpus.startswith(f"CPUs: {rule} per rank") and "DefCpuPerGPU" in launch.cpus


def test_cpus_per_task_set_behaves_as_before_dp_included() -> None:
    launch = _slurm(gpus_per_node=4, slurm={"cpus_per_task": 6})
    assert "#SBATCH --cpus-per-task=6" in (launch.sbatch_script or "").splitlines()
    assert "--cpus-per-task=6" in launch.payload.srun and launch.payload.env["OMP_NUM_THREADS"] == "6"
    assert "as slurm.cpus_per_task asks" in (launch.cpus or "")
    dp = _slurm(gpus_per_node=4, strategy="dp", slurm={"cpus_per_task": 6})  # one rank with all 4 GPUs
    assert "#SBATCH --cpus-per-task=24" in (dp.sbatch_script or "").splitlines()
    assert "--cpus-per-task=24" in dp.payload.srun and dp.payload.env["OMP_NUM_THREADS"] == "6"
    assert "x 4 GPU(s): strategy dp" in (dp.cpus or "")
    dp_share = _slurm(gpus_per_node=4, strategy="dp")  # unset: the one rank gets the whole node's share
    assert "--cpus-per-task=<SLURM_CPUS_ON_NODE / 1>" in dp_share.payload.srun


def test_cpus_per_gpu_asks_sbatch_and_the_agent_shares_the_node() -> None:
    launch = _slurm(gpus_per_node=4, slurm={"cpus_per_gpu": 8})
    lines = (launch.sbatch_script or "").splitlines()
    assert "#SBATCH --cpus-per-gpu=8" in lines and not any("--cpus-per-task" in line for line in lines)
    assert "--cpus-per-task=<SLURM_CPUS_ON_NODE / 4>" in launch.payload.srun
    assert "slurm.cpus_per_gpu asks for 8 per GPU" in (launch.cpus or "")


def test_a_thread_count_the_user_set_is_never_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    launch = _slurm(gpus_per_node=2, env={"OMP_NUM_THREADS": "3"})
    assert launch.payload.env["OMP_NUM_THREADS"] == "3" and "OMP_NUM_THREADS=3 as you set it" in (launch.cpus or "")
    monkeypatch.setenv("OMP_NUM_THREADS", "5")  # exported where the job is submitted: it reaches the ranks
    assert _slurm(gpus_per_node=2).payload.env["OMP_NUM_THREADS"] == "5"


def test_the_share_counts_what_slurm_granted() -> None:
    from orchestrator.node.rank_env import cpu_share, cpu_share_rule, granted_cpus, resolve_cpu_share

    assert cpu_share({"SLURM_CPUS_ON_NODE": "32"}, 4)[0] == 8
    assert cpu_share({"SLURM_CPUS_ON_NODE": "3"}, 4)[0] == 1  # at least 1
    assert cpu_share({"SLURM_CPUS_ON_NODE": "9"}, 2) == (4, "SLURM granted 9 CPUs on the node, shared by 2 rank(s)")
    # nodes that got different counts: one srun --cpus-per-task must fit on the smallest
    assert granted_cpus({"SLURM_CPUS_ON_NODE": "32", "SLURM_JOB_CPUS_PER_NODE": "32(x2),16"}) == 16
    assert granted_cpus({"SLURM_JOB_CPUS_PER_NODE": "24(x3)"}) == 24 and granted_cpus({}) is None
    assert cpu_share({}, 1)[0] == len(os.sched_getaffinity(0))  # SLURM says nothing: the agent's own CPUs
    assert resolve_cpu_share(f"--cpus-per-task={cpu_share_rule(4)}", 8) == "--cpus-per-task=8"


def test_a_slurm_rank_resolves_the_rule_from_what_srun_gave_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rank reads the payload's env itself: the rule becomes the CPUs srun gave the task (the
    agent's --cpus-per-task), else the value the agent exported, else the task's CPU mask."""
    from orchestrator.node.rank_env import rank_environment

    launch = _slurm(gpus_per_node=2)
    rank = RankEnv(rank=1, local_rank=1, world_size=2, local_world_size=2, node_rank=0, nnodes=1, master_addr="h",
                   master_port=20001, init_method="env://", interface="lo", visible_devices=None, source="scheduler")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "7")
    assert rank_environment(rank, launch.payload, 0)["OMP_NUM_THREADS"] == "7"
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    assert rank_environment(rank, launch.payload, 0)["OMP_NUM_THREADS"] == "6"
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert rank_environment(rank, launch.payload, 0)["OMP_NUM_THREADS"] == str(len(os.sched_getaffinity(0)))
    # plan's own rows keep the rule
    assert rank_environment(lean_record.replace(rank, source="plan"), launch.payload, 0)["OMP_NUM_THREADS"] == \
        "<SLURM_CPUS_ON_NODE / 2>"


def test_no_wckey_unless_the_spec_names_one() -> None:
    assert "wckey" not in (_slurm().sbatch_script or "")
    assert "#SBATCH --wckey=proj-7" in (_slurm(slurm={"wckey": "proj-7"}).sbatch_script or "").splitlines()
