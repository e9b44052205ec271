"""`validate --cluster`: check a spec against the live cluster before anything is queued.

Three scheduler queries (``scontrol show partition``, ``show node`` and ``show config``); with
``container:``, two one-task sruns on one node (the image and the
mounts' sources are there, and the image's python is >= 3.10: ``container_check.check_on_node``).
Problems are reported like spec errors (exit code 2), naming the field.

What sbatch 22.05 itself says for the mistakes checked here is no help: a GPU type the nodes lack
(or spelled in another case: types match case-sensitively), more GPUs than a node has, or an
``exclude`` that leaves too few nodes all give "Requested node configuration is not available";
a host in ``nodelist`` or ``exclude`` that does not exist, or a host in both, gives "Invalid node
name specified"; a ``nodelist`` of more hosts than ``nodes`` gives "invalid number of nodes
(-N 2-1)". Here each names the field, what the cluster has, and the fix.

A partition list (``slurm.partition: gpu,gpu-preempt``) is checked as slurmctld checks it: every
name must exist, and the job must fit one of them (all of them under EnforcePartLimits=ALL);
one that cannot run it is a warning that says why. The CPUs each GPU rank will get come from the
spec, the site's defaults (DefCpuPerGPU) and the nodes, as plan's "CPUs:" line describes them;
one CPU per GPU rank is a warning that says what to set. The parsing and the decisions are pure
functions of scontrol's text (``parse_*``, ``partition_*``, ``rank_cpus``, ``cpu_warnings``);
only ``check_against_cluster`` runs scontrol.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from typing import Mapping

from orchestrator.core.errors import SpecError
from orchestrator.core.hostlist import MAX_HOSTS  # noqa: F401  (re-exported)
from orchestrator.core.hostlist import expand as expand_hostlist
from orchestrator.backends.slurm.node.slurm_controller import scontrol_text
from orchestrator.backends.slurm.node.slurm_task import DEFAULT_MAX_ARRAY_SIZE
from orchestrator.backends.slurm.slurm_env import env_problems
from orchestrator.spec.models import JobSpec, allocated_nodes
from orchestrator.spec.validators import printable, slurm_time_minutes


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
        rest, count = words[1:], 1
        if rest and (counted := _COUNT.fullmatch(rest[-1])):
            count, rest = int(counted[1]) * _SCALE[counted[2]], rest[:-1]
        kind = rest[0] if rest else None
        gpus[kind] = gpus.get(kind, 0) + count
    return gpus


# ---- host lists: orchestrator.core.hostlist (expand_hostlist, MAX_HOSTS are its names, kept here for callers) --


def _shown(names: list[str], most: int = 8) -> str:
    return ", ".join(names[:most]) + (f", ... ({len(names)} in all)" if len(names) > most else "")


# ---- nodes and partitions, as scontrol shows them ----------------------------------------------
@dataclass
class Node:
    name: str
    partitions: list[str]
    gpus: dict[str | None, int] = field(default_factory=dict)
    cpus: int = 0  # CPUTot: what an exclusive job gets on the node


def parse_nodes(text: str) -> list[Node]:
    """``scontrol show node -o`` -> its nodes: name, partitions, GPUs by type, CPUs."""
    return [Node(r["NodeName"], [p for p in r.get("Partitions", "").split(",") if p], gres_gpus(r.get("Gres", "")),
                 _count(r.get("CPUTot")) or 0)
            for r in _records(text) if "NodeName" in r]


def _count(text: str | None) -> int | None:
    """A whole number as scontrol prints one, or None for UNLIMITED, (null), N/A and the like."""
    return int(text) if text and text.isascii() and text.isdigit() else None


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


def allocation_words(spec: JobSpec) -> str:
    """How the job's node count reads in a message: 'nodes: 2', or 'nodes: 2 + recovery.spares: 1'."""
    spares = spec.recovery.spares
    return f"nodes: {spec.nodes}" + (f" + recovery.spares: {spares} ({allocated_nodes(spec)} nodes)" if spares else "")


