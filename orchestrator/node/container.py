"""Containers (``container:``): every rank runs inside a container; the job's agent stays on the host.

The agent (``orchestrator.backends.slurm.node.slurm_job``) needs srun and scontrol, so only the rank command it runs
is wrapped. Inside the image the rank entry needs only a Python >= 3.10 and this package, which
is bound in read-only at ``PACKAGE_DST`` (never the host's site-packages: the image's own torch
must win) and put first on ``sys.path`` and ``PYTHONPATH`` by the rank's bootstrap (no ``env``
binary needed in the image). The job's folders are bound at their host paths (the payload names
them), so nothing in the payload is rewritten:

- apptainer: ``srun ... apptainer exec [--nv] --bind SRC:DST[:ro],... [options] IMAGE python ...``
- pyxis: ``srun ... --container-image=IMAGE --container-mounts=... --container-workdir=W [options]
  python ...`` (NVIDIA/pyxis's srun options; enroot images)
- oci: ``srun ... --container=RUN/container/oci-bundle [options] python ...`` (SLURM's own OCI
  support, oci.conf next to slurm.conf, runc or crun). SLURM takes mounts only from the bundle's
  config.json (and uses ``<bundle>/rootfs`` as the root), so the agent writes a bundle of its
  own in the run folder (``prepare``): the image's config.json, the image's rootfs bound at ``/``
  first, then the mounts.

The job's variables reach the ranks as on the host: the agent exports them to srun, apptainer and
pyxis pass the environment through, and SLURM's OCI support writes the step's environment into
the container's config. This module is imported by the agent, so it is standard library only.
"""

from __future__ import annotations

import json
import os
import shlex
from typing import TYPE_CHECKING, Any, Optional, Sequence

from orchestrator.core.payload import ContainerSettings, Payload, is_script

if TYPE_CHECKING:
    from orchestrator.code.snapshot import Snapshot
    # spec.py calls ``problems`` and plan.py imports this module: both are read through their views.
    from orchestrator.core.views import LaunchView, SpecView

#: Where this package's folder is bound inside the image (``PACKAGE_DST/orchestrator``).
PACKAGE_DST = "/opt/orchestrator"
#: The bundle the agent writes for SLURM's OCI support, inside the run folder.
OCI_BUNDLE = "container/oci-bundle"

#: Like ``interpreter.BOOTSTRAP``, with this package's mount first on sys.path and on PYTHONPATH
#: (for interpreters the rank starts itself). Double quotes only, so shlex shows one word.
BOOTSTRAP = ('import os, sys; sys.path[:1] == [""] and sys.path.pop(0); sys.path.insert(0, "' + PACKAGE_DST + '"); '
             'os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, ["' + PACKAGE_DST + '", '
             'os.environ.get("PYTHONPATH")])); '
             'import runpy; runpy.run_module(sys.argv.pop(1), run_name="__main__")')


def package_source() -> str:
    """The host folder of the installed ``orchestrator`` package (the folder above this file's)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- settings ------------------------------------------------------------------------------
def _same_path_folders(paths: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (path, mode) pairs to bind, parents first; a path inside one already bound read-write,
    or bound the same way, is left out (binding it again would change nothing)."""
    out: list[tuple[str, str]] = []
    for path, mode in sorted({(os.path.normpath(p), m) for p, m in paths},
                             key=lambda pm: (pm[0].count("/"), pm[0], pm[1] != "rw")):
        if any((path == q or path.startswith(q.rstrip("/") + "/")) and m in ("rw", mode) for q, m in out):
            continue
        out.append((path, mode))
    return out


def _same_path_mounts(paths: Sequence[tuple[str, str]]) -> list[str]:
    """``SRC:SRC[:ro]`` for each folder ``_same_path_folders`` keeps."""
    return [f"{p}:{p}" + (":ro" if m == "ro" else "") for p, m in _same_path_folders(paths)]


