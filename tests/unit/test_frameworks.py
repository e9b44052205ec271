"""``framework:``: each rank gets what the framework's own launcher would export (for the run's own
shape, CPU or GPU), the framework's world settings in the spec are checked against that shape, and
``plan`` says what it set and what it stands for."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.node import frameworks
from orchestrator.core.errors import SpecError
from orchestrator.spec.loading import spec_from_dict
from orchestrator.plan import LaunchPlan, plan

#: Every variable any framework sets: a rank gets exactly its framework's, and none without one.
ALL_VARS = {"LT_CLI_USED", "LT_DEVICES", "LT_NUM_NODES", "LT_ACCELERATOR", "PL_TRAINER_DEVICES",
            "PL_TRAINER_NUM_NODES", "PL_TRAINER_ACCELERATOR", "ACCELERATE_USE_CPU"}


def _spec(**fields: Any) -> Any:
    return spec_from_dict({"name": "fw", "entrypoint": "jobs.train:main", "runs_dir": "/srv/runs", **fields})


def _plan(executor: str = "local", **fields: Any) -> LaunchPlan:
    return plan(_spec(**fields), executor)  # type: ignore[arg-type]


def _framework_vars(launch: LaunchPlan) -> list[dict[str, str]]:
    return [{k: v for k, v in row.env.items() if k in ALL_VARS} for row in launch.ranks]


CPU_2x2 = {"fabric": {"LT_CLI_USED": "1", "LT_DEVICES": "2", "LT_NUM_NODES": "2", "LT_ACCELERATOR": "cpu"},
           "lightning": {"PL_TRAINER_DEVICES": "2", "PL_TRAINER_NUM_NODES": "2", "PL_TRAINER_ACCELERATOR": "cpu"},
           "accelerate": {"ACCELERATE_USE_CPU": "true"},
           "transformers": {"ACCELERATE_USE_CPU": "true"}}
GPU_2x4 = {"fabric": {"LT_CLI_USED": "1", "LT_DEVICES": "4", "LT_NUM_NODES": "2"},
           "lightning": {"PL_TRAINER_DEVICES": "4", "PL_TRAINER_NUM_NODES": "2"},
           "accelerate": {}, "transformers": {}}


@pytest.mark.parametrize("name", frameworks.FRAMEWORKS)
def test_every_rank_gets_its_launchers_variables_for_the_runs_own_shape(name: str) -> None:
    # A local CPU run, 2 nodes x 2 ranks: the CPU variables on every rank.
    assert _framework_vars(_plan(nodes=2, cpu_ranks_per_node=2, framework=name)) == [CPU_2x2[name]] * 4
    # The same GPU spec on SLURM (2 x 4, GPUs from GRES) and as a local CPU dry run (2 x 2, no
    # local.devices): each gets its own shape, CPU only where no GPU is visible.
    gpu = dict(nodes=2, gpus_per_node=4, framework=name)
    assert _framework_vars(_plan("slurm", **gpu)) == [GPU_2x4[name]] * 8
    assert _framework_vars(_plan("local", **gpu)) == [CPU_2x2[name]] * 4
    # Local GPUs (local.devices): 2 emulated nodes x 1 GPU each, no CPU variables.
    local_gpu = _framework_vars(_plan("local", **gpu, local={"devices": [0, 1], "ranks_per_node": 1}))
    assert local_gpu == [{k: ("1" if k.endswith("DEVICES") else v) for k, v in GPU_2x4[name].items()}] * 2
    # Without framework: none of them; the spec's env still wins over the framework's.
    assert _framework_vars(_plan(nodes=2, cpu_ranks_per_node=2)) == [{}] * 4
    first = next(iter(CPU_2x2[name]))
    mine = _framework_vars(_plan(nodes=2, cpu_ranks_per_node=2, framework=name, env={first: "x"}))
    assert all(row[first] == "x" for row in mine)


def test_environment_reads_the_shape_from_the_contract_with_the_standard_library_only() -> None:
    payload = SimpleNamespace(framework="fabric")
    contract = {"LOCAL_WORLD_SIZE": "3", "NNODES": "5", "CUDA_VISIBLE_DEVICES": "0,1,2"}
    assert frameworks.environment(payload, contract) == {"LT_CLI_USED": "1", "LT_DEVICES": "3", "LT_NUM_NODES": "5"}
    assert frameworks.environment(payload, {**contract, "CUDA_VISIBLE_DEVICES": ""})["LT_ACCELERATOR"] == "cpu"
    assert frameworks.environment(SimpleNamespace(framework=None), contract) == {}


BAD = [
    # (framework, spec fields, the field the message names, a word of the fix)
    ("lightning", {"args": {"trainer.devices": 4}}, "args.trainer.devices: 4", "make it 2"),
    ("lightning", {"args": {"devices": "auto"}}, "args.devices: 'auto' (1 device(s) on CPU)", "remove it"),
    ("lightning", {"args": {"trainer.num_nodes": 1}}, "args.trainer.num_nodes: 1", "2 nodes"),
    ("lightning", {"sweep": {"num_nodes": [2, 3]}}, "sweep.num_nodes: 3", "2 nodes"),
    ("lightning", {"env": {"PL_TRAINER_DEVICES": "3"}}, "env.PL_TRAINER_DEVICES: '3'", "remove it from env"),
    ("fabric", {"args": {"devices": [0, 1, 2]}}, "args.devices: [0, 1, 2] (3 device(s) on CPU)", "LT_DEVICES"),
    ("fabric", {"env": {"LT_NUM_NODES": "1"}}, "env.LT_NUM_NODES: '1'", "remove it from env"),
    ("accelerate", {"args": {"num_processes": 2}}, "args.num_processes: 2", "not 4 processes"),
    ("accelerate", {"args": {"num_machines": 1}}, "args.num_machines: 1", "not 2 machine(s)"),
    ("accelerate", {"args": {"machine_rank": 0}}, "args.machine_rank", "NODE_RANK"),
    ("transformers", {"args": {"ddp_backend": "nccl"}}, "args.ddp_backend: 'nccl'", "distributed.backend"),
    ("transformers", {"strategy": "dp", "cpu_ranks_per_node": 1}, "strategy: dp", "strategy: ddp"),
]


@pytest.mark.parametrize("name,fields,field,fix", BAD, ids=[f"{b[0]}-{b[2].split(':')[0]}" for b in BAD])
def test_world_settings_that_disagree_with_the_shape_are_refused(name: str, fields: dict[str, Any], field: str,
                                                                 fix: str) -> None:
    with pytest.raises(SpecError) as err:
        _spec(**{"nodes": 2, "cpu_ranks_per_node": 2, "framework": name, **fields})
    assert field in str(err.value) and fix in str(err.value), str(err.value)


def test_world_settings_that_match_the_shape_of_each_executor_pass() -> None:
    ok = {"args": {"trainer.devices": 2, "trainer.num_nodes": 2, "num_processes": 4, "num_machines": 2,
                   "ddp_backend": "gloo"}}
    for name in frameworks.FRAMEWORKS:
        _spec(nodes=2, cpu_ranks_per_node=2, framework=name, **ok)
    # On SLURM the shape is the spec's (4 GPUs, -1 = every GPU of the node); locally, its downscale.
    _spec(executor="slurm", nodes=2, gpus_per_node=4, framework="lightning", args={"devices": -1, "num_nodes": "2"})
    with pytest.raises(SpecError, match=r"a local run of this spec is 2 node\(s\) x 2 rank\(s\) \(on SLURM 2 x 4\)"):
        _spec(nodes=2, gpus_per_node=4, framework="lightning", args={"devices": 4})
    _spec(nodes=2, gpus_per_node=4, framework="lightning", args={"devices": 4}, local={"ranks_per_node": 4})
    # The same keys mean nothing without framework (or for another framework).
    _spec(nodes=2, cpu_ranks_per_node=2, args={"devices": 8, "num_processes": 1})
    _spec(nodes=2, cpu_ranks_per_node=2, framework="accelerate", args={"devices": 8})


def test_world_settings_in_extra_args_are_read_as_the_scripts_parser_reads_them() -> None:
    """extra_args reach the script's parser like args: '--key=value' or '--key' then its value,
    options up to a '--'. A contradicting one is refused naming its item; a matching one passes."""
    shape = {"nodes": 2, "cpu_ranks_per_node": 2}
    with pytest.raises(SpecError, match=r"extra_args\[2\] --trainer\.devices: '4', but a local run"):
        _spec(**shape, framework="lightning", extra_args=["fit", "-v", "--trainer.devices", "4"])
    with pytest.raises(SpecError, match=r"extra_args\[0\] --machine-rank: each node has its own machine rank"):
        _spec(**shape, framework="accelerate", extra_args=["--machine-rank=1"])
    with pytest.raises(SpecError, match=r"extra_args\[0\] --ddp_backend: 'nccl', but the ranks' backend is gloo"):
        _spec(**shape, framework="transformers", extra_args=["--ddp_backend", "nccl"])
    _spec(**shape, framework="accelerate", extra_args=["--num_processes", "4", "--num_machines=2"])
    _spec(**shape, framework="lightning", extra_args=["--trainer.num_nodes", "2", "--", "--trainer.devices=8"])
    _spec(**shape, framework="lightning", extra_args=["--trainer.devices", "--fast"])  # no value: nothing to read


def test_a_count_in_digits_int_does_not_read_is_refused_naming_the_field() -> None:
    """'²' is a digit to str.isdigit but not to int(): once a traceback-like 'invalid literal', now
    the field and what to write."""
    for fields, field in (({"args": {"trainer.num_nodes": "\u00b2"}}, "args.trainer.num_nodes"),
                          ({"sweep": {"devices": ["2", "\u00b2"]}}, "sweep.devices"),
                          ({"args": {"num_nodes": "--2"}}, "args.num_nodes")):
        with pytest.raises(SpecError) as err:
            _spec(nodes=2, cpu_ranks_per_node=2, framework="lightning", **fields)
        assert f"{field}: " in str(err.value) and "invalid literal" not in str(err.value), str(err.value)
    assert frameworks._as_int("\u00b2") is None and frameworks._as_int("-3") == -3 and frameworks._as_int(" 7 ") == 7


def test_plan_says_what_each_rank_gets_and_the_launcher_command_it_stands_for() -> None:
    cpu = frameworks.plan_lines(_plan(nodes=2, cpu_ranks_per_node=2, framework="fabric"))
    assert cpu == ["framework: fabric: each rank gets LT_CLI_USED=1 LT_DEVICES=2 LT_NUM_NODES=2 LT_ACCELERATOR=cpu "
                   "(what `fabric run --accelerator cpu --devices 2 --num-nodes 2` would set; the script must not call "
                   "fabric.launch(), as under `fabric run`)"]
    acc = frameworks.plan_lines(_plan(nodes=2, cpu_ranks_per_node=2, framework="accelerate"))
    assert "ACCELERATE_USE_CPU=true" in acc[0] and "`accelerate launch --cpu --num_machines 2 --num_processes 4`" in acc[0]
    gpu = frameworks.plan_lines(_plan("slurm", nodes=2, gpus_per_node=4, framework="accelerate"))
    assert "nothing to add on GPUs" in gpu[0] and "--multi_gpu --num_machines 2 --num_processes 8" in gpu[0]
    light = frameworks.plan_lines(_plan("slurm", nodes=2, gpus_per_node=4, framework="lightning"))
    assert "PL_TRAINER_DEVICES=4 PL_TRAINER_NUM_NODES=2 " in light[0] and "Trainer(devices=4, num_nodes=2)" in light[0]
    assert frameworks.plan_lines(_plan(nodes=2, cpu_ranks_per_node=2)) == []


def test_plan_notes_a_dropped_false_for_a_cli_that_reads_booleans_as_values() -> None:
    fields = dict(nodes=1, cpu_ranks_per_node=2, framework="transformers", args={"dataloader_pin_memory": False})
    lines = frameworks.plan_lines(_plan(**fields))
    assert len(lines) == 2 and "dataloader_pin_memory: false is left off" in lines[1], lines
    assert "HfArgumentParser reads '--dataloader_pin_memory false': set bool_args: value" in lines[1]
    # bool_args: value passes it; argparse-style frameworks, and args with no false, get no note.
    launch = _plan(**{**fields, "bool_args": "value"})
    assert len(frameworks.plan_lines(launch)) == 1
    assert launch.payload.argv == ("--dataloader_pin_memory", "false")
    assert len(frameworks.plan_lines(_plan(**{**fields, "framework": "accelerate"}))) == 1
    sweep = dict(nodes=1, cpu_ranks_per_node=2, framework="lightning", sweep={"fast": [0, 1]})
    assert len(frameworks.plan_lines(_plan(**sweep))) == 1  # 0 is not false
    assert "fast: false" in frameworks.plan_lines(_plan(**{**sweep, "sweep": {"fast": [True, False]}}))[1]
