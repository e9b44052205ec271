"""orchestrator.spec.identity: a run is named by its training fields only. Every field of the spec is
classified (a new one fails here until it is); operational changes never move the run folder,
training changes always do; plan's identity line says whether a spec resumes and from which step,
and names the field that made a spec miss another run's checkpoints."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from orchestrator.spec import identity
from orchestrator.spec.identity import OPERATIONAL, TRAINING, latest_checkpoint, resume_line, run_id, sibling_warnings
from orchestrator.spec.loading import spec_from_dict
from orchestrator.spec.models import JobSpec

BASE: dict[str, Any] = {"name": "job", "entrypoint": "jobs.train:main", "args": {"lr": 0.1, "epochs": 3},
                        "nodes": 1, "cpu_ranks_per_node": 2}


def _model_of(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def leaf_fields(model: type[BaseModel] = JobSpec, prefix: str = "") -> Iterator[str]:
    for name, info in model.model_fields.items():
        sub = _model_of(info.annotation)
        if sub is not None:
            yield from leaf_fields(sub, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


def all_fields(model: type[BaseModel] = JobSpec, prefix: str = "") -> set[str]:
    out = set()
    for name, info in model.model_fields.items():
        out.add(f"{prefix}{name}")
        sub = _model_of(info.annotation)
        if sub is not None:
            out |= all_fields(sub, f"{prefix}{name}.")
    return out


def covered_by(field: str, listed: tuple[str, ...]) -> bool:
    parts = field.split(".")
    return any(".".join(parts[:i]) in listed for i in range(1, len(parts) + 1))


def spec(**changes: Any) -> JobSpec:
    data = {**BASE}
    for dotted, value in changes.items():
        node = data
        *path, last = dotted.split(".")
        for part in path:
            node[part] = dict(node.get(part, {}))
            node = node[part]
        node[last] = value
    return spec_from_dict(data)


# ---- every field is classified -----------------------------------------------------------------
def test_the_walk_sees_nested_fields() -> None:
    leaves = set(leaf_fields())
    assert {"slurm.time", "distributed.grad_compression", "checkpoint.interval_steps", "code.snapshot",
            "recovery.max_restarts", "local.timeout_s", "name", "args"} <= leaves
    assert "slurm" not in leaves and "distributed" not in leaves


@pytest.mark.parametrize("field", sorted(leaf_fields()))
def test_every_leaf_field_is_classified_exactly_once(field: str) -> None:
    training, operational = covered_by(field, TRAINING), covered_by(field, OPERATIONAL)
    assert training or operational, f"{field} is neither TRAINING nor OPERATIONAL in orchestrator/spec/identity.py: decide"
    assert not (training and operational), f"{field} is both TRAINING and OPERATIONAL"


def test_every_classified_name_is_a_field_of_the_spec() -> None:
    known = all_fields()
    stale = [name for name in (*TRAINING, *OPERATIONAL) if name not in known]
    assert stale == []
    assert len(set(TRAINING) | set(OPERATIONAL)) == len(TRAINING) + len(OPERATIONAL)


# ---- operational changes keep the run, training changes move it ---------------------------------
_env_names = st.from_regex(r"X[A-Z0-9_]{0,8}", fullmatch=True)
_env_values = st.text(alphabet="abcxyz0123456789-_.", max_size=8)

OPERATIONAL_CHANGES: dict[str, st.SearchStrategy[Any]] = {
    # every time over the largest signal margin (an hour), which the spec checks against it
    "slurm.time": st.sampled_from(["120", "90:00", "02:00:00", "12:00:00", "2-00:00:00", "1-12"]),
    "slurm.max_requeues": st.integers(0, 1000),
    "slurm.signal_margin_s": st.integers(10, 3599),  # below the default slurm.time (1 h)
    "env": st.dictionaries(_env_names, _env_values, max_size=3),
    "watchdog.stall_s": st.one_of(st.none(), st.floats(1, 10_000)),
    "local.timeout_s": st.one_of(st.none(), st.floats(1, 10_000)),
    "recovery.max_restarts": st.integers(0, 1000),
    "code.snapshot": st.booleans(),
    "stop_grace_s": st.floats(1, 3600),
    "checkpoint.interval_steps": st.integers(0, 10**6),
    "distributed.port": st.one_of(st.just("auto"), st.integers(1024, 32767)),
    "runs_dir": st.sampled_from(["runs", "out/runs", "/srv/shared/runs", "elsewhere"]),
}


@st.composite
def operational_changes(draw: st.DrawFn) -> dict[str, Any]:
    keys = draw(st.lists(st.sampled_from(sorted(OPERATIONAL_CHANGES)), unique=True, min_size=1))
    return {k: draw(OPERATIONAL_CHANGES[k]) for k in keys}


@st.composite
def training_change(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["args.lr", "args.new", "args.epochs", "nodes", "cpu_ranks_per_node",
                                 "entrypoint", "name", "executor"]))
    if kind == "args.lr":
        return {"args.lr": draw(st.one_of(st.floats(0, 10).filter(lambda x: x != 0.1), st.text("abc", min_size=1)))}
    if kind == "args.new":
        return {"args.new": draw(st.one_of(st.integers(), st.booleans(), st.text("abc", min_size=1)))}
    if kind == "args.epochs":
        return {"args.epochs": draw(st.integers(0, 10**6).filter(lambda x: x != 3))}
    if kind == "nodes":
        return {"nodes": draw(st.integers(2, 64))}  # a local run holds 128 ranks at most
    if kind == "cpu_ranks_per_node":
        return {"cpu_ranks_per_node": draw(st.sampled_from([1, 3, 4, 8]))}
    if kind == "entrypoint":
        others = ["jobs.allreduce:main", "pkg.train:main", "jobs.train:run", "mymod:main"]
        return {"entrypoint": draw(st.sampled_from(others))}
    if kind == "name":
        return {"name": draw(st.from_regex(r"[a-z][a-z0-9_.\-]{0,20}", fullmatch=True).filter(lambda n: n != "job"))}
    return {"executor": draw(st.sampled_from(["slurm", "debug"]))}


@settings(max_examples=150, deadline=None)
@given(operational_changes())
def test_operational_changes_never_change_the_run_id(changes: dict[str, Any]) -> None:
    assert run_id(spec(**changes)) == run_id(spec())


@settings(max_examples=150, deadline=None)
@given(operational_changes(), training_change())
def test_a_training_change_always_changes_the_run_id(ops: dict[str, Any], change: dict[str, Any]) -> None:
    base = run_id(spec(**ops))
    changed = run_id(spec(**ops, **change))
    assert changed != base
    assert changed.startswith(f"{change.get('name', 'job')}-")


def test_the_run_id_is_the_name_and_eight_hex_digits() -> None:
    rid = run_id(spec())
    assert rid.startswith("job-") and len(rid) == len("job-") + 8
    assert rid == run_id(spec())  # a pure function of the spec
    assert rid == run_id(JobSpec.model_validate(spec().model_dump(mode="json")))  # through spec.yaml and back


def test_arg_order_in_the_spec_does_not_matter() -> None:
    a = spec_from_dict({**BASE, "args": {"lr": 0.1, "epochs": 3}})
    b = spec_from_dict({**BASE, "args": {"epochs": 3, "lr": 0.1}})
    assert run_id(a) == run_id(b)


def test_the_local_world_shape_names_the_run() -> None:
    """``local.*`` is operational, but the world a local run actually has is part of the identity."""
    assert run_id(spec(**{"local.ranks_per_node": 1})) != run_id(spec())
    assert run_id(spec(**{"local.emulate_nodes": 2})) != run_id(spec())
    assert run_id(spec(**{"local.preload_torch": False})) == run_id(spec())


def test_differences_names_the_args_that_changed() -> None:
    a = identity.identity_fields(spec())
    b = identity.identity_fields(spec(**{"args.lr": 0.2, "nodes": 2}))
    assert identity.differences(a, b) == ["args.lr", "local_shape", "nodes"]


# ---- plan's identity line ----------------------------------------------------------------------
def test_resume_line_for_a_missing_folder_is_a_new_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "job-0123abcd"
    assert resume_line(str(run_dir), str(run_dir / "checkpoints")) == "new run job-0123abcd"


def test_resume_line_for_a_folder_without_checkpoints(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "job-0123abcd"
    run_dir.mkdir(parents=True)
    line = resume_line(str(run_dir), str(run_dir / "checkpoints"))
    # no claim about what the script does: it may resume from a file of its own elsewhere
    assert line == f"run job-0123abcd exists with no checkpoint in checkpoint.dir ({run_dir / 'checkpoints'})"
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / ".ckpt-0000000300.pt.123.tmp").write_bytes(b"")  # a writer's leftover: not one
    assert "exists with no checkpoint" in resume_line(str(run_dir), str(run_dir / "checkpoints"))


def test_resume_line_names_the_step_of_the_newest_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "job-0123abcd"
    ckpt = run_dir / "checkpoints"
    ckpt.mkdir(parents=True)
    (ckpt / "ckpt-0000000200.pt").write_bytes(b"x")
    os.utime(ckpt / "ckpt-0000000200.pt", (1_000_000, 1_000_000))
    (ckpt / "ckpt-0000000300.pt").write_bytes(b"x")
    line = resume_line(str(run_dir), str(ckpt))
    assert line == f"resumes run job-0123abcd at step 300 ({ckpt / 'ckpt-0000000300.pt'})"


@pytest.mark.parametrize("name, shown", [("step_300.ckpt", "step 300"), ("epoch=2-step=300.ckpt", "step 300"),
                                         ("model.pt", "its newest checkpoint")])
def test_resume_line_reads_other_checkpoint_names(tmp_path: Path, name: str, shown: str) -> None:
    run_dir = tmp_path / "job-0123abcd"
    (run_dir / "ck").mkdir(parents=True)
    (run_dir / "ck" / name).write_bytes(b"x")
    assert resume_line(str(run_dir), str(run_dir / "ck")).startswith(f"resumes run job-0123abcd at {shown} (")
    assert latest_checkpoint(run_dir / "ck") == (name, 300 if "300" in name else None)


def _sibling(runs: Path, s: JobSpec, checkpoint: str | None) -> Path:
    folder = runs / run_id(s)
    folder.mkdir(parents=True)
    (folder / "spec.yaml").write_text(yaml.safe_dump(s.model_dump(mode="json"), sort_keys=False))
    if checkpoint:
        (folder / "checkpoints").mkdir()
        (folder / "checkpoints" / checkpoint).write_bytes(b"x")
    return folder


def test_sibling_warnings_name_the_training_field_that_differs(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    old = spec(**{"args.lr": 0.1})
    theirs = _sibling(runs, old, "ckpt-0000000300.pt")
    mine = spec(**{"args.lr": 0.01})
    warnings = sibling_warnings(mine, str(runs / run_id(mine)))
    assert len(warnings) == 1
    assert f"run {theirs.name} holds checkpoints (step 300)" in warnings[0]
    assert "differs in args.lr," in warnings[0] and "undo the change" in warnings[0]


def test_sibling_warnings_stay_quiet_when_nothing_is_to_be_missed(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    mine = spec(**{"args.lr": 0.01})
    _sibling(runs, spec(**{"args.lr": 0.5}), None)  # no checkpoint: nothing to resume
    _sibling(runs, spec(name="other", **{"args.lr": 0.1}), "ckpt-0000000300.pt")  # another job's name
    own = _sibling(runs, mine, "ckpt-0000000100.pt")  # this spec's own folder: it resumes, no warning
    broken = runs / "job-deadbeef"
    broken.mkdir()
    (broken / "spec.yaml").write_text(": not a spec [")  # unreadable: no claim about it
    (broken / "checkpoints").mkdir()
    (broken / "checkpoints" / "ckpt-0000000001.pt").write_bytes(b"x")
    assert sibling_warnings(mine, str(own)) == []
    assert sibling_warnings(mine, str(runs / "missing" / run_id(mine))) == []  # no runs folder yet


def test_sibling_warnings_name_several_fields_and_stop_at_the_limit(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for i in range(5):
        _sibling(runs, spec(**{"args.lr": 0.1 + i, "nodes": 2}), f"ckpt-{i:010d}.pt")
    mine = spec(**{"args.lr": 0.05})
    warnings = sibling_warnings(mine, str(runs / run_id(mine)))
    assert len(warnings) == 3
    assert all("args.lr" in w and "nodes" in w for w in warnings)
    assert sibling_warnings(mine, str(runs / run_id(mine)), limit=10).__len__() == 5


def test_resume_line_reads_sweep_points_an_explicit_folder_and_resume_false(tmp_path: Path) -> None:
    run, ckpt = tmp_path / "runs" / "job-0123abcd", tmp_path / "ckpts"
    (ckpt / "point-0001").mkdir(parents=True)
    (ckpt / "point-0001" / "ckpt-0000000040.pt").write_text("x")
    assert "1 of 3 points hold checkpoints (up to step 40)" in resume_line(str(run), str(ckpt), points=3)
    (ckpt / "ckpt-0000000007.pt").write_text("x")
    assert resume_line(str(run), str(ckpt)).startswith("new run job-0123abcd, but checkpoint.dir holds step 7")
    run.mkdir(parents=True)
    line = resume_line(str(run), str(ckpt), resume=False)
    assert "starts at step 0 (checkpoint.resume: false)" in line


def test_resume_false_is_another_run() -> None:
    base = {"name": "j", "entrypoint": "jobs.train:main"}
    assert run_id(spec_from_dict(base)) != run_id(spec_from_dict({**base, "checkpoint": {"resume": False}}))