def _bound_folders(spec: SpecView, run_dir: str, store_dir: Optional[str]) -> list[tuple[str, str, str]]:
    """(the field that names it, path, mode) for each host folder the ranks need at its host path:
    the run folder, the workdir, the rendezvous and checkpoint folders when the spec puts them
    elsewhere, and the code snapshot store (``store_dir``), or without one the live files."""
    workdir = os.path.abspath(spec.workdir) if spec.workdir else os.getcwd()
    paths = [("runs_dir", run_dir, "rw"),
             ("workdir" if spec.workdir else "workdir (unset: the folder the CLI runs in)", workdir, "rw")]
    if spec.distributed.rendezvous_dir:
        paths.append(("distributed.rendezvous_dir", os.path.abspath(spec.distributed.rendezvous_dir), "rw"))
    if spec.checkpoint.dir:
        paths.append(("checkpoint.dir", os.path.abspath(spec.checkpoint.dir), "rw"))
    if store_dir is not None:
        paths.append(("runs_dir", store_dir, "ro"))
    else:  # the live files: where the CLI ran (the payload's source_dir) and the script's folder
        paths.append(("code.snapshot (false: the folder the CLI runs in is bound)", os.getcwd(), "ro"))
        if is_script(spec.entrypoint):
            paths.append(("entrypoint", os.path.dirname(os.path.abspath(spec.entrypoint)), "ro"))
    return paths


def automatic_mounts(spec: SpecView, run_dir: str, code: Optional[Snapshot]) -> list[str]:
    """What every rank needs inside: this package (read-only, at PACKAGE_DST), and at their host
    paths the run folder, the code snapshot store (read-only), the workdir, and the rendezvous and
    checkpoint folders when the spec puts them elsewhere; where the CLI ran and the entrypoint
    script's folder when the ranks read the live files (no snapshot)."""
    paths = [(path, mode) for _, path, mode in _bound_folders(spec, run_dir, code.store_dir if code else None)]
    # apptainer and enroot (pyxis) bind the node's name resolution in by themselves; an OCI
    # bundle's rootfs has its own (often empty) files, and ranks must resolve the master's name.
    resolve = ["/etc/hosts:/etc/hosts:ro", "/etc/resolv.conf:/etc/resolv.conf:ro"] \
        if spec.container is not None and spec.container.runtime == "oci" else []
    # The rank API (jobs/) ships in the same distribution, next to this package: scripts that use
    # it (jobs.MetricsWriter, jobs.train) find it inside an image that has no orchestrator of its own.
    jobs = os.path.join(os.path.dirname(package_source()), "jobs")
    ours = [f"{package_source()}:{PACKAGE_DST}/orchestrator:ro"] + \
        ([f"{jobs}:{PACKAGE_DST}/jobs:ro"] if os.path.isfile(os.path.join(jobs, "__init__.py")) else [])
    return [*ours, *_same_path_mounts(paths), *resolve]


def container_settings(spec: SpecView, run_dir: str, code: Optional[Snapshot]) -> Optional[ContainerSettings]:
    """The spec's ``container`` section with the automatic mounts before the user's own."""
    c = spec.container
    if c is None:
        return None
    return ContainerSettings(runtime=c.runtime, image=c.image, mounts=(*automatic_mounts(spec, run_dir, code),
                                                                       *c.mounts),
                             python=c.python, options=tuple(c.options))


# ---- options and paths the runtime must not be given -------------------------------------------
_CLEARS_ENV = ("clears the environment inside, and each rank finds its place from SLURM's variables (SLURM_PROCID...); "
               "leave it out (the spec's env is set inside anyway)")
_RANK_LOGS = ("sends the ranks' output away from their log files (<run>/slurm/...), which status, logs and the failure "
              "verdict read; leave it out")
