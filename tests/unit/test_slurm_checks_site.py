"""`validate --cluster` and the site (issue 32): partition lists, and the CPUs each GPU rank gets.

The pure functions of ``executors.slurm_checks`` on scontrol's own text: the partition and node
lines are what ``scontrol show partition -o`` / ``show node -o`` of SLURM 22.05.8 printed on the
deploy cluster's site profile, with the fields a case needs changed (a real site's MaxTime,
JobDefaults, OverSubscribe, node sizes); the config is an excerpt of its ``scontrol show config``.
"""

from __future__ import annotations

from typing import Any, Mapping

import pytest

from orchestrator.cli import main
from orchestrator.backends.slurm import slurm_checks
from orchestrator.backends.slurm.slurm_checks import (
    ClusterConfig,
    cluster_findings,
    job_defaults,
    parse_config,
    parse_nodes,
    parse_partitions,
    rank_cpus,
)
from orchestrator.spec.loading import spec_from_dict
from orchestrator.node.rank_env import cpu_share
from orchestrator.spec.models import JobSpec


def partition_line(name: str, *, default: bool = False, max_time: str = "1-00:00:00", nodes: str = "gpu[01-04]",
                   max_nodes: str = "UNLIMITED", min_nodes: int = 0, job_defaults: str = "(null)",
                   oversubscribe: str = "NO") -> str:
    return (f"PartitionName={name} AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL "
            f"Default={'YES' if default else 'NO'} QoS=N/A DefaultTime=01:00:00 DisableRootJobs=NO ExclusiveUser=NO "
            f"GraceTime=0 Hidden=NO MaxNodes={max_nodes} MaxTime={max_time} MinNodes={min_nodes} LLN=NO "
            f"MaxCPUsPerNode=UNLIMITED Nodes={nodes} PriorityJobFactor=1 PriorityTier=1 RootOnly=NO ReqResv=NO "
            f"OverSubscribe={oversubscribe} OverTimeLimit=NONE PreemptMode=OFF State=UP TotalCPUs=256 TotalNodes=4 "
            f"SelectTypeParameters=NONE JobDefaults={job_defaults} DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED "
            f"TRES=cpu=256,mem=2000000M,node=4,billing=256,gres/gpu=16\n")


def node_line(name: str, partitions: str, gres: str = "gpu:a100:4(S:0-1)", cpus: int = 64) -> str:
    return (f"NodeName={name} Arch=x86_64 CoresPerSocket={cpus // 2}  CPUAlloc=0 CPUEfctv={cpus} CPUTot={cpus} "
            f"CPULoad=0.02 AvailableFeatures=(null) ActiveFeatures=(null) Gres={gres} NodeAddr={name} "
            f"NodeHostName={name} Version=22.05.8 OS=Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1  "
            f"RealMemory=512000 AllocMem=0 FreeMem=501234 Sockets=2 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 "
            f"Weight=1 Owner=N/A MCS_label=N/A Partitions={partitions}  BootTime=2026-11-27T12:25:44 "
            f"SlurmdStartTime=2026-11-27T15:56:42 LastBusyTime=2026-11-27T15:56:45 "
            f"CfgTRES=cpu={cpus},mem=500G,billing={cpus},gres/gpu=4 AllocTRES= CapWatts=n/a CurrentWatts=0 "
            f"AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s\n")


def config_text(job_defaults: str = "(null)", enforce: str = "NO", max_array: int = 1001) -> str:
    return f"""Configuration data as of 2026-11-27T15:56:56
AccountingStorageBackupHost = (null)
AccountingStorageEnforce = associations
DefMemPerCPU            = 2000
EnforcePartLimits       = {enforce}
JobCompType             = jobcomp/none
JobDefaults             = {job_defaults}
MaxArraySize            = {max_array}
SelectType              = select/cons_tres
SelectTypeParameters    = CR_CORE_MEMORY
TrackWCKey              = Yes

Slurmctld(primary) at ctl is UP
"""


# gpu: 4 nodes of 4 a100 and 64 CPUs; gpu-preempt: the same plus two v100 nodes of 32 CPUs.
NODES = "".join(node_line(f"gpu0{i}", "gpu,gpu-preempt") for i in range(1, 5)) + "".join(
    node_line(f"old0{i}", "gpu-preempt", gres="gpu:v100:2(S:0)", cpus=32) for i in (1, 2))


