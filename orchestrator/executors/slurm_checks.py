"""`validate --cluster`: check a spec against the live cluster before anything is queued.

Two scheduler queries (``scontrol show partition`` and ``scontrol show node``) plus the
config's MaxArraySize; with ``container:``, two one-task sruns on one node (the image and the
mounts' sources are there, and the image's python is >= 3.10: ``container.check_on_node``).
Problems are reported like spec errors (exit code 2), naming the field.

What sbatch 22.05 itself says for the mistakes checked here is no help: a GPU type the nodes lack
(or spelled in another case: types match case-sensitively), more GPUs than a node has, or an
``exclude`` that leaves too few nodes all give "Requested node configuration is not available";
a host in ``nodelist`` or ``exclude`` that does not exist, or a host in both, gives "Invalid node
name specified"; a ``nodelist`` of more hosts than ``nodes`` gives "invalid number of nodes
(-N 2-1)". Here each names the field, what the cluster has, and the fix.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field

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


# ---- GRES strings ------------------------------------------------------------------------------
_COUNT = re.compile(r"(\d+)([KMGTP]?)")
_SCALE = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


def _split_top(text: str) -> list[str]:
    """Split on the commas that are not inside parentheses ('gpu:a100:2(S:0,1),mps:100')."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item for item in items if item]


def gres_gpus(gres: str) -> dict[str | None, int]:
    """The GPUs of one node's GRES string (scontrol's ``Gres=``, sinfo's ``%G``), by type.

    'gpu:a100:2(S:0-1),gpu:v100:1' -> {'a100': 2, 'v100': 1}; 'gpu:2' -> {None: 2} (untyped);
    'gpu' alone counts 1, as in slurm.conf; '(null)' or '' -> {}. Other GRES (mps, shard, ...) and
    flags such as no_consume are ignored.
    """
    gpus: dict[str | None, int] = {}
    if not gres or gres == "(null)":
        return gpus
    for item in _split_top(gres.strip()):
        words = [w for w in re.sub(r"\(.*\)$", "", item).split(":") if w and w != "no_consume"]
        if not words or words[0] != "gpu":
            continue
        count, kind = 1, None
        rest = words[1:]
        if rest and _COUNT.fullmatch(rest[-1]):
            number, unit = _COUNT.fullmatch(rest[-1]).groups()  # type: ignore[union-attr]
            count = int(number) * _SCALE[unit]
            rest = rest[:-1]
        if rest:
            kind = rest[0]
        gpus[kind] = gpus.get(kind, 0) + count
    return gpus


# ---- host lists --------------------------------------------------------------------------------
_BRACKET = re.compile(r"([^\[\]]*)\[([^\[\]]*)\]")
MAX_HOSTS = 100_000  # more hosts than any job here may use (65,536 ranks); refused before expanding


def _range_values(body: str, text: str) -> list[str]:
    values: list[str] = []
    for part in body.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"{text!r}: {part!r} is not a number or a range lo-hi")
        lo, hi = m.group(1), m.group(2) if m.group(2) is not None else m.group(1)
        if int(lo) > int(hi):
            raise ValueError(f"{text!r}: the range {lo}-{hi} runs backwards")
        if int(hi) - int(lo) + 1 + len(values) > MAX_HOSTS:
            raise ValueError(f"{text!r} names more than {MAX_HOSTS} hosts")
        width = len(lo)  # SLURM pads to the width of the low end: n[01-10] -> n01..n10, n[2-03] -> n2, n3
        values.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return values


def expand_hostlist(text: str) -> list[str]:
    """Host names of a SLURM host list, in order, as ``scontrol show hostnames`` (22.05) gives them.

    'gpu[01-03,7],cpu1' -> gpu01 gpu02 gpu03 gpu7 cpu1. Brackets multiply ('n[1-2]x[3]' -> n1x3
    n2x3); text after the last bracket is refused, as SLURM refuses it ('n[1-2]a'). Empty items
    (a trailing comma) are skipped, as SLURM skips them.
    """
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    hosts: list[str] = []
    for item in filter(None, items):
        if "[" not in item and "]" not in item:
            hosts.append(item)
            continue
        pos, names = 0, [""]
        for m in _BRACKET.finditer(item):
            if m.start() != pos:
                break
            values = _range_values(m.group(2), text)
            if len(names) * len(values) + len(hosts) > MAX_HOSTS:
                raise ValueError(f"{text!r} names more than {MAX_HOSTS} hosts")
            names = [n + m.group(1) + v for n in names for v in values]
            pos = m.end()
        if pos != len(item):
            raise ValueError(f"{text!r} is not a SLURM host list ({item!r}: nothing may follow a range's "
                             "closing bracket, and brackets must pair)")
        hosts.extend(names)
    return hosts