#: srun's options that the agent's rank step sets itself or takes from the job's shape (pyxis and
#: oci options are srun's own): (long name, short name, why and the fix).
_SRUN_RESERVED = (
    ("--output", "-o", _RANK_LOGS),
    ("--error", "-e", _RANK_LOGS),
    ("--kill-on-bad-exit", "-K", "is set by the orchestrator (a failed rank ends the step, so none waits forever); "
                                 "leave it out"),
    ("--cpus-per-task", "-c", "is set by the orchestrator from the spec; set slurm.cpus_per_task instead"),
    ("--export", None, "decides which of the job's variables reach the ranks (NONE drops them all: the spec's env, "
                       "the rank contract's); set variables in the spec's env instead"),
    ("--nodes", "-N", "sets the job's shape, which comes from the spec; set nodes instead"),
    ("--ntasks", "-n", "sets the job's shape, which comes from the spec; set nodes and gpus_per_node (or "
                       "cpu_ranks_per_node) instead"),
    ("--ntasks-per-node", None, "sets the job's shape, which comes from the spec; set gpus_per_node (or "
                                "cpu_ranks_per_node) instead"),
)
#: Per runtime, the options that override the orchestrator's own flags or undo what the ranks need,
#: refused in container.options in every form: ``--opt value``, ``--opt=value``, a short ``-x``, and
#: a short one inside a group (``-ec``); for srun also an abbreviation (``--container-im=x``).
RESERVED_OPTIONS: dict[str, tuple[tuple[str, Optional[str], str], ...]] = {
    "apptainer": (
        ("--cleanenv", "-e", _CLEARS_ENV),
        ("--containall", "-C", _CLEARS_ENV),
    ),
    "pyxis": (
        ("--container-image", None, "is set by the orchestrator from container.image; set container.image instead"),
        ("--container-mounts", None, "is set by the orchestrator (the run folder, the code snapshot and the "
                                     "orchestrator's package; a second one would replace them); list your binds in "
                                     "container.mounts instead"),
        ("--container-workdir", None, "is set by the orchestrator to the job's workdir; set workdir instead"),
        ("--container", None, "is SLURM's own OCI support, not pyxis; use container.runtime: oci instead"),
        *_SRUN_RESERVED,
    ),
    "oci": (
        ("--container", None, "is set by the orchestrator to the run's own bundle, built from container.image; set "
                              "container.image to your bundle folder instead"),
        *_SRUN_RESERVED,
    ),
}
#: Short options that take a value: in a group (``-wB/a:/a``) the rest of the word is that value.
_SHORT_WITH_VALUE = {"apptainer": "BHoSW", "pyxis": "ABcCdDegGiIJKLmMnNopPrStTwWx",
                     "oci": "ABcCdDegGiIJKLmMnNopPrStTwWx"}
#: srun reads an unambiguous prefix of a long option as that option (getopt_long); apptainer does not.
_TAKES_PREFIXES = {"apptainer": False, "pyxis": True, "oci": True}
#: What separates the mounts in the runtime's own list (one argument), besides ':' inside each one.
_MOUNT_LIST = {"apptainer": "apptainer's --bind list", "pyxis": "pyxis's --container-mounts list", "oci": ""}


def reserved_options(runtime: str, options: Sequence[str]) -> list[tuple[str, str, str]]:
    """(the option as written, the reserved option it gives, why and the fix) for each item of
    ``options`` that gives one of ``RESERVED_OPTIONS[runtime]``."""
    table = RESERVED_OPTIONS.get(runtime, ())
    longs = {name: why for name, _, why in table}
    shorts = {short: (name, why) for name, short, why in table if short}
    found: list[tuple[str, str, str]] = []
    for item in options:
        if item.startswith("--"):
            name = item.split("=", 1)[0]
            if name in longs:
                found.append((item, name, longs[name]))
            elif _TAKES_PREFIXES.get(runtime) and len(name) > 2:
                covered = [long for long in longs if long.startswith(name)]
                if covered:  # srun takes a unique prefix as the option (an ambiguous one it refuses)
                    found.append((item, covered[0], longs[covered[0]]))
        elif item.startswith("-") and len(item) > 1:
            for letter in item[1:]:
                if f"-{letter}" in shorts:
                    name, why = shorts[f"-{letter}"]
                    found.append((item, name, why))
                    break
                if letter in _SHORT_WITH_VALUE.get(runtime, ""):
                    break  # the rest of the word is this option's value
    return found