def findings(spec_fields: Mapping[str, Any], partitions: str, config: str = config_text(), nodes: str = NODES,
             environ: Mapping[str, str] | None = None) -> tuple[list[str], list[str]]:
    return cluster_findings(_spec(**spec_fields), parse_partitions(partitions), parse_nodes(nodes),
                            parse_config(config), environ or {})


def _spec(**fields: Any) -> JobSpec:
    slurm = fields.pop("slurm", {})
    return spec_from_dict({"name": "site", "entrypoint": "jobs.train:main", "executor": "slurm", "nodes": 2,
                           "gpus_per_node": 4, "distributed": {"backend": "gloo"},
                           "slurm": {"time": "12:00:00", **slurm}, **fields})


TWO = partition_line("gpu", default=True, max_time="2-00:00:00") + partition_line(
    "gpu-preempt", max_time="04:00:00", nodes="gpu[01-04],old[01-02]")


# ---- parsing -----------------------------------------------------------------------------------
def test_job_defaults_as_scontrol_prints_them() -> None:
    assert job_defaults("DefCpuPerGPU=8,DefMemPerGPU=65536") == {"DefCpuPerGPU": 8, "DefMemPerGPU": 65536}
    assert job_defaults("(null)") == {} and job_defaults("") == {} and job_defaults(None) == {}


def test_the_config_gives_the_sites_cpus_per_gpu_and_its_partition_limit_policy() -> None:
    assert parse_config(config_text("DefCpuPerGPU=2", "ALL", 5001)) == ClusterConfig(2, "ALL", 5001)
    assert parse_config(config_text()) == ClusterConfig(None, "NO", 1001)
    assert parse_config(config_text("DefMemPerGPU=4096")).def_cpu_per_gpu is None
    assert parse_config("") == ClusterConfig()  # nothing known: SLURM's defaults


def test_partitions_as_scontrol_prints_them() -> None:
    parts = parse_partitions(partition_line("gpu", default=True, max_nodes="8", min_nodes=1,
                                            job_defaults="DefCpuPerGPU=16,DefMemPerGPU=65536")
                             + partition_line("whole", oversubscribe="EXCLUSIVE")
                             + partition_line("shared", oversubscribe="FORCE:4"))
    assert list(parts) == ["gpu", "whole", "shared"]
    gpu = parts["gpu"]
    assert (gpu.default, gpu.max_time, gpu.max_nodes, gpu.min_nodes, gpu.def_cpu_per_gpu, gpu.whole_nodes) == \
        (True, "1-00:00:00", 8, 1, 16, False)
    assert parts["whole"].whole_nodes and not parts["shared"].whole_nodes
    assert parts["whole"].max_nodes is None and parts["whole"].def_cpu_per_gpu is None


def test_nodes_keep_their_cpus_gpus_and_partitions() -> None:
    old = parse_nodes(NODES)[-1]
    assert (old.name, old.partitions, old.gpus, old.cpus) == ("old02", ["gpu-preempt"], {"v100": 2}, 32)


# ---- partition lists ---------------------------------------------------------------------------
def test_a_list_of_partitions_that_all_fit_passes() -> None:
    spec = {"slurm": {"partition": "gpu,gpu-preempt", "cpus_per_gpu": 8, "time": "01:00:00"}}
    assert findings(spec, TWO) == ([], [])


def test_a_partition_of_the_list_that_does_not_exist_refuses_the_list() -> None:
    problems, _ = findings({"slurm": {"partition": "gpu,nosuch"}}, TWO)
    assert problems == ["slurm.partition: 'nosuch' does not exist (sbatch refuses the whole list 'gpu,nosuch' for it: "
                        "'invalid partition specified'); partitions here: gpu, gpu-preempt"]
    [problem] = findings({"slurm": {"partition": "nosuch"}}, TWO)[0]  # one name: as before
    assert problem == "slurm.partition: 'nosuch' does not exist; partitions here: gpu, gpu-preempt"


