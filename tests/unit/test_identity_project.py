"""A run's identity names the project it runs (``orchestrator.spec.identity.project_key``): two
projects with the same job name, args and runs_dir are two runs (never one continuing the other's
checkpoints); the same project resubmitted is the same run (from its folder here, and from the
login node's checkout of it with ``--remote``); the orchestrator's own jobs are no project; and a
run named before the project was part of the identity is still continued by its own project, and
only by it."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from orchestrator.core.records import home
from orchestrator.plan import plan
from orchestrator.remote.remote_checkout import update_checkout
from orchestrator.remote.remote_ship import project_name
from orchestrator.spec import identity
from orchestrator.spec.identity import identity_fields, project_key, run_id, sibling_warnings
from orchestrator.spec.loading import spec_from_dict


@contextlib.contextmanager
def inside(folder: Path) -> Iterator[None]:
    """This process in ``folder`` (where a spec's relative script must exist to validate)."""
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def make_spec(entrypoint: str = "train.py", runs_dir: str = "/shared/runs", at: Path | None = None, **extra: Any):
    """The spec, validated in ``at`` (a project holding its script); the id is then asked for any folder."""
    with inside(at or Path.cwd()):
        return spec_from_dict({"name": "job", "entrypoint": entrypoint, "args": {"lr": 0.1}, "nodes": 1,
                               "cpu_ranks_per_node": 2, "runs_dir": runs_dir, **extra})


def project(root: Path, files: dict[str, str] | None = None) -> Path:
    for rel, text in (files or {"train.py": "print(1)\n"}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def fields_only_id(spec, cwd: str) -> str:
    """The id this spec had before the project was part of the identity."""
    return identity._hashed(spec.name, {k: v for k, v in identity_fields(spec, cwd).items() if k != "project"})


def old_run(runs: Path, rid: str, source_dir: str, **code: str) -> Path:
    """A run folder as an earlier version left it: its payload names where it was submitted from."""
    folder = runs / rid
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "ckpt-0000000300.pt").write_bytes(b"x")
    payload = {"version": 5, "source_dir": source_dir, "code": code or None}
    (folder / "payload.json").write_text(json.dumps(payload))
    return folder


# ---- two projects, one name ---------------------------------------------------------------------
def test_two_projects_with_the_same_name_args_and_runs_dir_are_two_runs(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = project(tmp_path / "alice" / "proj"), project(tmp_path / "bob" / "proj")
    spec = make_spec(runs_dir=str(tmp_path / "runs"), at=a)
    assert run_id(spec, str(a)) != run_id(spec, str(b))
    monkeypatch.chdir(a)
    dir_a = plan(spec).run_dir
    monkeypatch.chdir(b)
    dir_b = plan(spec).run_dir
    assert dir_a != dir_b and Path(dir_a).parent == Path(dir_b).parent == tmp_path / "runs"


def test_two_projects_with_the_same_module_entrypoint_are_two_runs(tmp_path: Path) -> None:
    files = {"pkg/__init__.py": "", "pkg/train.py": "def main(): pass\n"}
    a, b = project(tmp_path / "a", files), project(tmp_path / "b", files)
    spec = make_spec("pkg.train:main")
    assert project_key("pkg.train:main", str(a)) == str(a.resolve())
    assert run_id(spec, str(a)) != run_id(spec, str(b))


# ---- the same project is the same run -----------------------------------------------------------
def test_the_same_project_resubmitted_is_the_same_run(tmp_path: Path) -> None:
    a = project(tmp_path / "proj")
    spec = make_spec(runs_dir=str(tmp_path / "runs"), at=a)
    longer = make_spec(runs_dir=str(tmp_path / "runs"), at=a, slurm={"time": "9:00:00"})
    assert run_id(spec, str(a)) == run_id(longer, str(a))  # an operational change: the same run
    # an absolute script is the same project from any folder
    absolute = make_spec(str(a / "train.py"), runs_dir=str(tmp_path / "runs"))
    assert run_id(absolute, str(tmp_path)) == run_id(absolute, str(a))
    # a folder reached through a link is the folder itself
    (tmp_path / "link").symlink_to(a)
    assert run_id(spec, str(tmp_path / "link")) == run_id(spec, str(a))


def test_the_orchestrators_own_jobs_are_no_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``jobs.train:main`` is the tool's, the same for everyone: its runs keep the ids they had."""
    root = Path(identity.__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    spec = make_spec("jobs.train:main")
    assert project_key("jobs.train:main") is None
    assert "project" not in identity_fields(spec) and run_id(spec) == fields_only_id(spec, str(root))


def test_a_laptops_project_through_remote_is_named_by_its_checkout(tmp_path: Path) -> None:
    """On the login node the project is the checkout ``remote_receive`` made of it: the same
    laptop project lands in the same checkout every time (its name hashes the client id and the
    path), another project in another."""
    blobs = tmp_path / "blobs"
    data = b"print(1)\n"
    sha = __import__("hashlib").sha256(data).hexdigest()
    (blobs / sha[:2]).mkdir(parents=True)
    (blobs / sha[:2] / sha).write_bytes(data)
    spec = make_spec(runs_dir=str(tmp_path / "runs"), at=project(tmp_path / "laptop"))

    def login_node_id(laptop_root: str, client: str) -> str:
        checkout = home() / "remote" / "projects" / project_name(laptop_root, client)
        update_checkout(checkout, {"train.py": [sha, len(data), "0o644"]}, blobs, None, "")
        return run_id(spec, str(checkout))

    first = login_node_id("/home/me/proj", "client-1")
    assert login_node_id("/home/me/proj", "client-1") == first  # resubmitted: continues its run
    assert login_node_id("/home/me/other/proj", "client-1") != first  # same folder name, another project
    assert login_node_id("/home/me/proj", "client-2") != first  # another laptop's project


# ---- runs named before the project was part of the identity ------------------------------------
def test_a_run_named_before_the_project_counted_is_continued_by_its_own_project(tmp_path: Path) -> None:
    a, b = project(tmp_path / "a"), project(tmp_path / "b")
    runs = tmp_path / "runs"
    spec = make_spec(runs_dir=str(runs), at=a)
    older = fields_only_id(spec, str(a))
    assert run_id(spec, str(a)) != older  # nothing there yet: the new name
    old_run(runs, older, str(a))
    assert run_id(spec, str(a)) == older  # its own project continues it
    assert run_id(spec, str(b)) not in (older, run_id(spec, str(a)))  # another project never does


def test_an_older_run_submitted_with_a_snapshot_is_told_by_its_live_project(tmp_path: Path) -> None:
    """With a snapshot, the payload's source folder is inside the snapshot's tree: moved back to
    the live project before it is compared."""
    a, b = project(tmp_path / "a"), project(tmp_path / "b")
    runs = tmp_path / "runs"
    spec = make_spec(runs_dir=str(runs), at=a)
    older = fields_only_id(spec, str(a))
    tree = str(runs / ".code" / "trees" / "abc-123" / "a")
    old_run(runs, older, tree, id="abc", live_root=str(a), tree=tree)
    assert run_id(spec, str(a)) == older
    assert run_id(spec, str(b)) != older


def test_an_older_run_whose_payload_cannot_tell_is_continued_as_before(tmp_path: Path) -> None:
    a = project(tmp_path / "a")
    runs = tmp_path / "runs"
    spec = make_spec(runs_dir=str(runs), at=a)
    older = fields_only_id(spec, str(a))
    folder = old_run(runs, older, str(a))
    (folder / "payload.json").write_text("{damaged")
    assert run_id(spec, str(a)) == older


def test_a_run_of_the_new_name_wins_over_an_older_one(tmp_path: Path) -> None:
    a = project(tmp_path / "a")
    runs = tmp_path / "runs"
    spec = make_spec(runs_dir=str(runs), at=a)
    named = run_id(spec, str(a))
    (runs / named).mkdir(parents=True)
    old_run(runs, fields_only_id(spec, str(a)), str(a))
    assert run_id(spec, str(a)) == named


def test_another_projects_runs_raise_no_sibling_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """plan's warning "run X holds checkpoints of this job name; this spec differs in ..." is about
    this project's own runs, never another project's of the same job name."""
    a, b = project(tmp_path / "a"), project(tmp_path / "b")
    runs = tmp_path / "runs"
    theirs = make_spec(runs_dir=str(runs), at=b, args={"lr": 0.5})
    folder = old_run(runs, run_id(theirs, str(b)), str(b))
    import yaml

    (folder / "spec.yaml").write_text(yaml.safe_dump(theirs.model_dump(mode="json")))
    monkeypatch.chdir(a)
    mine = make_spec(runs_dir=str(runs), at=a)
    assert sibling_warnings(mine, str(runs / run_id(mine))) == []
    monkeypatch.chdir(b)  # from b, it is b's own run with another lr
    assert "differs in args.lr" in sibling_warnings(mine, str(runs / run_id(mine)))[0]


def test_the_project_key_is_a_resolved_path_never_the_folder_name(tmp_path: Path) -> None:
    a = project(tmp_path / "x" / "proj")
    assert project_key("train.py", str(a)) == os.path.realpath(a / "train.py")
    assert project_key("nosuchmodule_xyz.train:main", str(a)) is None  # nothing found: the fields alone


def test_this_projects_run_of_another_entrypoint_still_raises_the_sibling_warning(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of this project whose spec named another script: the warning names the entrypoint."""
    import yaml

    a = project(tmp_path / "a", {"train.py": "", "train2.py": ""})
    runs = tmp_path / "runs"
    theirs = make_spec("train.py", runs_dir=str(runs), at=a)
    folder = old_run(runs, run_id(theirs, str(a)), str(a))
    (folder / "spec.yaml").write_text(yaml.safe_dump(theirs.model_dump(mode="json")))
    monkeypatch.chdir(a)
    mine = make_spec("train2.py", runs_dir=str(runs), at=a)
    warnings = sibling_warnings(mine, str(runs / run_id(mine)))
    assert len(warnings) == 1 and "differs in entrypoint" in warnings[0], warnings


def test_a_fifo_payload_in_an_old_run_folder_never_hangs_naming_the_run(tmp_path) -> None:
    import os
    import threading

    from orchestrator.spec.identity import submitted_from

    (tmp_path / "run").mkdir()
    os.mkfifo(tmp_path / "run" / "payload.json")
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(submitted_from(tmp_path / "run")), daemon=True)
    thread.start()
    thread.join(5)
    assert got == [None], "a FIFO payload.json hung run_id"