def mount_path_problem(path: str, runtime: str) -> Optional[str]:
    """Why a host path cannot be bound at its own path: ':' splits SRC:DST[:ro], and ',' splits
    apptainer's and pyxis's mount list (one argument). None when it can."""
    bad = [ch for ch in (":", ",") if ch in path and (ch == ":" or _MOUNT_LIST.get(runtime))]
    if not bad:
        return None
    where = " and ".join(["SRC:DST[:ro]" if ch == ":" else _MOUNT_LIST[runtime] for ch in bad])
    return f"{path!r} holds {' and '.join(repr(ch) for ch in bad)}, which splits {where}"


def problems(spec: SpecView) -> list[str]:
    """Spec-level rules (``spec.cross_field_problems``); each says which field to change."""
    c = spec.container
    if c is None:
        return []
    out: list[str] = []
    for item in c.mounts:
        dst = item.split(":")[1]
        if dst == PACKAGE_DST or dst.startswith(PACKAGE_DST + "/"):
            out.append(f"container.mounts: {item!r} binds over {PACKAGE_DST}, where the orchestrator's own package "
                       "is bound; choose another destination")
        if "," in item and _MOUNT_LIST[c.runtime]:
            out.append(f"container.mounts: {item!r} holds ',', which separates the mounts in {_MOUNT_LIST[c.runtime]}, "
                       "so the container would bind the wrong folders; bind a folder whose path has no ','")
    if spec.runs_on.scheduled:  # where the container is used: the folders bound at their host paths
        runs = os.path.abspath(os.path.expanduser(spec.runs_dir))  # the run folder's ':' or ',' would be here
        folders = _bound_folders(spec, runs, os.path.join(runs, ".code") if spec.code.snapshot else None)
        bound = {p for p, _ in _same_path_folders([(p, m) for _, p, m in folders])}  # none inside another one
        said: set[str] = set()
        for field, path, _ in [*((f, p, m) for f, p, m in folders if os.path.normpath(p) in bound),
                               ("the orchestrator's installed package", package_source(), "ro")]:
            why = mount_path_problem(path, c.runtime)
            if why and field not in said and path not in said:
                said |= {field, path}
                out.append(f"{field}: {why}, and the container binds this folder at its host path; use one "
                           "without ':' or ','")
    for written, name, why in reserved_options(c.runtime, c.options):
        given = written.split("=", 1)[0]
        if given == name:
            out.append(f"container.options: {written!r}: {name} {why}")
        elif given.startswith("--"):
            out.append(f"container.options: {written!r}: srun reads this abbreviation as {name}, which {why}")
        else:
            out.append(f"container.options: {written!r} gives {name}, which {why}")
    if c.runtime == "oci" and not c.image.startswith("/"):
        out.append(f"container.image: {c.image!r}: SLURM's OCI support takes a bundle folder (config.json and "
                   "rootfs/) by its absolute path, readable on every node")
    if c.runtime == "oci" and spec.ranks_per_node > 1:
        out.append(f"container.runtime: oci runs one rank per node (SLURM 22.05's OCI support starts one container "
                   f"task per node, without its rank), but the job has {spec.ranks_per_node} per node; use "
                   "cpu_ranks_per_node/gpus_per_node of 1, or runtime apptainer or pyxis")
    if c.runtime == "apptainer" and "://" not in c.image and not c.image.startswith("/"):
        out.append(f"container.image: {c.image!r}: give the .sif file's absolute path (every node reads it), or a "
                   "docker:// / oras:// URI")
    return out


# ---- the rank command ----------------------------------------------------------------------
def rank_argv(settings: ContainerSettings, payload_path: str) -> list[str]:
    """The image's interpreter running the SLURM rank entry, this package first on its path."""
    entry = "orchestrator.node.container" if settings.runtime == "oci" else "orchestrator.backends.slurm.node.slurm_rank"
    return [settings.python, "-u", "-c", BOOTSTRAP, entry, payload_path]


def wrap(settings: ContainerSettings, argv: list[str], gpus_per_node: int = 0) -> list[str]:
    """The rank command as srun starts it: ``apptainer exec`` around it, or as it is (pyxis and
    oci put the task itself inside through srun's options)."""
    if settings.runtime != "apptainer":
        return list(argv)
    return ["apptainer", "exec", *(["--nv"] if gpus_per_node > 0 else []), "--bind", ",".join(settings.mounts),
            *settings.options, settings.image, *argv]