def test_a_partition_that_cannot_run_the_job_is_a_warning_when_another_can() -> None:
    spec = {"slurm": {"partition": "gpu,gpu-preempt", "time": "10:00:00", "cpus_per_gpu": 8}}
    problems, [warning] = findings(spec, TWO)
    assert problems == []
    assert warning == ("slurm.partition: partition gpu-preempt cannot run this job, so SLURM will start it in gpu "
                       "only: slurm.time: 10:00:00 exceeds partition gpu-preempt's MaxTime 04:00:00")


def test_a_list_that_no_partition_can_run_is_refused_with_each_ones_reasons() -> None:
    problems, warnings = findings({"slurm": {"partition": "gpu,gpu-preempt", "time": "3-00:00:00"}}, TWO)
    assert problems == ["slurm.time: 3-00:00:00 exceeds partition gpu's MaxTime 2-00:00:00",
                        "slurm.time: 3-00:00:00 exceeds partition gpu-preempt's MaxTime 04:00:00"]
    assert warnings == []


def test_enforce_part_limits_all_refuses_a_list_when_any_limit_fails() -> None:
    spec = {"slurm": {"partition": "gpu,gpu-preempt", "time": "10:00:00"}}
    [problem] = findings(spec, TWO, config_text(enforce="ALL"))[0]
    assert problem.startswith("slurm.time: 10:00:00 exceeds partition gpu-preempt's MaxTime 04:00:00 (this cluster "
                              "refuses a partition list if any of them refuses the job, EnforcePartLimits=ALL: remove "
                              "gpu-preempt from slurm.partition)"), problem
    assert findings(spec, TWO, config_text(enforce="ANY"))[0] == []


def test_a_missing_gpu_type_in_one_partition_is_not_a_limit() -> None:
    # gpu has no v100 nodes: the node configuration, not a partition limit, so even ALL takes the list
    spec = {"gpus_per_node": 2, "slurm": {"partition": "gpu,gpu-preempt", "gpu_type": "v100", "time": "01:00:00"}}
    problems, warnings = findings(spec, TWO, config_text(enforce="ALL", job_defaults="DefCpuPerGPU=4"))
    assert problems == []
    assert warnings == ["slurm.partition: partition gpu cannot run this job, so SLURM will start it in gpu-preempt "
                        "only: slurm.gpu_type: partition gpu has no 'v100' GPUs; its nodes have a100 (up to 4 per "
                        "node, on 4 node(s)); set slurm.gpu_type to one of a100"]


def test_node_counts_against_each_partitions_limits() -> None:
    parts = partition_line("small", max_nodes="2") + partition_line("big", min_nodes=4)
    nodes = "".join(node_line(f"gpu0{i}", "small,big") for i in range(1, 5))
    problems, _ = findings({"nodes": 3, "slurm": {"partition": "small"}}, parts, nodes=nodes)
    assert problems == ["nodes: 3 requested but partition small allows at most 2 per job (MaxNodes); ask for fewer "
                        "nodes or choose another partition"]
    problems, _ = findings({"nodes": 3, "slurm": {"partition": "big"}}, parts, nodes=nodes)
    assert problems == ["nodes: 3 requested but partition big takes jobs of at least 4 node(s) (MinNodes); ask for "
                        "more or choose another partition"]
    assert len(findings({"nodes": 3, "slurm": {"partition": "small,big"}}, parts, nodes=nodes)[0]) == 2  # neither
    problems, [warning] = findings({"nodes": 2, "slurm": {"partition": "small,big", "cpus_per_gpu": 8}}, parts,
                                   nodes=nodes)
    assert problems == [] and warning.startswith("slurm.partition: partition big cannot run this job"), warning


def test_a_nodelist_outside_one_partition_of_the_list() -> None:
    spec = {"nodes": 1, "gpus_per_node": 2, "slurm": {"partition": "gpu,gpu-preempt", "nodelist": "old01",
                                                      "cpus_per_gpu": 8}}
    problems, [warning] = findings(spec, TWO.replace("04:00:00", "1-00:00:00"))
    assert problems == []
    assert "partition gpu cannot run this job" in warning and "slurm.nodelist: old01 not in partition gpu" in warning


