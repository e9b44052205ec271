"""The human view of a large plan: what all ranks share, node 0, the rule for the nodes between
(checked against every row), the last node; the job's environment (spec env, thread default,
NCCL aids) on every row, computed once."""

from __future__ import annotations

import io
from dataclasses import replace

from rich.console import Console

from orchestrator.front.display import print_ranks
from orchestrator.plan import plan
from orchestrator.spec.models import JobSpec


def _view(launch, **kw) -> str:
    buf = io.StringIO()
    print_ranks(launch, Console(file=buf, width=240), **kw)
    return buf.getvalue()


def _spec(**kw) -> JobSpec:
    # runs_dir shared-looking: a SLURM plan refuses the default 'runs' from a checkout in /tmp.
    base = dict(name="big", entrypoint="jobs.train:main", nodes=64, gpus_per_node=8, executor="slurm",
                runs_dir="/shared/runs")
    return JobSpec(**{**base, **kw})


def test_rows_that_break_the_node_rule_are_shown_not_hidden() -> None:
    launch = plan(_spec())
    assert "differ from that rule" not in _view(launch)
    rows = list(launch.ranks)
    odd = rows[8 * 30 + 3]
    rows[odd.rank] = replace(odd, env={**odd.env, "CUDA_VISIBLE_DEVICES": "7"})
    broken = launch.model_copy(update={"ranks": rows})
    view = _view(broken)
    assert "ranks that differ from that rule" in view
    assert f"{odd.rank}" in view.split("differ from that rule")[1]


def test_a_row_with_the_wrong_rank_breaks_the_rule() -> None:
    launch = plan(_spec(nodes=8))
    rows = list(launch.ranks)
    rows[20] = replace(rows[20], env={**rows[20].env, "RANK": "21"})
    assert "differ from that rule" in _view(launch.model_copy(update={"ranks": rows}))


def test_job_environment_is_on_every_row_and_shown_once() -> None:
    launch = plan(_spec(env={"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "3"}))
    for row in launch.ranks:
        assert row.env["NCCL_DEBUG"] == "WARN" and row.env["OMP_NUM_THREADS"] == "3"
        assert row.env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert launch.payload.env["NCCL_DEBUG"] == "WARN"
    view = _view(launch)
    assert view.count("NCCL_DEBUG=WARN") == 1


def test_nccl_aids_can_be_turned_off_and_are_absent_for_gloo() -> None:
    off = plan(_spec(distributed={"nccl_async_error_handling": False, "nccl_flight_recorder": False}))
    assert not any(k.startswith("TORCH_") for k in off.payload.env)
    gloo = plan(JobSpec(name="cpu", entrypoint="jobs.train:main", nodes=2, cpu_ranks_per_node=2))
    assert not any(k.startswith("TORCH_") for k in gloo.payload.env)
    on = plan(_spec())
    assert on.payload.env["TORCH_FR_DUMP_TEMP_FILE"].startswith(on.run_dir)


def test_heap_defaults_are_planned_and_the_users_own_win(monkeypatch) -> None:
    from orchestrator.node.malloc import MALLOC_DEFAULTS

    for executor in ("slurm", "local"):
        launch = plan(_spec(nodes=2, executor=executor) if executor == "slurm" else
                      JobSpec(name="cpu", entrypoint="jobs.train:main", nodes=2, cpu_ranks_per_node=2))
        assert all(launch.payload.env[k] == v for k, v in MALLOC_DEFAULTS.items())
        assert all(row.env["MALLOC_TRIM_THRESHOLD_"] == MALLOC_DEFAULTS["MALLOC_TRIM_THRESHOLD_"] for row in launch.ranks)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")  # exported in the user's shell: theirs
    assert plan(_spec(nodes=2)).payload.env["MALLOC_TRIM_THRESHOLD_"] == "65536"
    spec_env = plan(_spec(nodes=2, env={"MALLOC_MMAP_THRESHOLD_": "262144"})).payload.env
    assert spec_env["MALLOC_MMAP_THRESHOLD_"] == "262144"  # the spec's env wins over both


def test_a_row_that_differs_in_a_shared_variable_is_shown_with_that_variable() -> None:
    launch = plan(_spec(nodes=16))
    assert "MASTER_ADDR=" in _view(launch)  # shared: printed once above the tables
    rows = list(launch.ranks)
    for index in (8 * 5 + 2, len(rows) - 1):  # one in the middle, one on the last node
        rows[index] = replace(rows[index], env={**rows[index].env, "MASTER_ADDR": "elsewhere"})
    view = _view(launch.model_copy(update={"ranks": rows}))
    assert "MASTER_ADDR=" not in view  # no longer shared: a column of the tables instead
    odd_table = view.split("differ from that rule")[1].split("node 15")[0]
    assert "elsewhere" in odd_table and str(8 * 5 + 2) in odd_table
    assert "elsewhere" in view.split("node 15")[-1]  # the last node's table shows its odd row too


def test_the_readme_table_names_every_variable_a_rank_gets() -> None:
    """README's table of the rank environment lists every variable ``rank_environment`` can set
    (a SLURM nccl job with every aid on, a local CPU job), so a new one cannot go undocumented."""
    import re
    from pathlib import Path

    from orchestrator.spec.loading import spec_from_dict
    from orchestrator.node.rank_env import FLIGHT_RECORDER_RENAMES

    readme = (Path(__file__).resolve().parents[2] / "docs" / "manual" / "rank-environment.md").read_text()
    table = readme.split("<!-- rank-env-table -->", 1)[1].split("\n\n", 1)[0]
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]*)`", table))
    gpu = {"name": "t", "entrypoint": "jobs.train:main", "nodes": 2, "gpus_per_node": 2, "runs_dir": "/shared/runs",
           "distributed": {"backend": "nccl", "init_method": "tcp"}}
    seen: set[str] = set(FLIGHT_RECORDER_RENAMES.values())
    for launch in (plan(spec_from_dict(gpu), "slurm"), plan(spec_from_dict(gpu), "local")):
        for row in launch.ranks:
            seen |= set(row.env)
    assert seen - documented == set(), f"README's rank environment table lacks {sorted(seen - documented)}"


def test_plan_says_where_each_ranks_cpus_come_from() -> None:
    from orchestrator.front.display import print_plan

    buf = io.StringIO()
    print_plan(plan(_spec(nodes=2)), Console(file=buf, width=400))
    out = buf.getvalue()
    assert "CPUs: <SLURM_CPUS_ON_NODE / 8> per rank, known when the job starts" in out
    assert "OMP_NUM_THREADS=<SLURM_CPUS_ON_NODE / 8>" in out
    assert "--cpus-per-task=1" not in out and "wckey" not in out