def srun_tail(settings: ContainerSettings, run_dir: str, workdir: str, payload_path: str,
              gpus_per_node: int = 0) -> list[str]:
    """Everything after srun's own resource options: the runtime's options (pyxis, oci; apptainer
    needs none), then the rank command."""
    _check_mount_list(settings)
    own: list[str] = []
    if settings.runtime == "pyxis":
        own = [f"--container-image={settings.image}", f"--container-mounts={','.join(settings.mounts)}",
               f"--container-workdir={workdir}", *settings.options]
    elif settings.runtime == "oci":
        own = [f"--container={os.path.join(run_dir, OCI_BUNDLE)}", *settings.options]
    return [*own, *wrap(settings, rank_argv(settings, payload_path), gpus_per_node)]


def _check_mount_list(settings: ContainerSettings) -> None:
    """The plan's last word on the mounts (``problems`` names the fields first): each one must read
    back as the SRC:DST[:ro] it was made from, and the runtime's list must split into exactly them."""
    for item in settings.mounts:
        parts = item.split(":")
        if len(parts) in (2, 3) and (len(parts) == 2 or parts[2] in ("ro", "rw")) \
                and not ("," in item and _MOUNT_LIST.get(settings.runtime)):
            continue
        from orchestrator.core.errors import SpecError

        raise SpecError([f"container: the mount {item!r} cannot be given to {settings.runtime}: a folder the ranks need "
                         "at its host path holds ':' or ',', which separate mounts; run from (and use) folders "
                         "without them"])