def test_sbatch_partition_names_the_partition_when_the_spec_does_not() -> None:
    problems, _ = findings({"slurm": {"time": "10:00:00"}}, TWO, environ={"SBATCH_PARTITION": "gpu-preempt"})
    assert problems == ["slurm.time: 10:00:00 exceeds partition gpu-preempt's MaxTime 04:00:00"]
    problems, _ = findings({}, TWO, environ={"SBATCH_PARTITION": "scavenger"})
    assert problems == ["slurm.partition: 'scavenger' (from SBATCH_PARTITION in your environment) does not exist; "
                        "partitions here: gpu, gpu-preempt"]
    # the spec's own partition wins, as the script's --partition wins over SBATCH_PARTITION
    assert findings({"slurm": {"partition": "gpu"}}, TWO, environ={"SBATCH_PARTITION": "scavenger"})[0] == []


def test_no_partition_asked_for_and_no_default() -> None:
    problems, _ = findings({}, partition_line("a") + partition_line("b"))
    assert problems == ["slurm.partition: this cluster has no default partition; set slurm.partition to one of a, b"]


# ---- CPUs per GPU rank -------------------------------------------------------------------------
ONE = partition_line("gpu", default=True)


def cpu_warning(spec: Mapping[str, Any], partitions: str = ONE, config: str = config_text(),
                environ: Mapping[str, str] | None = None) -> list[str]:
    problems, warnings = findings(spec, partitions, config, environ=environ)
    assert problems == []
    return warnings


def test_gpu_ranks_with_no_cpu_count_and_no_site_default_are_warned() -> None:
    [warning] = cpu_warning({})
    assert warning.startswith("CPUs: each GPU rank would get 1 CPU in partition gpu: the job asks for no CPU count "
                              "(no slurm.cpus_per_task or slurm.cpus_per_gpu) and neither the partition nor the "
                              "cluster sets DefCpuPerGPU"), warning
    assert warning.endswith("set slurm.cpus_per_gpu (up to 16: the smallest node with 4 GPU(s) has 64 CPUs) or "
                            "slurm.cpus_per_task (CPUs for each rank)"), warning


def test_the_sites_cpus_per_gpu_silence_the_warning() -> None:
    assert cpu_warning({}, config=config_text("DefCpuPerGPU=2")) == []
    assert cpu_warning({}, partitions=partition_line("gpu", default=True, job_defaults="DefCpuPerGPU=8")) == []


def test_the_partitions_default_wins_over_the_clusters() -> None:
    [warning] = cpu_warning({}, partition_line("gpu", default=True, job_defaults="DefCpuPerGPU=1"),
                            config_text("DefCpuPerGPU=8"))
    assert "partition gpu's DefCpuPerGPU=1 gives a node 4 CPUs for its 4 GPU(s), shared by 4 rank(s)" in warning


def test_only_the_partitions_of_a_list_that_give_one_cpu_are_named() -> None:
    parts = partition_line("gpu", default=True, job_defaults="DefCpuPerGPU=8") + partition_line("scav") \
        + partition_line("spot")
    nodes = "".join(node_line(f"gpu0{i}", "gpu,scav,spot") for i in range(1, 3))
    problems, [warning] = findings({"slurm": {"partition": "gpu,scav,spot"}}, parts, nodes=nodes)
    assert problems == []
    assert warning.startswith("CPUs: each GPU rank would get 1 CPU in partitions scav, spot:"), warning


def test_an_explicit_request_of_one_cpu_is_warned_too() -> None:
    [warning] = cpu_warning({"slurm": {"cpus_per_task": 1}}, config=config_text("DefCpuPerGPU=8"))
    assert "slurm.cpus_per_task: 1 gives each rank 1" in warning
    assert warning.endswith("raise slurm.cpus_per_task (up to 16: the smallest node with 4 GPU(s) has 64 CPUs)")
    [warning] = cpu_warning({"slurm": {"cpus_per_gpu": 1}})
    assert "slurm.cpus_per_gpu=1 gives a node 4 CPUs" in warning and "raise slurm.cpus_per_gpu (up to 16" in warning
    assert cpu_warning({"slurm": {"cpus_per_task": 4}}) == []
    assert cpu_warning({"slurm": {"cpus_per_gpu": 2}}) == []


