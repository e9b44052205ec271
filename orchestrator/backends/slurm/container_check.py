"""``validate --cluster`` for a spec with ``container:``: on one of the cluster's nodes, the
mounts' sources and the image exist (on the host), and the image's python runs and is >= 3.10
(inside, as the ranks will run). Two one-task sruns, through ``orchestrator.backends.slurm.node.slurm_controller``.
"""

from __future__ import annotations

import os
import shlex
from typing import TYPE_CHECKING

from orchestrator.node.container import package_source
from orchestrator.core.hostlist import expand

if TYPE_CHECKING:
    from orchestrator.core.views import SpecView

PYTHON_CHECK = "import sys; assert sys.version_info >= (3, 10), sys.version"


def node_check_argv(spec: SpecView) -> list[list[str]]:
    """Two one-task sruns on one node: the mounts' sources and the image exist there (on the
    host), then the image's python runs and is >= 3.10 (inside, as the ranks will run)."""
    c = spec.container
    assert c is not None
    s = spec.slurm
    base = ["srun", "--nodes=1", "--ntasks=1", "--time=5", "--job-name=orch-container-check",
            *([f"--partition={s.partition}"] if s.partition else []),
            *([f"--account={s.account}"] if s.account else []),
            *([f"--qos={s.qos}"] if s.qos else []), *([f"--nodelist={expand(s.nodelist)[0]}"] if s.nodelist else [])]
    sources = [item.split(":")[0] for item in c.mounts] + [package_source()]
    if c.runtime == "oci":
        sources += [os.path.join(c.image, "config.json")]
    elif "://" not in c.image and c.runtime == "apptainer":
        sources.append(c.image)
    script = 'for p in "$@"; do [ -e "$p" ] || echo "missing on $(hostname): $p"; done'
    exists = [*base, "sh", "-c", script, "sh", *sources]
    probe = [c.python, "-c", PYTHON_CHECK]
    if c.runtime == "apptainer":
        inside = [*base, "apptainer", "exec", *c.options, c.image, *probe]
    elif c.runtime == "pyxis":
        inside = [*base, f"--container-image={c.image}", *c.options, *probe]
    else:
        inside = [*base, f"--container={c.image}", *c.options, *probe]
    return [exists, inside]


def check_on_node(spec: SpecView, timeout_s: float = 300) -> list[str]:
    """Problems with the container on one of the cluster's nodes (``validate --cluster``)."""
    from orchestrator.backends.slurm.node.slurm_controller import run as run_slurm

    if spec.container is None:
        return []
    exists, inside = node_check_argv(spec)
    out: list[str] = []
    r = run_slurm(exists, timeout_s)
    if r.returncode is None:
        return [f"container: could not run srun to check the image on a node ({r.error})"]
    missing = [line for line in r.stdout.splitlines() if line.startswith("missing on")]
    if r.returncode != 0:
        out.append(f"container: srun on one node failed ({r.stderr.strip()[-300:]})")
    out += [f"container: {line} (container.image or container.mounts: every node must see it)" for line in missing]
    if out:
        return out
    r = run_slurm(inside, timeout_s)
    if r.returncode is None:
        return [f"container: could not run the image's python on a node ({r.error})"]
    if r.returncode != 0:
        said = (r.stderr.strip() or r.stdout.strip())[-400:]
        out.append(f"container: `{shlex.join(inside[inside.index(spec.container.python):])}` inside "
                   f"{spec.container.image} failed on a node ({said}); the ranks need container.python to name a "
                   "Python >= 3.10 in the image")
    return out