def _hosts_problems(spec: JobSpec, nodes: list[Node]) -> tuple[list[str], set[str], set[str]]:
    """Problems with slurm.nodelist / slurm.exclude, and the two expanded sets."""
    problems: list[str] = []
    known = {n.name for n in nodes}
    sets: dict[str, set[str]] = {}
    for option in ("nodelist", "exclude"):
        text, sets[option] = getattr(spec.slurm, option), set()
        try:
            hosts = expand_hostlist(text) if text else []
        except ValueError as exc:
            problems.append(f"slurm.{option}: {exc}")
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
    if len(wanted) > allocated_nodes(spec):
        problems.append(f"slurm.nodelist: names {len(wanted)} nodes but the job asks for {allocation_words(spec)}; SLURM "
                        f"allocates every node of the list, so set nodes: {len(wanted)} or shorten the list")
    return problems, wanted, excluded


def job_defaults(text: str | None) -> dict[str, int]:
    """The JobDefaults scontrol shows, for the cluster (``show config``) and for each partition
    (``show partition``): 'DefCpuPerGPU=2,DefMemPerGPU=4096' -> {'DefCpuPerGPU': 2, 'DefMemPerGPU': 4096};
    '(null)' (none set) or '' -> {}. slurm.conf's DefCpuPerGPU and DefMemPerGPU appear only here."""
    found: dict[str, int] = {}
    for item in (text or "").split(","):
        key, _, value = item.strip().partition("=")
        number = _count(value)
        if key and number is not None:
            found[key] = number
    return found


@dataclass(frozen=True)
class ClusterConfig:
    """What ``scontrol show config`` says that the check needs."""

    def_cpu_per_gpu: int | None = None  # JobDefaults=DefCpuPerGPU=N: the cluster-wide CPUs per GPU
    enforce_part_limits: str = "NO"  # ALL: sbatch refuses a partition list if any one of them refuses the job
    max_array_size: int = DEFAULT_MAX_ARRAY_SIZE


def parse_config(text: str) -> ClusterConfig:
    """``scontrol show config`` ('Key = value' lines; the first of a repeated key: plugins' own
    sections follow the main one) -> ClusterConfig. Missing keys keep SLURM's defaults."""
    values: dict[str, str] = {}
    for key, value in re.findall(r"^(\w+)\s*=\s*(.*?)\s*$", text, re.M):
        values.setdefault(key, value)
    enforce = values.get("EnforcePartLimits", "NO").upper()
    return ClusterConfig(def_cpu_per_gpu=job_defaults(values.get("JobDefaults")).get("DefCpuPerGPU"),
                         enforce_part_limits=enforce if enforce in ("ALL", "ANY", "NO") else "NO",
                         max_array_size=_count(values.get("MaxArraySize")) or DEFAULT_MAX_ARRAY_SIZE)


@dataclass(frozen=True)
class Partition:
    """One record of ``scontrol show partition -o``, the fields the check reads."""

    name: str
    default: bool = False
    max_time: str = "UNLIMITED"
    max_nodes: int | None = None  # None: UNLIMITED
    min_nodes: int = 0
    def_cpu_per_gpu: int | None = None  # its own DefCpuPerGPU, which wins over the cluster's
    whole_nodes: bool = False  # OverSubscribe=EXCLUSIVE: every job gets its nodes, and their CPUs, whole


def parse_partitions(text: str) -> dict[str, Partition]:
    """``scontrol show partition -o`` -> {name: Partition}, in the order scontrol lists them."""
    return {r["PartitionName"]: Partition(
        name=r["PartitionName"], default=r.get("Default") == "YES", max_time=r.get("MaxTime", "UNLIMITED"),
        max_nodes=_count(r.get("MaxNodes")), min_nodes=_count(r.get("MinNodes")) or 0,
        def_cpu_per_gpu=job_defaults(r.get("JobDefaults")).get("DefCpuPerGPU"),
        whole_nodes=r.get("OverSubscribe", "").upper() == "EXCLUSIVE") for r in _records(text) if "PartitionName" in r}