def test_whole_nodes_give_the_ranks_the_nodes_cpus() -> None:
    assert cpu_warning({"slurm": {"exclusive": True}}) == []
    assert cpu_warning({}, partition_line("gpu", default=True, oversubscribe="EXCLUSIVE")) == []
    assert cpu_warning({}, environ={"SBATCH_EXCLUSIVE": ""}) == []  # sbatch's --exclusive, from the environment
    assert len(cpu_warning({}, environ={"SBATCH_EXCLUSIVE": "user"})) == 1  # only keeps other users away
    tiny = node_line("gpu01", "gpu", cpus=4) + node_line("gpu02", "gpu", cpus=4)
    problems, [warning] = findings({"slurm": {"exclusive": True}}, ONE, nodes=tiny)
    assert "slurm.exclusive gives the job whole nodes (the smallest with 4 GPU(s) has 4 CPUs)" in warning


def test_sbatch_cpus_per_gpu_from_the_environment_counts_unless_the_spec_asks() -> None:
    assert cpu_warning({}, environ={"SBATCH_CPUS_PER_GPU": "6"}) == []
    assert len(cpu_warning({"slurm": {"cpus_per_task": 1}}, environ={"SBATCH_CPUS_PER_GPU": "6"})) == 1


def test_strategy_dp_one_rank_drives_every_gpu_of_its_node() -> None:
    dp = {"nodes": 1, "strategy": "dp"}
    [warning] = cpu_warning(dp)  # one task, one CPU, for 4 GPUs
    assert "each GPU rank would get 1 CPU" in warning
    assert cpu_warning(dp, config=config_text("DefCpuPerGPU=2")) == []  # 8 CPUs for the node's one rank
    assert cpu_warning({**dp, "slurm": {"cpus_per_task": 1}}) == []  # dp: 1 per GPU, 4 for the rank


def test_cpu_ranks_are_not_this_warnings_business() -> None:
    assert cpu_warning({"gpus_per_node": 0, "cpu_ranks_per_node": 4}) == []


@pytest.mark.parametrize("per_gpu, gpus", [(1, 4), (2, 4), (3, 2), (8, 1), (5, 3)])
def test_the_grant_agrees_with_the_agents_share_of_what_slurm_grants(per_gpu: int, gpus: int) -> None:
    """rank_cpus predicts what the job's agent will give each rank (rank_env.cpu_share) once SLURM
    grants the node per_gpu x gpus CPUs."""
    spec = _spec(gpus_per_node=gpus, slurm={"cpus_per_gpu": per_gpu})
    [part] = parse_partitions(ONE).values()
    grant = rank_cpus(spec, part, ClusterConfig(), parse_nodes(NODES), {})
    assert grant.per_rank == cpu_share({"SLURM_CPUS_ON_NODE": str(per_gpu * gpus)}, spec.ranks_per_node)[0]


# ---- validate --cluster prints the warnings and still says ok ------------------------------------
def test_validate_prints_warnings_on_stderr_and_exits_0(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    answers = {("show", "partition", "-o"): TWO, ("show", "node", "-o"): NODES, ("show", "config"): config_text()}
    monkeypatch.setattr(slurm_checks, "scontrol_text", lambda *args: answers[args])
    monkeypatch.delenv("SBATCH_PARTITION", raising=False)
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: site\nentrypoint: jobs.train:main\nexecutor: slurm\nnodes: 2\ngpus_per_node: 4\n"
                    "runs_dir: /shared/runs\n"  # not the default 'runs', refused from a checkout in /tmp
                    "distributed: {backend: gloo}\nslurm: {partition: 'gpu,gpu-preempt', time: '10:00:00'}\n")
    assert main(["validate", str(spec), "--cluster"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("ok: site"), out
    lines = err.splitlines()
    assert len(lines) == 2 and all(line.startswith("warning: ") for line in lines), err
    assert "partition gpu-preempt cannot run this job" in lines[0] and "1 CPU in partition gpu:" in lines[1], err
    monkeypatch.setattr(slurm_checks, "scontrol_text", lambda *args: {**answers, ("show", "config"): config_text(
        enforce="ALL")}[args])
    assert main(["validate", str(spec), "--cluster"]) == 2
    assert "EnforcePartLimits=ALL" in capsys.readouterr().err
