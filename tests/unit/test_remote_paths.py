"""``--remote`` sends the cluster's paths: '~' in every path field stays as written on the laptop
and means the login user's home on the cluster (``spec.HOME_PATH_FIELDS``, the one list), while a
local spec keeps expanding it here; and a relative runs_dir that would land under the login
user's home is refused there, naming the field and the fix (``runs_in_home_problem``)."""

from __future__ import annotations

import json
import os
import types
from pathlib import Path
from typing import Any, Iterator, Union, get_args, get_origin

import pytest
from pydantic import BaseModel

from orchestrator.core.errors import SpecError, UsageError
from orchestrator.spec.loading import load_spec, spec_from_dict
from orchestrator.plan import plan
from orchestrator.remote.remote_receive import runs_in_home_problem
from orchestrator.spec.models import HOME_PATH_FIELDS, JobSpec

# runs_dir shared-looking: a SLURM plan refuses the default 'runs' from a checkout in /tmp.
BASE: dict[str, Any] = {"name": "paths", "entrypoint": "jobs.train:main", "executor": "slurm", "runs_dir": "/shared/runs"}
PROBE = "~/orch-probe"
#: A home that is no node-local prefix (validate refuses /tmp paths for SLURM runs); never created.
FAKE_HOME = "/srv/orch-probe-home"


def _nested(dotted: str, value: Any) -> dict[str, Any]:
    out: Any = value
    for part in reversed(dotted.split(".")):
        out = {part: out}
    return out


def _with(dotted: str, value: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(BASE))
    if dotted.startswith("container."):  # a container needs its runtime and image to be one
        data["container"] = {"runtime": "pyxis", "image": "nvcr.io#nvidia/pytorch:24.05-py3"}
    node = data
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return data