def requested_partitions(spec: JobSpec, partitions: dict[str, Partition],
                         environ: Mapping[str, str]) -> tuple[list[str], str]:
    """(the partitions the job asks for, the setting that names them), as sbatch decides it: the
    spec's slurm.partition (a list: 'gpu,gpu-preempt'); without it SBATCH_PARTITION, which sbatch
    reads when the script names none (``executors.slurm_env.submission_env``); else the cluster's
    default partition. An empty list: none of the three."""
    if spec.slurm.partition:
        return [p for p in spec.slurm.partition.split(",") if p], "slurm.partition"
    if environ.get("SBATCH_PARTITION", "").strip():
        return [p.strip() for p in environ["SBATCH_PARTITION"].split(",") if p.strip()], "SBATCH_PARTITION"
    return [p.name for p in partitions.values() if p.default][:1], "the default partition"


@dataclass(frozen=True)
class Reason:
    """Why one partition cannot run the job. ``limit``: one of the partition's limits (time, node
    counts, the nodes it has), which EnforcePartLimits=ALL turns into a refusal of the whole list;
    otherwise the nodes' configuration (GPUs, what slurm.exclude leaves)."""

    text: str
    limit: bool


def partition_reasons(spec: JobSpec, part: Partition, nodes: list[Node], wanted: set[str],
                      excluded: set[str]) -> list[Reason]:
    """Every reason partition ``part`` cannot run the job; none: it can."""
    name, reasons = part.name, []
    if part.max_time not in ("UNLIMITED", "INFINITE") and spec.slurm.time_minutes > slurm_time_minutes(part.max_time):
        reasons.append(Reason(f"slurm.time: {spec.slurm.time} exceeds partition {name}'s MaxTime {part.max_time}",
                              True))
    members = [n for n in nodes if name in n.partitions]
    usable = [n for n in members if n.name not in excluded]
    outside = sorted(h for h in wanted if h in {n.name for n in nodes} and h not in {n.name for n in members})
    if outside:
        reasons.append(Reason(f"slurm.nodelist: {_shown(outside)} not in partition {name}; choose nodes of that "
                              f"partition or set slurm.partition to one that has them", True))
    asked, asking = allocated_nodes(spec), allocation_words(spec)
    if asked > len(members):
        reasons.append(Reason(f"{asking} requested but partition {name} has {len(members)} node(s)", True))
    elif part.max_nodes is not None and asked > part.max_nodes:
        reasons.append(Reason(f"{asking} requested but partition {name} allows at most {part.max_nodes} "
                              f"per job (MaxNodes); ask for fewer nodes or choose another partition", True))
    elif asked < part.min_nodes:
        reasons.append(Reason(f"{asking} requested but partition {name} takes jobs of at least "
                              f"{part.min_nodes} node(s) (MinNodes); ask for more or choose another partition", True))
    elif asked > len(usable):
        reasons.append(Reason(f"slurm.exclude: leaves {len(usable)} of partition {name}'s {len(members)} node(s), "
                              f"fewer than {asking}; exclude fewer nodes or ask for fewer", False))
    gpu_type = spec.slurm.gpu_type
    if spec.gpus_per_node and gpu_type is None:
        most = max((sum(n.gpus.values()) for n in members), default=0)
        if spec.gpus_per_node > most:
            reasons.append(Reason(f"gpus_per_node: {spec.gpus_per_node} requested but partition {name}'s nodes "
                                  f"have at most {most} GPU(s)", False))
    elif spec.gpus_per_node and gpu_type is not None:
        reasons += [Reason(text, False) for text in _gpu_type_problems(spec, gpu_type, name, members, usable, wanted)]
    return reasons


