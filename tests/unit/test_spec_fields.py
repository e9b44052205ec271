"""The spec fields for real clusters: env, workdir, GPU types, node selection, the watchdog."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.errors import SpecError
from orchestrator.spec.loading import spec_from_dict
from orchestrator.plan import plan
from orchestrator.spec.validators import OWNED_ENV, hostlist_hosts

# runs_dir shared-looking: a SLURM plan refuses the default 'runs' from a checkout in /tmp.
BASE = {"name": "f", "entrypoint": "jobs.train:main", "executor": "slurm", "nodes": 2, "runs_dir": "/shared/runs"}


def _refused(match: str, **fields: object) -> None:
    with pytest.raises(SpecError, match=match):
        spec_from_dict({**BASE, **fields})


@pytest.mark.parametrize("name", sorted(OWNED_ENV) + ["ORCH_RUN_DIR", "SLURM_PROCID", "SRUN_CPUS_PER_TASK"])
def test_env_may_not_set_what_the_orchestrator_or_slurm_owns(name: str) -> None:
    _refused(name, env={name: "1"})


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True), st.text(max_size=20), max_size=4))
def test_valid_env_reaches_the_payload_as_written(env: dict[str, str]) -> None:
    try:
        spec = spec_from_dict({**BASE, "env": env})
    except SpecError as exc:  # an owned name, or a control character in a value
        assert "env" in str(exc)
        return
    launch = plan(spec)
    for key, value in env.items():
        assert launch.payload.env[key] == value
        assert all(row.env[key] == value for row in launch.ranks)


def test_gpu_type_needs_gpus_and_renders_typed() -> None:
    _refused("gpu_type", slurm={"gpu_type": "a100"})
    launch = plan(spec_from_dict({**BASE, "gpus_per_node": 4, "slurm": {"gpu_type": "a100"}}))
    assert "#SBATCH --gpus-per-node=a100:4" in (launch.sbatch_script or "")


def test_node_lists() -> None:
    _refused("names 3 nodes", slurm={"nodelist": "n[1-3]"})
    _refused("both name n2", slurm={"nodelist": "n[1-2]", "exclude": "n2"})
    _refused("not a SLURM host list", slurm={"exclude": "gpu[1-2]-ib"})
    _refused("runs backwards", slurm={"exclude": "gpu[4-1]"})
    assert hostlist_hosts("gpu[01-03,7],cpu1") == {"gpu01", "gpu02", "gpu03", "gpu7", "cpu1"}
    assert hostlist_hosts("n[1-999999]") is None  # counted, not expanded
    script = plan(spec_from_dict({**BASE, "slurm": {"nodelist": "n[1-2]", "exclude": "n7"}})).sbatch_script or ""
    assert "#SBATCH --nodelist='n[1-2]'" in script and "#SBATCH --exclude=n7" in script


def test_a_node_list_may_name_the_spares_too() -> None:
    """sbatch asks for nodes + recovery.spares (the spares are held in the allocation), so a node list
    of exactly that many hosts is the allocation's own size; one host more is still refused."""
    spares = {"max_restarts": 1, "spares": 1}
    script = plan(spec_from_dict({**BASE, "slurm": {"nodelist": "n[1-3]"}, "recovery": spares})).sbatch_script or ""
    assert "#SBATCH --nodes=3" in script and "#SBATCH --nodelist='n[1-3]'" in script
    _refused("slurm.nodelist: names 4 nodes but the job asks for nodes: 2 and recovery.spares: 1, 3 in all",
             slurm={"nodelist": "n[1-4]"}, recovery=spares)


def test_workdir_and_watchdog_reach_the_payload(tmp_path) -> None:
    launch = plan(spec_from_dict({**BASE, "workdir": str(tmp_path), "watchdog": {"stall_s": 20}}))
    assert launch.payload.workdir == str(tmp_path)
    assert (launch.payload.watchdog.stall_s, launch.payload.watchdog.stacks_on_failure) == (20, True)
    _refused("stall_s", watchdog={"stall_s": 0})