def _shown(names: list[str], most: int = 8) -> str:
    return ", ".join(names[:most]) + (f", ... ({len(names)} in all)" if len(names) > most else "")


# ---- the check ---------------------------------------------------------------------------------
@dataclass
class Node:
    name: str
    partitions: list[str]
    gpus: dict[str | None, int] = field(default_factory=dict)


def _nodes(records: list[dict[str, str]]) -> list[Node]:
    return [Node(r["NodeName"], [p for p in r.get("Partitions", "").split(",") if p], gres_gpus(r.get("Gres", "")))
            for r in records if "NodeName" in r]


def _types_line(nodes: list[Node]) -> str:
    """'a100 (2 per node on 4 node(s)), v100 (...)', or 'untyped GPUs only' / 'no GPUs'."""
    by_type: dict[str, list[int]] = {}
    for n in nodes:
        for kind, count in n.gpus.items():
            if kind is not None:
                by_type.setdefault(kind, []).append(count)
    if not by_type:
        return "untyped GPUs only" if any(n.gpus for n in nodes) else "no GPUs"
    return ", ".join(f"{kind} (up to {max(c)} per node, on {len(c)} node(s))" for kind, c in sorted(by_type.items()))


def _hosts_problems(spec: JobSpec, nodes: list[Node], partition: str | None) -> tuple[list[str], set[str], set[str]]:
    """Problems with slurm.nodelist / slurm.exclude, and the two expanded sets."""
    problems: list[str] = []
    known = {n.name for n in nodes}
    sets: dict[str, set[str]] = {}
    for option in ("nodelist", "exclude"):
        text = getattr(spec.slurm, option)
        if not text:
            sets[option] = set()
            continue
        try:
            hosts = expand_hostlist(text)
        except ValueError as exc:
            problems.append(f"slurm.{option}: {exc}")
            sets[option] = set()
            continue
        sets[option] = set(hosts)
        unknown = [h for h in dict.fromkeys(hosts) if h not in known]
        if unknown:
            problems.append(f"slurm.{option}: {_shown(unknown)} {'is not a node' if len(unknown) == 1 else 'are not nodes'} "
                            f"of this cluster (sbatch would say 'Invalid node name specified'); nodes here: "
                            f"{_shown(sorted(known))}")
    wanted, excluded = sets["nodelist"], sets["exclude"]
    if wanted & excluded:
        problems.append(f"slurm.nodelist and slurm.exclude both name {_shown(sorted(wanted & excluded))}; "
                        "remove it from one of them")
    if len(wanted) > spec.nodes:
        problems.append(f"slurm.nodelist: names {len(wanted)} nodes but the job asks for nodes: {spec.nodes}; SLURM "
                        f"allocates every node of the list, so set nodes: {len(wanted)} or shorten the list")
    if partition is not None:
        outside = sorted(h for h in wanted & known if partition not in next(n for n in nodes if n.name == h).partitions)
        if outside:
            problems.append(f"slurm.nodelist: {_shown(outside)} not in partition {partition}; choose nodes of "
                            f"that partition or set slurm.partition to one that has them")
    return problems, wanted, excluded