def partition_verdict(names: list[str], origin: str, partitions: dict[str, Partition], reasons: dict[str, list[Reason]],
                      config: ClusterConfig) -> tuple[list[str], list[str], list[str]]:
    """(problems, warnings, the partitions that can run the job) for the requested ``names``
    (``origin``: the setting that names them, ``requested_partitions``), from each existing one's
    ``reasons`` (``partition_reasons``). As slurmctld decides a list: a name that does not exist
    refuses the whole submission ('invalid partition specified'); otherwise the job is taken if
    one partition can run it, except that under EnforcePartLimits=ALL a limit that any one of them
    breaks refuses it. A partition of the list that cannot run the job is a warning naming it and
    why: the job still runs, but never there."""
    here = ", ".join(partitions) or "none"
    if not names:
        return [f"slurm.partition: this cluster has no default partition; set slurm.partition to one of {here}"], [], []
    unique = list(dict.fromkeys(names))
    where = " (from SBATCH_PARTITION in your environment)" if origin == "SBATCH_PARTITION" else ""
    listed = (f" (sbatch refuses the whole list '{printable(','.join(names))}' for it: 'invalid partition specified')"
              if len(unique) > 1 else "")
    missing = [f"slurm.partition: {n!r}{where} does not exist{listed}; partitions here: {here}"
               for n in unique if n not in partitions]
    if missing:
        return missing, [], []
    fit = [n for n in unique if not reasons.get(n)]
    if not fit:
        return [r.text for n in unique for r in reasons.get(n, [])], [], []
    if config.enforce_part_limits == "ALL":
        refused = [f"{r.text} (this cluster refuses a partition list if any of them refuses the job, "
                   f"EnforcePartLimits=ALL: remove {n} from {origin})"
                   for n in unique for r in reasons.get(n, []) if r.limit]
        if refused:
            return refused, [], fit
    warnings = [f"{origin}: partition {n} cannot run this job, so SLURM will start it in {', '.join(fit)} only: "
                + "; ".join(r.text for r in reasons[n]) for n in unique if reasons.get(n)]
    return [], warnings, fit


# ---- CPUs per GPU rank ---------------------------------------------------------------------------
@dataclass(frozen=True)
class CpuGrant:
    """The CPUs each rank gets in one partition, and why: what SLURM grants a node (the spec's
    request, else the site's defaults), shared by the job's agent among the node's ranks
    (``rank_env.cpu_share``), or the spec's slurm.cpus_per_task for each rank."""

    per_rank: int
    why: str


def _whole_nodes(spec: JobSpec, part: Partition, environ: Mapping[str, str]) -> str | None:
    """Why the job gets its nodes whole (all their CPUs), or None. SBATCH_EXCLUSIVE=user or mcs
    only keeps other users off the nodes: the job still gets what it asks for."""
    if spec.slurm.exclusive:
        return "slurm.exclusive"
    if "SBATCH_EXCLUSIVE" in environ and environ["SBATCH_EXCLUSIVE"].strip().lower() not in ("user", "mcs"):
        return "SBATCH_EXCLUSIVE in your environment"
    return f"partition {part.name}'s OverSubscribe=EXCLUSIVE" if part.whole_nodes else None


