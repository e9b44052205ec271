"""`validate --cluster`: check a spec against the live cluster before anything is queued.

Two scheduler queries (``scontrol show partition`` and ``scontrol show node``) plus the
config's MaxArraySize. Problems are reported like spec errors (exit code 2), naming the field.
"""

from __future__ import annotations

import re
import subprocess

from orchestrator.errors import SpecError, SubmissionError
from orchestrator.spec import JobSpec
from orchestrator.validators import slurm_time_minutes


def _scontrol(*args: str) -> str:
    try:
        out = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError as exc:
        raise SubmissionError("scontrol not found: run 'validate --cluster' on a SLURM login node") from exc
    if out.returncode != 0:
        raise SubmissionError(f"scontrol {' '.join(args)} failed: {out.stderr.strip()} (is SLURM_CONF set?)")
    return out.stdout


def _records(text: str) -> list[dict[str, str]]:
    return [dict(re.findall(r"(\w+)=(\S+)", line)) for line in text.splitlines() if line.strip()]


def _gpus(gres: str) -> int:
    m = re.search(r"gpu(?::[^:,(]+)?:(\d+)", gres or "")
    return int(m.group(1)) if m else 0


def check_against_cluster(spec: JobSpec) -> None:
    problems: list[str] = []
    partitions = {p["PartitionName"]: p for p in _records(_scontrol("show", "partition", "-o"))}
    nodes = _records(_scontrol("show", "node", "-o"))
    name = spec.slurm.partition or next((n for n, p in partitions.items() if p.get("Default") == "YES"), None)
    if name not in partitions:
        problems.append(f"slurm.partition: {name!r} does not exist; partitions here: {', '.join(sorted(partitions))}")
    else:
        part = partitions[name]
        max_time = part.get("MaxTime", "UNLIMITED")
        if max_time not in ("UNLIMITED", "INFINITE") and spec.slurm.time_minutes > slurm_time_minutes(max_time):
            problems.append(f"slurm.time: {spec.slurm.time} exceeds partition {name}'s MaxTime {max_time}")
        members = [n for n in nodes if name in n.get("Partitions", "").split(",")]
        if spec.nodes > len(members):
            problems.append(f"nodes: {spec.nodes} requested but partition {name} has {len(members)} node(s)")
        if spec.gpus_per_node:
            most = max((_gpus(n.get("Gres", "")) for n in members), default=0)
            if spec.gpus_per_node > most:
                problems.append(f"gpus_per_node: {spec.gpus_per_node} requested but partition {name}'s nodes "
                                f"have at most {most} GPU(s)")
    if spec.sweep:
        m = re.search(r"MaxArraySize\s*=\s*(\d+)", _scontrol("show", "config"))
        limit = int(m.group(1)) if m else 1001
        n = len(spec.sweep_points())
        if n > limit - 1:
            print(f"note: the sweep of {n} points will be split into {-(-n // (limit - 1))} arrays (MaxArraySize={limit})")
    if problems:
        raise SpecError(problems, source="cluster check")
