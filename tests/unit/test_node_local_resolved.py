"""A SLURM spec's node-local paths are refused as the plan resolves them, on the host that submits:
the default ``runs_dir: runs`` in a project under /tmp, or a ``checkpoint.dir`` of '../x' that
lands there, is as node-local as '/tmp/x' written out (tests/explore BUG 5). The spec alone
(``validate``, the laptop under ``--remote``) cannot know the folder the job is submitted from, so
this is the plan's check (``slurm_plan.resolved_path_problems``) and ``validate --cluster``'s."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from orchestrator import api
from orchestrator.cli import main
from orchestrator.core.errors import SpecError
from orchestrator.plan import plan
from orchestrator.spec.loading import spec_from_dict
from orchestrator.spec.validators import is_node_local, node_local_from

BASE: dict[str, Any] = {"name": "nl", "entrypoint": "jobs.train:main", "executor": "slurm", "nodes": 2,
                        "cpu_ranks_per_node": 1, "code": {"snapshot": False}}


@pytest.fixture
def under_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This test in a project folder under /tmp (a node-local path on a cluster), removed after."""
    before = os.getcwd()
    outer = Path(tempfile.mkdtemp(prefix="orch-node-local-", dir="/tmp"))
    project = outer / "my proj"
    project.mkdir()
    monkeypatch.chdir(project)
    try:
        yield project
    finally:
        os.chdir(before)  # out of the folder before it goes
        shutil.rmtree(outer, ignore_errors=True)


@pytest.fixture
def shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test in a project folder that looks shared (tmp_path is never under /tmp: tests/conftest.py)."""
    assert not is_node_local(str(tmp_path)), tmp_path
    project = tmp_path / "proj"
    project.mkdir()
    monkeypatch.chdir(project)
    return project


def _refused(**fields: Any) -> list[str]:
    with pytest.raises(SpecError) as err:
        plan(spec_from_dict({**BASE, **fields}))
    return err.value.problems


def test_the_default_runs_dir_in_a_project_under_tmp_is_refused_naming_the_field(under_tmp: Path) -> None:
    spec = spec_from_dict(BASE)  # the spec alone is fine: the folder it is submitted from is the plan's to know
    with pytest.raises(SpecError) as err:
        plan(spec)
    (problem,) = err.value.problems
    assert problem.startswith(f"runs_dir: 'runs' is '{under_tmp}/runs' here, node-local on a cluster: "), problem
    assert "slurm.assume_shared_paths: true" in problem and "shared filesystem" in problem, problem


def test_plan_and_submit_through_the_api_and_the_cli_refuse_it_too(under_tmp: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SpecError, match="runs_dir: 'runs' is .* here, node-local"):
        api.plan_for(BASE)
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr(api, "_executor", lambda *args: pytest.fail("submit reached the executor"))
    with pytest.raises(SpecError, match="runs_dir: 'runs' is .* here, node-local"):
        api.submit(BASE)
    assert not (under_tmp / "runs").exists()
    local = {k: v for k, v in BASE.items() if k != "executor"}
    with pytest.raises(SpecError, match="runs_dir: 'runs' is .* here, node-local"):
        api.plan_for(local, executor="slurm")  # plan --executor slurm of a local spec
    assert api.plan_for(local).executor == "local"  # a local run may use /tmp
    (under_tmp / "spec.yaml").write_text("name: nl\nentrypoint: jobs.train:main\nexecutor: slurm\n"
                                         "code: {snapshot: false}\n")
    capsys.readouterr()
    assert main(["plan", "spec.yaml"]) == 2
    err = capsys.readouterr().err
    assert "runs_dir: 'runs' is" in err and "my proj/runs' here, node-local" in err, err


def test_assume_shared_paths_still_lifts_it(under_tmp: Path) -> None:
    launch = plan(spec_from_dict({**BASE, "checkpoint": {"dir": "../ckpt"}, "slurm": {"assume_shared_paths": True}}))
    assert launch.run_dir.startswith(f"{under_tmp}/runs/")
    assert launch.payload.checkpoint.dir == str(under_tmp.parent / "ckpt")


def test_a_checkpoint_dir_that_climbs_to_tmp_is_refused(shared: Path, under_tmp: Path) -> None:
    """runs_dir on a shared path; checkpoint.dir '../x' from the project under /tmp lands in /tmp."""
    (problem,) = _refused(runs_dir=str(shared / "runs"), checkpoint={"dir": "../x"})
    assert problem.startswith(f"checkpoint.dir: '../x' is '{under_tmp.parent}/x' here, node-local on a cluster: "), \
        problem
    assert "give checkpoint.dir a path on a shared filesystem" in problem, problem


def test_a_shared_looking_folder_plans_relative_paths(shared: Path) -> None:
    launch = plan(spec_from_dict({**BASE, "checkpoint": {"dir": "../ckpt"}}))
    assert launch.run_dir.startswith(f"{shared}/runs/")
    assert launch.payload.checkpoint.dir == str(shared.parent / "ckpt")


def test_a_file_rendezvous_folder_under_tmp_is_refused_unless_declared_shared(shared: Path, under_tmp: Path) -> None:
    rendezvous = {"init_method": "file", "rendezvous_dir": "rdv", "backend": "gloo"}
    (problem,) = _refused(runs_dir=str(shared / "runs"), distributed=rendezvous)
    assert problem.startswith(f"distributed.rendezvous_dir: file:// init across 2 nodes needs a path every node "
                              f"sees, but 'rdv' is '{under_tmp}/rdv' here, node-local"), problem
    plan(spec_from_dict({**BASE, "runs_dir": str(shared / "runs"),
                         "distributed": {**rendezvous, "rendezvous_dir_is_shared": True}}))


def test_validate_cluster_resolves_from_the_folder_it_runs_in(under_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.backends.slurm import slurm_checks

    answers = {"partition": "PartitionName=cpu Default=YES MaxTime=UNLIMITED Nodes=n[1-2] State=UP\n",
               "node": "NodeName=n1 CPUTot=8 State=IDLE Partitions=cpu\nNodeName=n2 CPUTot=8 State=IDLE Partitions=cpu\n",
               "config": "MaxArraySize=1001\n"}
    monkeypatch.setattr(slurm_checks, "scontrol_text", lambda *args: answers[args[1]])
    with pytest.raises(SpecError) as err:
        slurm_checks.check_against_cluster(spec_from_dict(BASE), environ={})
    assert [p for p in err.value.problems if p.startswith("runs_dir: 'runs' is ")], err.value.problems
    slurm_checks.check_against_cluster(spec_from_dict({**BASE, "slurm": {"assume_shared_paths": True}}), environ={})


@pytest.mark.parametrize(("path", "cwd", "lands"), [
    ("runs", "/tmp/p", "/tmp/p/runs"),
    ("../../x", "/srv/a/b", None),
    ("../../tmp/x", "/srv/a", "/tmp/x"),
    ("/srv/../dev/shm/x", "/home/u", "/dev/shm/x"),  # absolute, but node-local once '..' is resolved
    ("/tmp/x", "/home/u", None),  # node-local as written: the spec's own check says so
    ("runs", "/home/u", None),
])
def test_node_local_from(path: str, cwd: str, lands: str | None) -> None:
    assert node_local_from(path, cwd) == lands


def test_node_local_from_expands_the_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/tmp/home-on-a-node")
    assert node_local_from("~/runs", "/srv/p") == "/tmp/home-on-a-node/runs"