def rank_cpus(spec: JobSpec, part: Partition, config: ClusterConfig, members: list[Node],
              environ: Mapping[str, str]) -> CpuGrant:
    """The CPUs each rank of a GPU job gets in partition ``part``, as SLURM and the job's agent
    decide them (plan's "CPUs:" line says the same before the numbers are known):

    1. slurm.cpus_per_task: that many per rank (strategy dp: times the node's GPUs), for sbatch
       and the ranks' srun (``slurm_plan.srun_cpus_per_task``);
    2. whole nodes (slurm.exclusive, SBATCH_EXCLUSIVE, an OverSubscribe=EXCLUSIVE partition): the
       smallest member node's CPUs, shared by its ranks;
    3. CPUs per GPU (slurm.cpus_per_gpu, else SBATCH_CPUS_PER_GPU, which sbatch reads when the
       script asks for no CPU count; else the partition's DefCpuPerGPU, else the cluster's): that
       times the node's GPUs, shared by its ranks;
    4. none of these: SLURM's minimum, one CPU per task (a whole core, with its hardware threads,
       where the cluster allocates cores).

    ``members``: the partition's nodes (for 2)."""
    from orchestrator.backends.slurm.slurm_plan import srun_cpus_per_task  # the plan's own rule; plan imports much validate needs not

    s, gpus, rpn = spec.slurm, spec.gpus_per_node, max(1, spec.ranks_per_node)
    if s.cpus_per_task is not None:
        per_rank = int(srun_cpus_per_task(spec))
        return CpuGrant(per_rank, f"slurm.cpus_per_task: {s.cpus_per_task} gives each rank {per_rank}")
    whole, smallest = _whole_nodes(spec, part, environ), _smallest_fit(spec, members)
    if whole is not None and smallest:
        return CpuGrant(max(1, smallest // rpn), f"{whole} gives the job whole nodes (the smallest with "
                                                 f"{gpus} GPU(s) has {smallest} CPUs), shared by {rpn} rank(s)")
    env_cpg = _count(environ.get("SBATCH_CPUS_PER_GPU", "").strip())
    for value, source in ((s.cpus_per_gpu, "slurm.cpus_per_gpu"),
                          (env_cpg, "SBATCH_CPUS_PER_GPU in your environment"),
                          (part.def_cpu_per_gpu, f"partition {part.name}'s DefCpuPerGPU"),
                          (config.def_cpu_per_gpu, "the cluster's DefCpuPerGPU")):
        if value:
            return CpuGrant(max(1, value * gpus // rpn), f"{source}={value} gives a node {value * gpus} CPUs for its "
                                                         f"{gpus} GPU(s), shared by {rpn} rank(s)")
    return CpuGrant(1, "the job asks for no CPU count (no slurm.cpus_per_task or slurm.cpus_per_gpu) and neither "
                       "the partition nor the cluster sets DefCpuPerGPU, so SLURM gives each rank its minimum, one "
                       "CPU (a whole core where the cluster allocates cores)")


def _smallest_fit(spec: JobSpec, members: list[Node]) -> int:
    """The CPUs of the smallest of ``members`` that has the job's GPUs (0: none, or none says)."""
    return min((n.cpus for n in members if n.cpus and sum(n.gpus.values()) >= spec.gpus_per_node), default=0)


def _cpu_fix(spec: JobSpec, members: list[Node]) -> str:
    """What to set, with the most that fits the smallest of ``members`` that has the job's GPUs."""
    smallest = _smallest_fit(spec, members)

    def up_to(most: int) -> str:
        return (f" (up to {most}: the smallest node with {spec.gpus_per_node} GPU(s) has {smallest} CPUs)"
                if most > 1 else "")

    per_gpu, per_rank = smallest // spec.gpus_per_node, smallest // max(1, spec.ranks_per_node)
    if spec.slurm.cpus_per_task is not None:
        return f"raise slurm.cpus_per_task{up_to(per_rank)}"
    if spec.slurm.cpus_per_gpu is not None:
        return f"raise slurm.cpus_per_gpu{up_to(per_gpu)}"
    return f"set slurm.cpus_per_gpu{up_to(per_gpu)} or slurm.cpus_per_task (CPUs for each rank)"


def cpu_warnings(spec: JobSpec, usable: list[Partition], config: ClusterConfig, nodes: list[Node],
                 environ: Mapping[str, str]) -> list[str]:
    """A warning for each partition the job can run in where a GPU rank would get one CPU: its
    DataLoader workers, its threads (OMP_NUM_THREADS=1) and the GPU's feeding share that one.
    Not a refusal: the job runs, slowly. Partitions with the same reason share one line."""
    if not spec.gpus_per_node:
        return []
    starved: dict[str, list[Partition]] = {}
    for part in usable:
        grant = rank_cpus(spec, part, config, [n for n in nodes if part.name in n.partitions], environ)
        if grant.per_rank <= 1:
            starved.setdefault(grant.why, []).append(part)
    lines = []
    for why, parts in starved.items():
        members = [n for n in nodes if any(p.name in n.partitions for p in parts)]
        where = f"partition {parts[0].name}" if len(parts) == 1 else f"partitions {', '.join(p.name for p in parts)}"
        lines.append(f"CPUs: each GPU rank would get 1 CPU in {where}: {why}; its DataLoader workers and threads "
                     f"would share it: {_cpu_fix(spec, members)}")
    return lines


# ---- the check ---------------------------------------------------------------------------------
def cluster_findings(spec: JobSpec, partitions: dict[str, Partition], nodes: list[Node], config: ClusterConfig,
                     environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(problems, warnings) of ``spec`` on the cluster scontrol described (``parse_partitions``,
    ``parse_nodes``, ``parse_config``), with ``environ`` the environment sbatch will read."""
    problems, wanted, excluded = _hosts_problems(spec, nodes)
    names, origin = requested_partitions(spec, partitions, environ)
    reasons = {n: partition_reasons(spec, partitions[n], nodes, wanted, excluded) for n in names if n in partitions}
    part_problems, warnings, fit = partition_verdict(names, origin, partitions, reasons, config)
    return problems + part_problems, warnings + cpu_warnings(spec, [partitions[n] for n in fit], config, nodes, environ)


def check_against_cluster(spec: JobSpec, environ: Mapping[str, str] | None = None) -> list[str]:
    """Check ``spec`` against the cluster SLURM_CONF names; raise SpecError with every problem.

    Returns the warnings, also printed on stderr as 'warning: ...' (validate's only output
    besides its verdict): what does not stop the job but that the user would change, such as a
    partition of a list that cannot run it, or GPU ranks with one CPU each. ``environ``: the
    environment sbatch will read (SBATCH_PARTITION, SBATCH_CPUS_PER_GPU, SBATCH_EXCLUSIVE; and
    the variables submit refuses, ``slurm_env.env_problems``, are problems here too); default
    os.environ. A relative runs_dir or checkpoint.dir is checked as resolved from this folder, as
    ``plan`` and ``submit`` resolve it (``slurm_plan.resolved_path_problems``)."""
    env = os.environ if environ is None else environ
    config = parse_config(scontrol_text("show", "config"))
    problems, warnings = cluster_findings(spec, parse_partitions(scontrol_text("show", "partition", "-o")),
                                          parse_nodes(scontrol_text("show", "node", "-o")), config, env)
    problems = env_problems(env) + problems  # SLURM_CLUSTERS, SBATCH_CONTAINER: submit would stop on them
    if spec.runs_on.scheduled:  # this host submits: its folder is the one runs_dir is resolved from
        from orchestrator.backends.slurm.slurm_plan import resolved_path_problems

        problems += resolved_path_problems(spec, os.getcwd())
    if spec.sweep:
        limit, n = config.max_array_size, len(spec.sweep_points())
        if n > limit - 1:
            print(f"note: the sweep of {n} points will be split into {-(-n // (limit - 1))} arrays (MaxArraySize={limit})")
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    if spec.container is not None and not problems:  # one srun on one node: worth it only for a job that fits
        from orchestrator.backends.slurm.container_check import check_on_node

        problems += check_on_node(spec)
    if problems:
        raise SpecError(problems, source="cluster check")
    return warnings


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
    if len(fit) < allocated_nodes(spec):
        problems.append(f"{allocation_words(spec)} requested with {spec.gpus_per_node} {gpu_type} GPU(s) each, but only "
                        f"{len(fit)} node(s) of partition {partition} have them"
                        + (" once slurm.exclude is applied" if len(usable) < len(members) else "")
                        + f": {_shown([n.name for n in fit]) or 'none'}; ask for fewer nodes or GPUs")
    return problems
