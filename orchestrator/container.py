"""Containers (``container:``): the rank command wrapped for apptainer, pyxis or SLURM's OCI support.

Filled in by the containers work of issue 22.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from orchestrator.payload import ContainerSettings

if TYPE_CHECKING:
    from orchestrator.snapshot import Snapshot
    from orchestrator.spec import JobSpec


def container_settings(spec: JobSpec, run_dir: str, code: Optional[Snapshot]) -> Optional[ContainerSettings]:
    c = spec.container
    if c is None:
        return None
    return ContainerSettings(runtime=c.runtime, image=c.image, mounts=tuple(c.mounts), python=c.python,
                             options=tuple(c.options))