def _get(data: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        data = data[part]
    return data


def _text_fields(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every field of the spec that holds one string (nested models walked), by dotted name."""
    for name, info in model.model_fields.items():
        dotted = f"{prefix}{info.alias or name}"
        kinds = get_args(info.annotation) if get_origin(info.annotation) in (Union, types.UnionType) else \
            (info.annotation,)
        models = [k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)]
        if models:
            yield from _text_fields(models[0], dotted + ".")
        elif str in kinds:
            yield dotted


def test_every_field_where_tilde_means_home_is_in_the_one_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each text field of the spec given '~/orch-probe': where the validated spec or its plan shows
    the home's path for it, the field means a place on the machine the job runs on, so it must be
    in HOME_PATH_FIELDS (else --remote would ship the laptop's home for it). A field that refuses
    '~' or keeps it as text in the plan too is no such field."""
    monkeypatch.setenv("HOME", FAKE_HOME)
    expanded = os.path.join(FAKE_HOME, "orch-probe")
    meaning_home = set()
    fields = list(_text_fields(JobSpec))
    assert {"name", "entrypoint", "runs_dir", "checkpoint.dir", "slurm.python", "container.image"} <= set(fields)
    for dotted in fields:
        try:
            spec = spec_from_dict(_with(dotted, PROBE))
        except SpecError:
            continue  # '~' refused there (slurm.python, entrypoint, names...)
        shown = json.dumps(spec.model_dump(mode="json")) + plan(spec).model_dump_json()
        if expanded in shown:
            meaning_home.add(dotted)
    assert meaning_home == set(HOME_PATH_FIELDS)


@pytest.mark.parametrize("dotted", HOME_PATH_FIELDS)
def test_a_path_field_keeps_its_tilde_for_another_machine_and_expands_it_here(
        dotted: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", FAKE_HOME)
    kept = spec_from_dict(_with(dotted, "~/ckpt/x"), home_elsewhere=True)
    sent = kept.model_dump(mode="json", exclude_defaults=True)
    assert _get(sent, dotted) == "~/ckpt/x"
    assert FAKE_HOME not in json.dumps(sent)
    # the login node validates what it received: '~' is its own user's home there
    monkeypatch.setenv("HOME", "/srv/login-user-home")
    there = plan(spec_from_dict(sent))
    assert "/srv/login-user-home/ckpt/x" in there.model_dump_json() and FAKE_HOME not in there.model_dump_json()
    # locally nothing changes: '~' is this machine's home, as before
    monkeypatch.setenv("HOME", FAKE_HOME)
    here = plan(spec_from_dict(_with(dotted, "~/ckpt/x")))
    assert f"{FAKE_HOME}/ckpt/x" in here.model_dump_json()


def test_another_users_tilde_is_left_to_the_cluster_that_knows_its_users() -> None:
    data = _with("checkpoint.dir", "~no-such-user-here/ckpt")
    with pytest.raises(SpecError, match="names no user on this machine"):
        spec_from_dict(data)
    assert spec_from_dict(data, home_elsewhere=True).checkpoint.dir == "~no-such-user-here/ckpt"


def test_a_workdir_is_not_looked_for_on_the_laptop_when_it_is_the_clusters(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(SpecError, match="exists and is not a folder"):
        spec_from_dict(_with("workdir", str(a_file)))
    assert spec_from_dict(_with("workdir", str(a_file)), home_elsewhere=True).workdir == str(a_file)


def test_the_shipped_header_keeps_tilde_in_the_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``--remote submit`` sends: the spec loaded for the cluster, '~' as the user wrote it."""
    from orchestrator.remote import RemoteSettings, shipment

    monkeypatch.setenv("ORCHESTRATOR_CONFIG", str(tmp_path / "cfg" / "config.yaml"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("print(1)\n")
    (project / "spec.yaml").write_text("name: t\nentrypoint: train.py\ncheckpoint: {dir: ~/ckpt/x}\n"
                                       "workdir: ~/work\nruns_dir: /scratch/me/runs\n")
    monkeypatch.chdir(project)
    spec = load_spec("spec.yaml", executor="slurm", home_elsewhere=True)
    header, _ = shipment(spec, RemoteSettings(host="login"))
    assert header["spec"]["checkpoint"]["dir"] == "~/ckpt/x" and header["spec"]["workdir"] == "~/work"
    assert str(Path.home()) not in json.dumps(header["spec"])


def test_a_project_reached_through_a_link_ships_from_the_folder_the_user_is_in(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """macOS's /tmp and /var are links to /private/...: a project (and an absolute entrypoint)
    spelled through a link is the folder the user is in (os.getcwd() names it resolved), not
    'outside the project'; the entrypoint keeps its own name."""
    from orchestrator.remote import RemoteSettings, project_name, shipment

    monkeypatch.setenv("ORCHESTRATOR_CONFIG", str(tmp_path / "cfg" / "config.yaml"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    project = tmp_path / "private" / "proj"
    (project / "conf").mkdir(parents=True)
    (project / "train.py").write_text("print(1)\n")
    (tmp_path / "tmp").symlink_to(tmp_path / "private")
    linked = tmp_path / "tmp" / "proj"
    (project / "conf" / "spec.yaml").write_text(f"name: t\nentrypoint: {linked / 'train.py'}\nruns_dir: /scratch/runs\n")
    monkeypatch.chdir(linked / "conf")
    spec = load_spec(str(linked / "conf" / "spec.yaml"), executor="slurm", home_elsewhere=True)
    header, sources = shipment(spec, RemoteSettings(host="login", client_id="mac"))
    assert header["cwd"] == "conf" and header["spec"]["entrypoint"] == "../train.py", header
    assert header["project"] == project_name(str(project), "mac") and sorted(header["files"]) == ["conf/spec.yaml",
                                                                                                  "train.py"]
    assert all(path.startswith(str(project)) for path in sources.values())


# ---- a relative runs_dir under the login user's home -------------------------------------------------
HOME = "/home/alice"
CHECKOUT = Path(HOME) / ".local/share/orchestrator/remote/projects/proj-1234abcd"


def test_the_default_relative_runs_dir_under_home_is_refused_naming_the_field_and_the_fix() -> None:
    problem = runs_in_home_problem({"name": "x"}, CHECKOUT, HOME, {})
    assert problem is not None and problem.startswith("runs_dir: 'runs' is relative")
    assert str(CHECKOUT / "runs") in problem and "neither $SCRATCH nor $WORK" in problem
    assert "remote.allow_runs_in_home: true" in problem and "runs_dir: ~/runs" in problem
    assert "\n" not in problem


def test_the_refusal_suggests_the_sites_scratch_and_work() -> None:
    problem = runs_in_home_problem({"runs_dir": "out/runs"}, CHECKOUT, HOME,
                                   {"SCRATCH": "/scratch/alice", "WORK": "/work/proj7/alice", "HOME": HOME})
    assert problem is not None
    assert "$SCRATCH is /scratch/alice, $WORK is /work/proj7/alice here" in problem
    assert "--set runs_dir=/scratch/alice/orchestrator-runs" in problem
    only_work = runs_in_home_problem({}, CHECKOUT, HOME, {"WORK": "/work/alice", "SCRATCH": "relative/not-a-path"})
    assert only_work is not None and "--set runs_dir=/work/alice/orchestrator-runs" in only_work
    assert "relative/not-a-path" not in only_work


def test_a_relative_checkpoint_dir_under_home_is_refused_too() -> None:
    problem = runs_in_home_problem({"runs_dir": "/scratch/alice/runs", "checkpoint": {"dir": "ckpt"}}, CHECKOUT,
                                   HOME, {"SCRATCH": "/scratch/alice"})
    assert problem is not None and problem.startswith("checkpoint.dir: 'ckpt' is relative")
    assert "--set checkpoint.dir=/scratch/alice/checkpoints" in problem


@pytest.mark.parametrize("spec", [
    {"runs_dir": "/scratch/alice/runs"},                          # absolute: the user's choice
    {"runs_dir": "~/runs"},                                       # '~' written on purpose
    {"runs_dir": "~/runs", "checkpoint": {"dir": "~/ckpt"}},
    {"runs_dir": "/home/alice/runs"},                             # absolute, even in the home
    {"runs_dir": 7},                                              # not text: the spec's validation says so
])
def test_paths_written_on_purpose_are_never_refused(spec: dict) -> None:
    assert runs_in_home_problem(spec, CHECKOUT, HOME, {}) is None


def test_a_checkout_outside_the_home_takes_a_relative_runs_dir(tmp_path: Path) -> None:
    """ORCHESTRATOR_HOME on the site's scratch: the checkout, and runs beside it, are not in the home."""
    assert runs_in_home_problem({}, Path("/scratch/alice/orch/remote/projects/p-1"), HOME, {}) is None
    # a home reached through a link is the same home
    real = tmp_path / "gpfs" / "alice"
    real.mkdir(parents=True)
    (tmp_path / "home").symlink_to(real)
    assert runs_in_home_problem({}, real / "proj", str(tmp_path / "home"), {}) is not None
    assert runs_in_home_problem({"runs_dir": "../../../elsewhere"}, real / "a" / "b", str(real), {}) is None


def test_the_setting_is_read_from_the_config_and_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.remote import load_settings

    config = tmp_path / "config.yaml"
    monkeypatch.setenv("ORCHESTRATOR_CONFIG", str(config))
    config.write_text("remote:\n  host: login\n")
    assert load_settings().allow_runs_in_home is False
    config.write_text("remote:\n  host: login\n  allow_runs_in_home: true\n")
    assert load_settings().allow_runs_in_home is True
    config.write_text("remote:\n  host: login\n  allow_runs_in_home: yes\n")  # YAML 1.2: the text 'yes'
    with pytest.raises(UsageError, match=r"remote\.allow_runs_in_home: give true or false"):
        load_settings()
