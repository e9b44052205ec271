"""The plan is typed to the end (issue 34): it carries the validated JobSpec, a spec is validated
once per run or submission, payload files have one writer, and ``after:`` is parsed once."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.spec import models as spec_module
from orchestrator.spec import loading
from orchestrator.core.errors import SpecError
from orchestrator.plan import LaunchPlan, plan
from orchestrator.spec.models import AfterSpec, JobSpec

ROOT = Path(__file__).resolve().parents[2]


def _spec(tmp_path: Path, **fields: object) -> JobSpec:
    return JobSpec(name="typed", entrypoint="jobs.train:main", runs_dir=str(tmp_path / "runs"), **fields)  # type: ignore[arg-type]


def test_the_plan_carries_the_validated_spec_and_writes_it_as_before(tmp_path: Path) -> None:
    spec = _spec(tmp_path, nodes=2, sweep={"lr": [0.1, 0.2]}, after=[{"run": "prep-1234abcd", "when": "any"}])
    for executor in ("local", "slurm"):
        launch = plan(spec, executor)  # type: ignore[arg-type]
        assert isinstance(launch.spec, JobSpec) and launch.spec.executor == executor
        assert all(isinstance(a, AfterSpec) for a in launch.spec.after)
        dumped = json.loads(launch.model_dump_json())
        assert dumped["spec"] == launch.spec.model_dump(mode="json")  # plan.json's "spec": the same JSON as before
        assert LaunchPlan.model_validate_json(launch.model_dump_json()).spec == launch.spec  # the detached supervisor


def _count_validations(monkeypatch: pytest.MonkeyPatch) -> list[JobSpec]:
    seen: list[JobSpec] = []
    real = spec_module.mark_validated

    def counted(spec: JobSpec) -> JobSpec:
        seen.append(spec)
        return real(spec)

    monkeypatch.setattr(spec_module, "mark_validated", counted)
    monkeypatch.setattr(loading, "mark_validated", counted)
    return seen


def test_a_spec_is_validated_once_per_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = {"name": "typed", "entrypoint": "jobs.train:main", "runs_dir": str(tmp_path / "runs"),
            "code": {"snapshot": False}}
    seen = _count_validations(monkeypatch)
    launch = api.plan_for(data, executor="slurm")  # the executor is applied as the spec is loaded, not again
    assert len(seen) == 1 and launch.spec is seen[0] and launch.executor == "slurm"
    seen.clear()
    spec = JobSpec(**data)  # type: ignore[arg-type]
    assert len(seen) == 1
    assert api.plan_for(spec).spec is spec and len(seen) == 1  # taken as it is: validated by its constructor
    assert api.as_spec(spec, "slurm") is not spec and len(seen) == 2  # another executor: validated for it


def test_a_spec_changed_by_model_copy_is_validated_again(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    assert spec_module.is_validated(spec)
    changed = spec.model_copy(update={"nodes": 0})
    assert not spec_module.is_validated(changed)
    with pytest.raises(SpecError, match="nodes"):
        api.as_spec(changed)


def test_the_planner_does_not_call_the_loader() -> None:
    tree = ast.parse((ROOT / "orchestrator" / "plan" / "__init__.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "orchestrator.spec.loading" not in imported


def _calls(path: Path, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
            and (getattr(n.func, "id", None) == name or getattr(n.func, "attr", None) == name)]


def test_payload_files_have_one_writer() -> None:
    """Only ``Payload.write`` serialises a payload to disk (queued jobs read that format)."""
    writers = []
    for path in sorted((ROOT / "orchestrator").rglob("*.py")):
        for call in _calls(path, "write_json_atomic") + _calls(path, "write_text_atomic"):
            where, what = (ast.unparse(a) for a in call.args[:2])
            to_payload = where.endswith(("payload", "payload_path")) or "payload" in what and "to_dict" in what
            if to_payload and path.name != "payload.py":
                writers.append(f"{path.relative_to(ROOT)}:{call.lineno}")
    assert not writers, f"payload files written outside Payload.write: {writers}"


def test_after_entries_are_parsed_once() -> None:
    """The spec's ``after:`` entries are AfterSpecs from validation on: nothing parses them again."""
    again = [f"{p.relative_to(ROOT)}:{c.lineno}" for p in sorted((ROOT / "orchestrator").rglob("*.py"))
             for c in _calls(p, "model_validate") if "AfterSpec" in ast.unparse(c)]
    assert not again, again


def _members(protocol: type) -> set[str]:
    return {n for n in vars(protocol) if not n.startswith("_")}


def test_the_views_name_only_what_jobspec_and_launchplan_have(tmp_path: Path) -> None:
    """``views`` types container/frameworks/tracking without importing spec.py or plan.py: each
    Protocol member must exist on the real object (no type checker runs in CI), nested ones too."""
    from orchestrator.core import views

    launch = plan(_spec(tmp_path, container={"runtime": "apptainer", "image": "/img.sif"}), "slurm")  # type: ignore[arg-type]
    spec = launch.spec
    nested = {"container": views.ContainerView, "slurm": views.SlurmView, "local": views.LocalView,
              "distributed": views.DistributedView, "checkpoint": views.CheckpointView, "code": views.CodeView,
              "tracking": views.TrackingView}
    assert _members(views.SpecView) <= set(dir(spec))
    for name, protocol in nested.items():
        assert _members(protocol) <= set(dir(getattr(spec, name))), name
    assert _members(views.LaunchView) <= set(dir(launch))
    assert _members(views.RankView) <= set(dir(launch.ranks[0]))