# ---- OCI: the run's own bundle -------------------------------------------------------------
def oci_config(image: str, mounts: Sequence[str]) -> dict[str, Any]:
    """The image bundle's config.json for the run's own bundle. SLURM 22.05 points ``root.path`` at
    ``<bundle>/rootfs`` whatever config.json says, and runc refuses a rootfs that is a symlink, so
    the run's bundle has an empty rootfs/ and the image's rootfs is bound over it as the first
    mount (runc mounts in order: /proc, /dev and the rest land on top of it), then the mounts."""
    path = os.path.join(image, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except FileNotFoundError:
        raise OSError(f"container.image: {path} does not exist on {os.uname().nodename}: the OCI bundle must be a "
                      "folder with config.json and rootfs/ that every node reads (runc spec makes a config.json)"
                      ) from None
    except (OSError, ValueError) as exc:
        raise OSError(f"container.image: cannot read {path}: {exc}") from None
    if not isinstance(config, dict):
        raise OSError(f"container.image: {path} is not a JSON object")
    root = config.setdefault("root", {})
    rootfs = os.path.join(image, root.get("path") or "rootfs")
    root["path"] = "rootfs"
    added = [{"destination": "/", "type": "bind", "source": rootfs, "options": ["rbind", "rw"]},
             *list(config.get("mounts") or [])]
    for item in mounts:
        src, dst, *mode = item.split(":")
        added.append({"destination": dst, "type": "bind", "source": src,
                      "options": ["rbind", "ro" if mode == ["ro"] else "rw"]})
    config["mounts"] = added
    return config


def prepare(payload: Payload) -> None:
    """Before srun (the agent, on the host): write the run's OCI bundle, with this run's mounts.
    Written whole and renamed into place, so array tasks writing it at once all read a whole one."""
    c = payload.container
    if c is None or c.runtime != "oci" or not payload.srun:
        return
    bundle = _bundle(payload.srun)
    if bundle is None:
        return
    from orchestrator.core.atomic_files import write_json_atomic

    config = oci_config(c.image, c.mounts)
    os.makedirs(os.path.join(bundle, "rootfs"), exist_ok=True)
    write_json_atomic(os.path.join(bundle, "config.json"), config)
    os.chmod(os.path.join(bundle, "config.json"), 0o644)


def _bundle(srun: Sequence[str]) -> Optional[str]:
    """The bundle folder srun's ``--container=`` names (the run's own: ``srun_tail``)."""
    return next((a.split("=", 1)[1] for a in srun if a.startswith("--container=")), None)


# ---- the plan's lines ----------------------------------------------------------------------
_WHAT = {"apptainer": "apptainer image", "pyxis": "pyxis image", "oci": "OCI bundle"}


def plan_lines(launch: LaunchView | Payload) -> list[str]:
    """What ``orchestrator plan`` says about the container (``launch``: a LaunchPlan or its Payload):
    the image, the command each rank runs inside, the mounts, and that the agent stays on the host
    (or that a local run does not use it)."""
    payload = launch if isinstance(launch, Payload) else launch.payload
    c = payload.container
    if c is None:
        return []
    what = f"container: {c.runtime} ({_WHAT.get(c.runtime, 'image')} {c.image})"
    if not payload.srun:
        return [f"{what} is not used by this executor: the ranks run on the host with {payload.python}; the "
                "container is used on SLURM (--executor slurm)"]
    inside = shlex.join([c.python, "-m", rank_argv(c, "")[4], *payload.srun[-1:]])
    lines = [f"{what}: ranks run `{inside}` inside; the job's agent runs on the host (srun, scontrol)"]
    if c.runtime == "oci":
        lines.append(f"container: the agent writes {_bundle(payload.srun) or ''}/config.json at each start: "
                     f"{c.image}/config.json, with {c.image}/rootfs bound at / and then the mounts below")
    lines.append("container mounts: " + ", ".join(c.mounts))
    lines.append(f"container: {PACKAGE_DST} (this orchestrator's package) goes first on the ranks' sys.path; "
                 "the job's env reaches the ranks inside")
    return lines


# ---- inside an OCI container: the task's own identity --------------------------------------
def _hosts(text: str) -> list[str]:
    """A SLURM host list ('node[1-3,7],gpu01') as names, in order (``orchestrator.core.hostlist``,
    standard library only: the rank has no scontrol inside the image)."""
    from orchestrator.core.hostlist import expand

    return expand(text) if text else []


def oci_task_identity(environ: dict[str, str], hostname: str) -> dict[str, str]:
    """SLURM 22.05 writes the step's environment into an OCI container, not the task's: no
    SLURM_PROCID, SLURM_LOCALID or SLURM_NODEID of its own (those present are the batch step's,
    which the agent's srun passed on: 0 on every node), and it runs one task per node. So each
    task is its node's only one, and its rank is its node's place in the step's node list."""
    per_node = environ.get("SLURM_STEP_TASKS_PER_NODE", "1")
    if any(part.split("(")[0] != "1" for part in per_node.split(",")):
        raise RuntimeError(f"SLURM's OCI containers run one task per node here (SLURM_STEP_TASKS_PER_NODE="
                           f"{per_node}); use cpu_ranks_per_node/gpus_per_node of 1, or container.runtime apptainer "
                           "or pyxis")
    hosts = _hosts(environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", ""))
    short = hostname.split(".")[0]
    if short not in hosts:
        raise RuntimeError(f"this container's host name {hostname!r} is not in the step's nodes {hosts}: the OCI "
                           "bundle must share the node's UTS namespace (no 'uts' in linux.namespaces)")
    node = str(hosts.index(short))
    return {"SLURM_PROCID": node, "SLURM_NODEID": node, "SLURM_LOCALID": "0", "SLURMD_NODENAME": short}


def main(args: list[str]) -> int:
    """``python -m orchestrator.node.container PAYLOAD [...]``: the OCI rank entry; the task's identity
    first (``oci_task_identity``), then ``orchestrator.backends.slurm.node.slurm_rank`` as on the host."""
    import runpy
    import socket
    import sys

    try:
        os.environ.update(oci_task_identity(dict(os.environ), socket.gethostname()))
    except RuntimeError as exc:
        print(f"[launcher] {exc}", file=sys.stderr, flush=True)
        return 1
    sys.argv = [sys.argv[0], *args]
    runpy.run_module("orchestrator.backends.slurm.node.slurm_rank", run_name="__main__")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
