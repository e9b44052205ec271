"""container: the rank command each runtime gets (apptainer and pyxis are not installed here, so
their argv is what is checked), the automatic mounts, the OCI run bundle, and the spec's rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.node import container
from orchestrator.core.errors import SpecError
from orchestrator.spec.loading import spec_from_dict
from orchestrator.plan import plan

PKG = os.path.dirname(os.path.dirname(os.path.abspath(container.__file__)))  # the package, above node/
JOBS = os.path.join(os.path.dirname(PKG), "jobs")


def _launch(tmp_path: Path, runtime: str, image: str, **extra: object):  # type: ignore[no-untyped-def]
    spec = spec_from_dict({"name": "ct", "entrypoint": "pkg.mod:main", "executor": "slurm", "nodes": 2,
                           "runs_dir": str(tmp_path / "runs"), "workdir": str(tmp_path / "work"),
                           "code": {"snapshot": False},
                           "container": {"runtime": runtime, "image": image, "mounts": ["/data:/data:ro"],
                                         "options": ["--opt"]}, **extra})
    return plan(spec)


def test_each_runtime_wraps_only_the_rank_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")  # where the CLI ran: the workdir's mount covers it
    head = ["--kill-on-bad-exit=1", "--cpus-per-task=<SLURM_CPUS_ON_NODE / 1>"]  # the agent resolves the rule
    launch = _launch(tmp_path, "apptainer", "/img/ddp.sif", cpu_ranks_per_node=1)
    run, payload = launch.run_dir, f"{launch.run_dir}/payload.json"
    mounts = f"{PKG}:/opt/orchestrator/orchestrator:ro,{JOBS}:/opt/orchestrator/jobs:ro,{tmp_path}/work:{tmp_path}/work,{run}:{run},/data:/data:ro"
    rank = ["python3", "-u", "-c", container.BOOTSTRAP, "orchestrator.backends.slurm.node.slurm_rank", payload]
    srun = list(launch.payload.srun or ())
    assert srun[srun.index(head[0]):] == [*head, "apptainer", "exec", "--bind", mounts, "--opt", "/img/ddp.sif", *rank]
    assert container.wrap(launch.payload.container, ["x"], gpus_per_node=2)[:3] == ["apptainer", "exec", "--nv"]
    assert srun[0] == "srun" and launch.payload.python == sys.executable  # the agent: the host's python

    launch = _launch(tmp_path, "pyxis", "nvcr.io#nvidia/pytorch:24.05-py3")
    assert launch.run_dir == run  # the container is not part of the run's identity
    srun = list(launch.payload.srun or ())
    assert srun[srun.index(head[0]):] == [*head, "--container-image=nvcr.io#nvidia/pytorch:24.05-py3",
                                          f"--container-mounts={mounts}", f"--container-workdir={tmp_path}/work",
                                          "--opt", *rank]

    launch = _launch(tmp_path, "oci", "/srv/bundle", cpu_ranks_per_node=1)
    srun = list(launch.payload.srun or ())
    assert srun[srun.index(head[0]):] == [*head, f"--container={run}/container/oci-bundle", "--opt",
                                          *rank[:4], "orchestrator.node.container", payload]
    # OCI images have their own /etc files: the node's name resolution is bound in.
    assert launch.payload.container.mounts[-3:] == ("/etc/hosts:/etc/hosts:ro", "/etc/resolv.conf:/etc/resolv.conf:ro",
                                                    "/data:/data:ro")
    lines = container.plan_lines(launch)
    assert "ranks run `python3 -m orchestrator.node.container" in lines[0] and "agent runs on the host" in lines[0]
    local = container.plan_lines(plan(spec_from_dict({**launch.spec.model_dump(mode="json"), "executor": "local"})))
    assert len(local) == 1 and "the ranks run on the host" in local[0], local


def test_mounts_bind_each_folder_once_parents_first() -> None:
    got = container._same_path_mounts([("/a/b", "ro"), ("/a", "rw"), ("/c/d", "rw"), ("/c", "ro"), ("/c", "rw"),
                                       ("/e/", "ro"), ("/e/f", "ro")])
    assert got == ["/a:/a", "/c:/c", "/e:/e:ro"]


def test_the_bootstrap_puts_the_package_mount_first(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text("import json, os, sys\n"
                                       "print(json.dumps([sys.path[0], os.environ['PYTHONPATH'], sys.argv[1:]]))\n")
    out = subprocess.run([sys.executable, "-c", container.BOOTSTRAP, "probe", "x"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=30, check=True)
    assert json.loads(out.stdout) == ["/opt/orchestrator", f"/opt/orchestrator{os.pathsep}{tmp_path}", ["x"]]


def test_the_oci_run_bundle_binds_the_image_rootfs_first(tmp_path: Path) -> None:
    image = tmp_path / "image"
    (image / "rootfs").mkdir(parents=True)
    (image / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}, "process": {"args": ["sh"]},
                                                   "mounts": [{"destination": "/proc", "type": "proc"}]}))
    launch = _launch(tmp_path, "oci", str(image), cpu_ranks_per_node=1)
    container.prepare(launch.payload)
    bundle = Path(launch.run_dir) / "container" / "oci-bundle"
    config = json.loads((bundle / "config.json").read_text())
    assert (bundle / "rootfs").is_dir() and config["root"]["path"] == "rootfs"  # SLURM 22.05 uses <bundle>/rootfs
    assert config["mounts"][0] == {"destination": "/", "type": "bind", "source": str(image / "rootfs"),
                                   "options": ["rbind", "rw"]}
    assert config["mounts"][1]["destination"] == "/proc"
    assert {"destination": "/data", "type": "bind", "source": "/data", "options": ["rbind", "ro"]} in config["mounts"]
    (image / "config.json").unlink()
    with pytest.raises(OSError, match="config.json does not exist"):
        container.prepare(launch.payload)


def test_oci_tasks_take_their_rank_from_the_node_list() -> None:
    env = {"SLURM_STEP_TASKS_PER_NODE": "1(x3)", "SLURM_STEP_NODELIST": "gpu[01-02],cpu7", "SLURM_PROCID": "0"}
    assert container.oci_task_identity(env, "gpu02.cluster")["SLURM_PROCID"] == "1"
    assert container.oci_task_identity(env, "cpu7")["SLURM_NODEID"] == "2"
    with pytest.raises(RuntimeError, match="not in the step's nodes"):
        container.oci_task_identity(env, "login")
    with pytest.raises(RuntimeError, match="one task per node"):
        container.oci_task_identity({**env, "SLURM_STEP_TASKS_PER_NODE": "2,1"}, "gpu01")


def test_the_spec_refuses_what_cannot_run(tmp_path: Path) -> None:
    base = {"name": "ct", "entrypoint": "m:f", "executor": "slurm", "runs_dir": str(tmp_path)}
    cases = [({"runtime": "oci", "image": "bundle"}, {}, "absolute path"),
             ({"runtime": "oci", "image": "/b"}, {"cpu_ranks_per_node": 2}, "one rank per node"),
             ({"runtime": "apptainer", "image": "img.sif"}, {}, "absolute path"),
             ({"runtime": "pyxis", "image": "x", "mounts": ["/a:/opt/orchestrator"]}, {}, "binds over"),
             ({"runtime": "apptainer", "image": "/i.sif", "options": ["--cleanenv"]}, {}, "SLURM_PROCID")]
    for section, extra, said in cases:
        with pytest.raises(SpecError, match=said):
            spec_from_dict({**base, **extra, "container": section})
    spec_from_dict({**base, "container": {"runtime": "apptainer", "image": "docker://pytorch/pytorch"}})


# ---- options the orchestrator sets itself, and paths that would split the mount list --------------
def _problems(tmp_path: Path, runtime: str, image: str, **section: object) -> list[str]:
    spec = {"name": "ct", "entrypoint": "m:f", "executor": "slurm", "runs_dir": str(tmp_path / "runs"),
            "workdir": str(tmp_path), "container": {"runtime": runtime, "image": image, **section}}
    try:
        spec_from_dict(spec)
    except SpecError as exc:
        return exc.problems
    return []


@pytest.mark.parametrize("runtime, image, options, reserved", [
    # pyxis: srun's options; the orchestrator's own flags in both forms, and abbreviated (getopt_long)
    ("pyxis", "img", ["--container-image=other"], "--container-image"),
    ("pyxis", "img", ["--container-image", "other"], "--container-image"),
    ("pyxis", "img", ["--container-mounts=/a:/a"], "--container-mounts"),
    ("pyxis", "img", ["--container-mounts", "/a:/a"], "--container-mounts"),
    ("pyxis", "img", ["--container-workdir=/w"], "--container-workdir"),
    ("pyxis", "img", ["--container-im=other"], "--container-image"),
    ("pyxis", "img", ["--container=/bundle"], "--container"),
    ("pyxis", "img", ["--output=/tmp/x.log"], "--output"),
    ("pyxis", "img", ["-o", "/tmp/x.log"], "--output"),
    ("pyxis", "img", ["--ntasks", "1"], "--ntasks"),
    ("pyxis", "img", ["-n1"], "--ntasks"),
    ("pyxis", "img", ["-lK0"], "--kill-on-bad-exit"),
    ("pyxis", "img", ["--kill-on-bad-exit=0"], "--kill-on-bad-exit"),
    ("oci", "/bundle", ["--container=/other"], "--container"),
    ("oci", "/bundle", ["--cpus-per-task=8"], "--cpus-per-task"),
    ("oci", "/bundle", ["--export=NONE"], "--export"),
    # apptainer: what clears the environment, long, short and in a group of short flags
    ("apptainer", "/i.sif", ["--cleanenv"], "--cleanenv"),
    ("apptainer", "/i.sif", ["--cleanenv=true"], "--cleanenv"),
    ("apptainer", "/i.sif", ["-e"], "--cleanenv"),
    ("apptainer", "/i.sif", ["-ce"], "--cleanenv"),
    ("apptainer", "/i.sif", ["--writable-tmpfs", "-wC"], "--containall"),
    ("apptainer", "/i.sif", ["--containall"], "--containall"),
])
def test_options_the_orchestrator_sets_are_refused_in_every_form(tmp_path: Path, runtime: str, image: str,
                                                                 options: list[str], reserved: str) -> None:
    found = [p for p in _problems(tmp_path, runtime, image, options=options) if p.startswith("container.options: ")]
    assert len(found) == 1, found
    assert reserved in found[0] and any(f"{o!r}" in found[0] for o in options), found
    assert found[0].endswith(" instead") or found[0].endswith("leave it out (the spec's env is set inside anyway)") \
        or found[0].endswith("; leave it out"), found


@pytest.mark.parametrize("runtime, image, options", [
    ("apptainer", "/i.sif", ["--bind", "/a:/a", "-B", "/b:/b", "--writable-tmpfs", "--nv", "-c", "--env", "A=-e"]),
    ("apptainer", "/i.sif", ["-B/x:/e", "-Hhome-e", "--no-home", "--pwd", "/w"]),  # a value holding 'e' is no flag
    ("pyxis", "img", ["--container-writable", "--container-remap-root", "--container-env=A,B", "--container-name=x",
                      "--no-container-mount-home", "--container-mount-home", "-l", "--mpi=pmix"]),
    ("oci", "/bundle", ["--label", "--mpi", "pmix"]),
])
def test_other_options_pass(tmp_path: Path, runtime: str, image: str, options: list[str]) -> None:
    assert not [p for p in _problems(tmp_path, runtime, image, options=options) if "container.options" in p]


def test_the_reserved_table_is_applied_per_runtime(tmp_path: Path) -> None:
    """An option is reserved for the runtime it goes to: -e is apptainer's --cleanenv but srun's
    --error; pyxis's flags mean nothing to apptainer exec (it would refuse them itself)."""
    assert "--error" in _problems(tmp_path, "pyxis", "img", options=["-e", "/x"])[0]
    assert "--cleanenv" in _problems(tmp_path, "apptainer", "/i.sif", options=["-e"])[0]
    for runtime, table in container.RESERVED_OPTIONS.items():
        for name, short, _ in table:
            for form in [[name, "x"], [f"{name}=x"], *([[short]] if short else [])]:
                assert container.reserved_options(runtime, form)[0][1] == name, (runtime, form)


