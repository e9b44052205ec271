"""Pipelines without a scheduler: the file, the graph and its order, the skip and dependency
decisions, the sbatch options they render, and a spec's own after: resolved from run records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.spec.after import (Parent, after_lines, dependency_options, edge_status, local_problems,
                                slurm_dependencies)
from orchestrator.core.errors import SpecError, SubmissionError, UsageError
from orchestrator.spec.loading import load_spec
from orchestrator.front.pipeline import (CycleError, Edge, ParentView, decide, decide_all, load_pipeline, load_stages,
                                   parse_pipeline, topological_order)
from orchestrator.core.records import RunRecord, register
from orchestrator.core.states import TERMINAL, State


def _parse(stages: dict) -> object:
    return parse_pipeline({"stages": stages}, "p.yaml", "/base")


def test_a_pipeline_file_is_parsed_with_paths_beside_it() -> None:
    p = _parse({"prep": "prep.yaml", "train": {"spec": ["a.yaml", "/abs/b.yaml"], "after": "prep", "set": ["args.lr=0.1"]},
                "eval": {"spec": "eval.yaml", "after": [{"stage": "train", "when": "notok"}, "prep"]}})
    assert [s.name for s in p.stages] == ["prep", "train", "eval"]
    assert p.stage("prep").specs == ("/base/prep.yaml",)
    assert p.stage("train").specs == ("/base/a.yaml", "/abs/b.yaml") and p.stage("train").overrides == ("args.lr=0.1",)
    assert p.stage("train").after == (Edge("prep"),)
    assert p.stage("eval").after == (Edge("train", "notok"), Edge("prep", "ok"))


@pytest.mark.parametrize("stages, expected", [
    ({"a": "a.yaml", "b": {"spec": "b.yaml", "after": ["c"]}},
     "stages.b.after: 'c' is not a stage of this pipeline (its stages: a, b); fix the name or add that stage"),
    ({"a": {"spec": "a.yaml", "after": ["a"]}}, "stages.a.after: a waits for itself; remove that entry"),
    ({"a": {"spec": "a.yaml", "after": ["c"]}, "b": {"spec": "b.yaml", "after": ["a"]},
      "c": {"spec": "c.yaml", "after": ["b"]}},
     "stages.a.after: the stages a -> c -> b -> a wait for each other (a cycle); remove one of these after: entries"),
    ({"a": {"spec": "a.yaml", "after": [{"stage": "b", "when": "maybe"}]}, "b": "b.yaml"},
     "stages.a.after[0].when: 'maybe' is not one of ok, any, notok"),
    ({"a": {"after": []}}, "stages.a: no spec; give its spec file, e.g. spec: a.yaml"),
    ({"a": {"spec": "a.yaml", "needs": ["b"]}}, "stages.a: unknown key(s) needs; a stage has spec, after, set"),
    ({"a b": "a.yaml"}, "stages.a b: a stage name is letters, digits"),
])
def test_bad_pipelines_name_the_stage_and_the_fix(stages: dict, expected: str) -> None:
    with pytest.raises(SpecError) as info:
        _parse(stages)
    assert info.value.source == "p.yaml" and str(info.value).startswith("invalid pipeline")
    assert any(p.startswith(expected) for p in info.value.problems), info.value.problems


def test_a_stage_named_twice_is_refused_by_the_loader(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("stages:\n  prep: {spec: a.yaml}\n  prep: {spec: b.yaml}\n")
    with pytest.raises(SpecError, match="'prep' appears twice in one mapping; keep one"):
        load_pipeline(path)
    path.write_text("stage: {}\n")
    with pytest.raises(SpecError, match="give 'stages:'"):
        load_pipeline(path)


@st.composite
def dags(draw: st.DrawFn) -> dict[str, list[str]]:
    """Random DAGs: each node may wait for nodes of lower number, listed in a shuffled order."""
    n = draw(st.integers(1, 12))
    names = [f"s{i}" for i in range(n)]
    deps = {names[i]: draw(st.lists(st.sampled_from(names[:i]), unique=True)) if i else [] for i in range(n)}
    order = draw(st.permutations(names))
    return {name: deps[name] for name in order}


@settings(max_examples=100, deadline=None)
@given(dags(), st.data())
def test_the_order_respects_every_edge_and_a_back_edge_is_a_named_cycle(deps: dict[str, list[str]], data: st.DataObject) -> None:
    order = topological_order(deps)
    assert sorted(order) == sorted(deps)
    assert all(order.index(d) < order.index(n) for n, ds in deps.items() for d in ds)
    free = [n for n in deps if not deps[n]]
    assert order[0] == free[0]  # stages free to go keep the order they were written in
    edges = [(n, d) for n, ds in deps.items() for d in ds]
    if edges:  # reverse one edge's direction on top: now a cycle, and the one named is real
        child, parent = data.draw(st.sampled_from(edges))
        cyclic = {**deps, parent: [*deps[parent], child]}
        with pytest.raises(CycleError) as info:
            topological_order(cyclic)
        cycle = info.value.cycle
        assert cycle[0] == cycle[-1] and len(cycle) >= 3
        assert all(b in cyclic[a] for a, b in zip(cycle, cycle[1:]))


@pytest.mark.parametrize("state", list(State))
def test_edges_are_judged_as_slurm_judges_dependencies(state: State) -> None:
    ended = state in TERMINAL
    assert edge_status("ok", state) == ("wait" if not ended else "met" if state == State.COMPLETED else "never")
    assert edge_status("any", state) == ("met" if ended else "wait")
    assert edge_status("notok", state) == ("wait" if not ended else "never" if state == State.COMPLETED else "met")
    assert edge_status("ok", None) == "wait"


def test_decisions_skip_completed_wait_for_queued_and_cancel_what_cannot_run() -> None:
    order = ["prep", "train", "eval", "report", "after_report"]
    edges = {"prep": [], "train": [Edge("prep")], "eval": [Edge("train")], "report": [Edge("train", "notok")],
             "after_report": [Edge("report", "any")]}
    done = decide_all(order, edges, {"prep": State.COMPLETED, "train": State.RUNNING, "eval": State.FAILED})
    assert done["prep"].action == "skip"
    assert done["train"].action == "wait"
    assert done["eval"].action == "submit" and done["eval"].depends == (("ok", ()),)
    assert done["report"].action == "submit"
    fresh = decide_all(order, edges, {"prep": State.COMPLETED, "train": State.COMPLETED}, {"train": ["12"]})
    assert fresh["eval"].action == "submit" and fresh["eval"].depends == ()  # parent done: nothing to wait for
    assert fresh["report"].action == "never" and "train ended COMPLETED" in fresh["report"].reason
    assert fresh["after_report"].action == "submit"  # 'any' of a stage never started (CANCELLED) holds
    queued = decide_all(order, edges, {"prep": State.PENDING}, {"prep": ["7_0", "7_1"]})
    assert queued["train"].depends == (("ok", ("7_0", "7_1")),)
    # Locally, parents have ended by the child's turn: a failed parent stops ok, not any/notok.
    assert decide(None, [ParentView("train", "ok", State.FAILED)]).action == "never"
    assert decide(None, [ParentView("train", "any", State.FAILED)]).action == "submit"
    assert decide(None, [ParentView("train", "notok", State.TIMEOUT)]).action == "submit"


def test_dependencies_render_as_one_sbatch_dependency_that_kills_on_an_invalid_one() -> None:
    from orchestrator.backends.slurm import submitit_adapter

    opts = dependency_options([("ok", ["12"]), ("ok", ["13_0", "13_1", "12"]), ("any", ["14"]), ("notok", [])])
    assert opts == {"dependency": "afterok:12:13,afterany:14", "kill-on-invalid-dep": "yes"}
    assert dependency_options([]) == {} and dependency_options([("ok", [])]) == {}
    script = submitit_adapter.render_sbatch({"job_name": "x", "nodes": 1, "time": 5, "use_srun": False,
                                             "additional_parameters": {"signal": "B:USR2@30"}},
                                            "/srv/runs/x/slurm", "exec true", extra_sbatch=opts)
    assert "#SBATCH --dependency=afterok:12:13,afterany:14\n" in script
    assert "#SBATCH --kill-on-invalid-dep=yes\n" in script and "#SBATCH --signal=B:USR2@30\n" in script


def test_users_cannot_set_the_dependency_by_hand() -> None:
    from orchestrator.spec.loading import spec_from_dict

    for option in ("dependency", "kill-on-invalid-dep", "dep"):
        with pytest.raises(SpecError, match="after:|abbreviation"):
            spec_from_dict({"name": "x", "entrypoint": "a.py", "slurm": {"extra_sbatch": {option: "afterok:1"}}})


def _record(runs: Path, run_id: str, state: str, executor: str = "slurm", jobs: tuple[str, ...] = ("41",)) -> None:
    (runs / run_id).mkdir(parents=True)
    rec = RunRecord(run_id=run_id, run_dir=str(runs / run_id), executor=executor, state=State(state),
                    job_ids=list(jobs))
    rec.save()
    register(rec)


def test_a_specs_own_after_resolves_to_job_ids_or_says_why_not(tmp_path: Path) -> None:
    from orchestrator.spec.after import resolve
    from orchestrator.spec.models import AfterSpec

    runs = tmp_path / "runs"
    _record(runs, "prep-00000001", "COMPLETED")
    _record(runs, "train-00000002", "PENDING", jobs=("42_0", "42_1"))
    _record(runs, "bad-00000003", "FAILED")
    _record(runs, "here-00000004", "RUNNING", executor="local", jobs=())
    seen: list[str] = []

    def refresh(records: list[RunRecord]) -> list[RunRecord]:  # the scheduler's view: as recorded
        seen.extend(r.run_id for r in records)
        return records

    def parents(*pairs: tuple[str, str]) -> list[Parent]:
        return resolve([AfterSpec(run=r, when=w) for r, w in pairs], "slurm", refresh, "me-00000009")

    assert slurm_dependencies(parents(("prep-00000001", "ok"), ("train-00000002", "any"))) == [("any", ["42_0", "42_1"])]
    assert seen == ["train-00000002"]  # only runs not ended are asked of the scheduler
    assert slurm_dependencies(parents(("bad-00000003", "notok"))) == []
    with pytest.raises(SubmissionError, match="ended FAILED, and when: ok waits for it to have COMPLETED"):
        slurm_dependencies(parents(("bad-00000003", "ok")))
    with pytest.raises(SubmissionError, match="no run yet: submit it first"):
        slurm_dependencies(parents(("ghost-00000005", "ok")))
    with pytest.raises(SubmissionError, match="outside SLURM"):
        slurm_dependencies(parents(("here-00000004", "any")))
    with pytest.raises(SubmissionError, match="names this run itself"):
        parents(("me-00000009", "ok"))
    # The SLURM executor adds the spec's own after: to the pipeline's edges, at submission.
    from orchestrator.backends.slurm.executor import SlurmExecutor
    from orchestrator.spec.loading import spec_from_dict
    from orchestrator.plan import plan

    def launch(*after: dict) -> object:
        return plan(spec_from_dict({"name": "me", "entrypoint": "jobs.train:main", "executor": "slurm",
                                    "runs_dir": str(runs), "after": list(after)}))

    assert SlurmExecutor().dependency(launch({"run": "prep-00000001"}), [("ok", ["5"])]) == \
        {"dependency": "afterok:5", "kill-on-invalid-dep": "yes"}
    assert SlurmExecutor().dependency(launch()) == {}
    with pytest.raises(SubmissionError, match="bad-00000003 ended FAILED"):
        SlurmExecutor().dependency(launch({"run": "bad-00000003"}))
    problems = local_problems(parents(("prep-00000001", "ok"), ("train-00000002", "ok"), ("bad-00000003", "ok")))
    assert [p.split(" ")[1] for p in problems] == ["train-00000002", "bad-00000003"]
    assert "is still PENDING: run this once it has ended" in problems[0]


def _spec(folder: Path, name: str, **fields: object) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps({"name": name, "entrypoint": "jobs.train:main", "runs_dir": str(folder / "runs"), **fields}))
    return path


def test_stages_load_with_identities_and_spec_after_entries_become_edges(tmp_path: Path) -> None:
    _spec(tmp_path, "prep")
    _spec(tmp_path, "train", after=[{"run": str(tmp_path / "prep.yaml"), "when": "any"}])
    (tmp_path / "p.yaml").write_text("stages:\n  train: train.yaml\n  prep: prep.yaml\n")
    stages = load_stages(load_pipeline(tmp_path / "p.yaml"))
    assert [s.name for s in stages] == ["prep", "train"]  # the spec's after: ordered them
    assert stages[1].edges == (Edge("prep", "any"),)
    assert stages[0].run_dir == str(tmp_path / "runs" / stages[0].run_id) and stages[0].run_id.startswith("prep-")
    # The pipeline orders that entry through the edge: the stage's spec no longer waits on its own.
    assert after_lines(stages[1].spec) == [] and stages[1].spec.after == []
    assert after_lines(load_spec(tmp_path / "train.yaml")) == \
        [f"after: {stages[0].run_id} [prep.yaml] (any; no run yet) (checked before it starts)"]

    (tmp_path / "p.yaml").write_text("stages:\n  a: prep.yaml\n  b: {spec: prep.yaml, set: [executor=local]}\n")
    with pytest.raises(SpecError, match="stages a and b are the same run"):
        load_stages(load_pipeline(tmp_path / "p.yaml"))
    (tmp_path / "p.yaml").write_text("stages:\n  a: prep.yaml\n  b: {spec: prep.yaml, set: [executor=slurm, name=b]}\n")
    with pytest.raises(UsageError, match="one executor"):
        load_stages(load_pipeline(tmp_path / "p.yaml"))


def test_a_spec_after_naming_a_stage_file_follows_that_stage_overrides_and_all(tmp_path: Path) -> None:
    """The parent stage runs with its pipeline overrides (another run id than its file alone gives):
    the child's own after: entry naming that file is still that stage, ordered by an edge."""
    _spec(tmp_path, "prep")
    _spec(tmp_path, "train", after=[{"run": str(tmp_path / "prep.yaml")}])
    (tmp_path / "p.yaml").write_text("stages:\n  train: train.yaml\n  prep: {spec: prep.yaml, set: [args.lr=0.1]}\n")
    stages = load_stages(load_pipeline(tmp_path / "p.yaml"))
    assert [s.name for s in stages] == ["prep", "train"] and stages[1].edges == (Edge("prep", "ok"),)
    assert stages[1].spec.after == []


def test_a_pipeline_whose_stage_waits_for_a_missing_run_is_refused_before_anything_runs(tmp_path: Path) -> None:
    from orchestrator.front.pipeline import run_pipeline

    (tmp_path / "never.py").write_text("raise SystemExit('the pipeline ran a stage before refusing')\n")
    _spec(tmp_path, "prep", executor="local", entrypoint=str(tmp_path / "never.py"))
    _spec(tmp_path, "train", executor="local", after=[{"run": "elsewhere-0123abcd"}])
    (tmp_path / "p.yaml").write_text("stages:\n  prep: prep.yaml\n  train: {spec: train.yaml, after: [prep]}\n")
    with pytest.raises(UsageError, match="nothing ran or was submitted") as err:
        run_pipeline(tmp_path / "p.yaml")
    assert "elsewhere-0123abcd has no run yet" in str(err.value)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").glob("prep-*"))