def check_against_cluster(spec: JobSpec) -> None:
    problems: list[str] = []
    partitions = {p["PartitionName"]: p for p in _records(_scontrol("show", "partition", "-o"))}
    nodes = _nodes(_records(_scontrol("show", "node", "-o")))
    name = spec.slurm.partition or next((n for n, p in partitions.items() if p.get("Default") == "YES"), None)
    in_partition = name in partitions
    host_problems, wanted, excluded = _hosts_problems(spec, nodes, name if in_partition else None)
    problems += host_problems
    if not in_partition:
        problems.append(f"slurm.partition: {name!r} does not exist; partitions here: {', '.join(sorted(partitions))}")
    else:
        part = partitions[name]
        max_time = part.get("MaxTime", "UNLIMITED")
        if max_time not in ("UNLIMITED", "INFINITE") and spec.slurm.time_minutes > slurm_time_minutes(max_time):
            problems.append(f"slurm.time: {spec.slurm.time} exceeds partition {name}'s MaxTime {max_time}")
        members = [n for n in nodes if name in n.partitions]
        usable = [n for n in members if n.name not in excluded]
        if spec.nodes > len(members):
            problems.append(f"nodes: {spec.nodes} requested but partition {name} has {len(members)} node(s)")
        elif spec.nodes > len(usable):
            problems.append(f"slurm.exclude: leaves {len(usable)} of partition {name}'s {len(members)} node(s), "
                            f"fewer than nodes: {spec.nodes}; exclude fewer nodes or ask for fewer")
        gpu_type = spec.slurm.gpu_type
        if spec.gpus_per_node and gpu_type is None:
            most = max((sum(n.gpus.values()) for n in members), default=0)
            if spec.gpus_per_node > most:
                problems.append(f"gpus_per_node: {spec.gpus_per_node} requested but partition {name}'s nodes "
                                f"have at most {most} GPU(s)")
        elif spec.gpus_per_node and gpu_type is not None:
            problems += _gpu_type_problems(spec, gpu_type, name, members, usable, wanted)
    if spec.sweep:
        m = re.search(r"MaxArraySize\s*=\s*(\d+)", _scontrol("show", "config"))
        limit = int(m.group(1)) if m else 1001
        n = len(spec.sweep_points())
        if n > limit - 1:
            print(f"note: the sweep of {n} points will be split into {-(-n // (limit - 1))} arrays (MaxArraySize={limit})")
    if spec.container is not None and not problems:  # one srun on one node: worth it only for a job that fits
        from orchestrator.container import check_on_node

        problems += check_on_node(spec)
    if problems:
        raise SpecError(problems, source="cluster check")


def _gpu_type_problems(spec: JobSpec, gpu_type: str, partition: str, members: list[Node], usable: list[Node],
                       wanted: set[str]) -> list[str]:
    have = [n for n in members if gpu_type in n.gpus]
    if not have:
        types = sorted({k for n in members for k in n.gpus if k is not None})
        near = [t for t in types if t.lower() == gpu_type.lower()]
        hint = (f"did you mean slurm.gpu_type: {near[0]}? (SLURM matches GPU types case-sensitively)" if near
                else f"set slurm.gpu_type to one of {', '.join(types)}" if types
                else "remove slurm.gpu_type (these GPUs have no type)" if any(n.gpus for n in members)
                else "choose a partition with GPUs (slurm.partition)")
        return [(f"slurm.gpu_type: partition {partition} has no {gpu_type!r} GPUs; its nodes have "
                 f"{_types_line(members)}; {hint}")]
    most = max(n.gpus[gpu_type] for n in have)
    if spec.gpus_per_node > most:
        return [(f"gpus_per_node: {spec.gpus_per_node} {gpu_type} GPU(s) requested but partition {partition}'s "
                 f"nodes have at most {most} {gpu_type} GPU(s); ask for at most {most} per node")]
    fit = [n for n in usable if n.gpus.get(gpu_type, 0) >= spec.gpus_per_node]
    problems = []
    lacking = sorted(h for h in wanted if h in {n.name for n in members} and h not in {n.name for n in fit})
    if lacking:
        problems.append(f"slurm.nodelist: {_shown(lacking)} {'has' if len(lacking) == 1 else 'have'} fewer than "
                        f"{spec.gpus_per_node} {gpu_type} GPU(s); nodes that fit: {_shown([n.name for n in fit])}")
    if len(fit) < spec.nodes:
        problems.append(f"nodes: {spec.nodes} requested with {spec.gpus_per_node} {gpu_type} GPU(s) each, but only "
                        f"{len(fit)} node(s) of partition {partition} have them"
                        + (" once slurm.exclude is applied" if len(usable) < len(members) else "")
                        + f": {_shown([n.name for n in fit]) or 'none'}; ask for fewer nodes or GPUs")
    return problems