@pytest.mark.parametrize("runtime", ["apptainer", "pyxis"])
def test_a_mount_holding_a_comma_is_refused(tmp_path: Path, runtime: str) -> None:
    image = "/i.sif" if runtime == "apptainer" else "img"
    found = _problems(tmp_path, runtime, image, mounts=["/data/a,b:/data"])
    assert any(p.startswith("container.mounts: '/data/a,b:/data' holds ','") for p in found), found
    assert any("'/data:/data,x'" in p for p in _problems(tmp_path, runtime, image, mounts=["/data:/data,x"]))
    assert not _problems(tmp_path, runtime, image, mounts=["/data:/data:ro", "/scratch:/scratch:rw"])


def test_oci_takes_a_comma_in_a_mount(tmp_path: Path) -> None:
    """The OCI bundle's config.json lists each mount apart: a ',' splits nothing there."""
    assert not _problems(tmp_path, "oci", "/bundle", mounts=["/data/a,b:/data"])


@pytest.mark.parametrize("field, char", [("runs_dir", ","), ("runs_dir", ":"), ("workdir", ","),
                                         ("checkpoint.dir", ":"), ("distributed.rendezvous_dir", ",")])
def test_a_folder_bound_at_its_host_path_must_not_split_the_mount_list(tmp_path: Path, field: str, char: str) -> None:
    spec: dict = {"name": "ct", "entrypoint": "m:f", "executor": "slurm", "runs_dir": str(tmp_path / "runs"),
                  "workdir": str(tmp_path / "work"), "container": {"runtime": "apptainer", "image": "/i.sif"}}
    path = str(tmp_path / f"a{char}b")  # not inside the workdir (that one is bound whole)
    section, _, last = field.rpartition(".")
    (spec.setdefault(section, {}) if section else spec)[last] = path
    with pytest.raises(SpecError) as info:
        spec_from_dict(spec)
    line = next(p for p in info.value.problems if p.startswith(f"{field}: "))
    assert repr(char) in line and "use one without ':' or ','" in line, line
    if char == ",":  # only apptainer's and pyxis's lists are split at ','
        spec_from_dict({**spec, "container": {"runtime": "oci", "image": "/bundle"}, "cpu_ranks_per_node": 1})