# ---- what sites require (issue 32) ----------------------------------------------------------
def _script(**slurm: object) -> list[str]:
    spec = spec_from_dict({**BASE, "gpus_per_node": 2, "slurm": slurm})
    return (plan(spec).sbatch_script or "").splitlines()


def test_partition_and_reservation_take_lists_of_safe_names() -> None:
    assert "#SBATCH --partition=gpu,gpu-preempt" in _script(partition="gpu,gpu-preempt")
    assert "#SBATCH --reservation=maint,maint2" in _script(reservation="maint,maint2")
    _refused("slurm.partition: 'gpu,' has an empty name", slurm={"partition": "gpu,"})
    _refused("slurm.partition: 'gpu,gpu' names 'gpu' twice", slurm={"partition": "gpu,gpu"})
    _refused("slurm.partition: .* is not a safe slurm.partition name", slurm={"partition": "gpu,$(id)"})
    _refused("slurm.reservation: .* is not a safe", slurm={"reservation": "a b"})


def test_wckey_only_when_named() -> None:
    assert not any("wckey" in line for line in _script())
    assert "#SBATCH --wckey=ml-team" in _script(wckey="ml-team")
    _refused("slurm.wckey: ", slurm={"wckey": "a;b"})
    _refused("sbatch option 'wckey' has a spec field of its own; set slurm.wckey", slurm={"extra_sbatch": {"wckey": "x"}})


def test_memory_options_are_exclusive_and_per_gpu_needs_gpus() -> None:
    assert "#SBATCH --mem-per-cpu=4G" in _script(mem_per_cpu="4G")
    assert "#SBATCH --mem-per-gpu=80G" in _script(mem_per_gpu="80G")
    _refused("slurm.mem_per_cpu: sbatch takes one of slurm.mem", slurm={"mem": "64G", "mem_per_cpu": "4G"})
    _refused("slurm.mem_per_gpu: sbatch takes one of", slurm={"mem_per_cpu": "4G", "mem_per_gpu": "4G"})
    _refused("slurm.mem_per_gpu: counts memory per GPU, but the job asks for none", slurm={"mem_per_gpu": "4G"})
    _refused("slurm.mem_per_cpu: 'lots' is not a SLURM memory size", slurm={"mem_per_cpu": "lots"})
    for option in ("mem-per-cpu", "mem-per-gpu"):
        _refused(f"'{option}' has a spec field of its own; set slurm.{option.replace('-', '_')}",
                 slurm={"extra_sbatch": {option: "4G"}})


def test_cpus_per_gpu_needs_gpus_and_excludes_cpus_per_task() -> None:
    assert "#SBATCH --cpus-per-gpu=8" in _script(cpus_per_gpu=8)
    _refused("slurm.cpus_per_gpu: sbatch refuses it together with slurm.cpus_per_task",
             gpus_per_node=2, slurm={"cpus_per_gpu": 8, "cpus_per_task": 2})
    _refused("slurm.cpus_per_gpu: counts CPUs per GPU, but the job asks for none; set gpus_per_node",
             slurm={"cpus_per_gpu": 8})
    _refused("slurm.cpus_per_gpu: ", gpus_per_node=2, slurm={"cpus_per_gpu": 0})
    _refused("'cpus-per-gpu' has a spec field of its own; set slurm.cpus_per_gpu", slurm={"extra_sbatch": {"cpus-per-gpu": 8}})
    assert spec_from_dict(BASE).slurm.cpus_per_task is None  # the site's defaults, unless set


@pytest.mark.parametrize("key", ["clusters", "M"])
def test_other_clusters_are_refused_with_the_reason(key: str) -> None:
    _refused("--clusters\\)? is refused: it submits the job to another cluster, and every later scontrol",
             slurm={"extra_sbatch": {key: "other"}})


def test_extra_sbatch_reservation_points_to_the_field() -> None:
    _refused("'reservation' has a spec field of its own; set slurm.reservation",
             slurm={"extra_sbatch": {"reservation": "maint"}})