def test_the_folder_the_cli_runs_in_is_checked_when_it_is_bound(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    odd, work = tmp_path / "a,b", tmp_path / "work"
    odd.mkdir()
    work.mkdir()
    monkeypatch.chdir(odd)
    base = {"name": "ct", "entrypoint": "m:f", "executor": "slurm", "runs_dir": str(tmp_path / "runs"),
            "container": {"runtime": "pyxis", "image": "img"}}
    with pytest.raises(SpecError, match=r"workdir \(unset: the folder the CLI runs in\): .*holds ','"):
        spec_from_dict(base)
    with pytest.raises(SpecError, match=r"code.snapshot \(false: .*holds ','"):
        spec_from_dict({**base, "workdir": str(work), "code": {"snapshot": False}})
    # Bound inside a folder bound already (the workdir): the list never names it.
    spec_from_dict({**base, "workdir": str(tmp_path), "code": {"snapshot": False}})
    spec = spec_from_dict({**base, "workdir": str(work)})  # a snapshot: where the CLI runs is not bound
    spec_from_dict({**base, "executor": "local"})  # the local executor runs the ranks on the host
    # The plan's own check, for what validate cannot foresee (an installed module: no snapshot to bind).
    with pytest.raises(SpecError, match=r"container: the mount .*a,b.* holds ':' or ','"):
        plan(spec)
