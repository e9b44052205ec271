"""Human-readable output (rich). Only the CLI imports this."""

from __future__ import annotations

import shlex

from rich.console import Console
from rich.table import Table
from rich.text import Text

from orchestrator.backends import backend, planner
from orchestrator.core.errors import OrchestratorError
from orchestrator.spec.validators import printable
from orchestrator.front.startup import start_line
from orchestrator.plan import LaunchPlan, RankRow, paused_gc

#: Sweep points shown at each end of the sweep table.
SWEEP_ROWS = 20


class PlanQueryError(OrchestratorError):
    exit_code = 2

#: How ``plan`` describes each way a rank's process starts (LaunchPlan.rank_start).
RANK_START = {
    "fork": "forked from a parent that imported torch (variables read at interpreter start-up come from "
            "this shell's environment)",
    "fresh": "a fresh interpreter each, started with the environment below",
    "in-process": "this process (the debug executor)",
}


def code_line(launch: LaunchPlan) -> str:
    """What the ranks import: the snapshot (files, bytes, what the store still lacks) or the live files."""
    c = launch.code
    if c is None:
        why = "code.snapshot: false" if not launch.spec.code.snapshot else \
            f"the {launch.executor} executor" if backend(launch.executor).in_process else \
            "the entrypoint is an installed package"
        return f"code: the ranks import the live files ({why})"
    from orchestrator.code.snapshot import human_size

    how = f"git {c['commit'][:12]}{' + uncommitted changes' if c['dirty'] else ''}" if c.get("commit") else c["how"]
    new = f"{c['new_files']} new file(s), {human_size(c['new_bytes'])} to store" if c["new_files"] else "already stored"
    line = (f"code: snapshot {c['id']} of {c['root']} ({how}): {c['files']} files, {human_size(c['bytes'])}; "
            f"{new}; the ranks import it from {c['tree']}")
    left = c.get("left_out") or {}
    if left:
        parts = [f"{v['count']} {why} ({', '.join(v['examples'][:3])}{', ...' if v['count'] > 3 else ''})"
                 for why, v in left.items()]
        line += "\n      left out, found live at the same place: " + "; ".join(parts)
    return line


def print_plan(launch: LaunchPlan, console: Console | None = None, node: int | None = None,
               rank: int | None = None, run_lines: list[str] | None = None) -> None:
    if rank is not None and not 0 <= rank < launch.world_size:
        raise PlanQueryError(f"--rank {rank}: the job has ranks 0-{launch.world_size - 1}")
    if node is not None and not 0 <= node < launch.nodes:
        raise PlanQueryError(f"--node {node}: the job has nodes 0-{launch.nodes - 1}")
    console = console or Console(highlight=False, soft_wrap=True, emoji=False)
    # Values from the spec are printed as Text, never as rich markup: '[/x]' in an argument
    # must print as written, not raise or restyle the output.
    console.print(Text.assemble((launch.run_id, "bold"),
                                f"  executor={launch.executor}  {launch.nodes} node(s) x {launch.ranks_per_node} "
                                f"rank(s) = {launch.world_size}  backend={launch.backend}"))
    from orchestrator.spec import after
    from orchestrator.node import container, frameworks, tracking

    stall = launch.payload.watchdog.stall_s
    # The tools around the job (the container, the runs it waits for, the framework's launcher
    # variables, the trackers' defaults): each module words its own lines.
    for line in [f"run folder: {launch.run_dir}", *(run_lines or []), code_line(launch),
                 *container.plan_lines(launch), *after.after_lines(launch), *frameworks.plan_lines(launch),
                 *tracking.plan_lines(launch),
                 f"entrypoint: {shlex.join([launch.payload.entrypoint, *launch.payload.argv])}",
                 f"working directory of the ranks: {launch.payload.workdir}",
                 f"rank processes: {RANK_START[launch.rank_start]}", launch.cpus or None, launch.interfaces or None,
                 f"stall watchdog: ends the job when no rank progresses for {stall:g}s" if stall else None,
                 recovery_line(launch), start_line(launch)]:
        if line is not None:
            console.print(line, markup=False)
    for note in launch.notes:
        console.print(Text.assemble(("note:", "yellow"), " ", note))
    # What of this environment the submission picks up (on SLURM the SBATCH_* defaults sbatch applies
    # to the job: account, partition, QOS...), so a job's partition or account is never a mystery.
    for line in planner(launch.executor).environment_lines(launch):
        console.print(line, markup=False)
    for index, script in enumerate(launch.sbatch_scripts):
        which = f" of array {index + 1} of {len(launch.sbatch_scripts)}" if len(launch.sbatch_scripts) > 1 else ""
        console.print(f"\n[bold]sbatch script{which}[/bold] (rendered by submitit, as it will be submitted):")
        console.print(script, markup=False)
    if launch.payload.srun:
        console.print(Text("its agent (orchestrator.backends.slurm.node.slurm_job) starts the ranks with: " + shlex.join(launch.payload.srun)))
        if len(launch.array_chunks) > 1:
            console.print(f"split into {len(launch.array_chunks)} arrays to fit MaxArraySize")
    print_ranks(launch, console, node=node, rank=rank)
    if launch.sweep:
        shown = launch.sweep if len(launch.sweep) <= 2 * SWEEP_ROWS else [*launch.sweep[:SWEEP_ROWS], None,
                                                                          *launch.sweep[-SWEEP_ROWS:]]
        sweep = Table(title=f"sweep: {len(launch.sweep)} points")
        sweep.add_column("index")
        sweep.add_column("args")
        sweep.add_column("run folder", overflow="fold")
        for point in shown:
            if point is None:
                sweep.add_row("...", f"{len(launch.sweep) - 2 * SWEEP_ROWS} more (plan --json lists every point)", "")
            else:
                sweep.add_row(str(point.index), Text(shlex.join(point.argv)), Text(point.run_dir))
        console.print(sweep)


def recovery_line(launch: LaunchPlan) -> str:
    """What the plan does about failures: the health gate, and restarts (``recovery``)."""
    r = launch.payload.recovery
    gate = ("health gate on every node before each attempt" + (f", node_check: {shlex.join(r.node_check)}"
                                                               if r.node_check else "")) if r.health_check else "no health gate"
    if not r.max_restarts:
        return f"recovery: {gate}; no restarts after a failure (recovery.max_restarts: 0)"
    how = planner(launch.executor).recovery_how(r)
    if r.survivors == "keep":
        how = ("after a crash forks only the lost ranks again, beside the survivors, when every survivor can rejoin "
               "(jobs.Healer; recovery.survivors: keep), else " + how)
    hang = "" if "hang" not in r.on or launch.payload.watchdog.stall_s else \
        " (hang: only a missed init deadline, as watchdog.stall_s is off)"
    return (f"recovery: {gate}; up to {r.max_restarts} restart(s) on {', '.join(r.on)}{hang}: {how}; stops after "
            f"{r.stop_without_progress} failed attempt(s) in a row without a new checkpoint in "
            f"{launch.payload.checkpoint.dir}")


def print_ranks(launch: LaunchPlan, console: Console, node: int | None = None, rank: int | None = None) -> None:
    """Every rank's environment at any scale: what all ranks share once, then the per-rank table
    of the first and the last node, with the rule that gives every node between (checked against
    every row's whole environment, so a row that breaks it is shown, with the variables it
    differs in, not hidden). ``node`` / ``rank`` show one in full."""
    rows, rpn = launch.ranks, launch.ranks_per_node
    if rank is not None:
        if not 0 <= rank < len(rows):
            raise PlanQueryError(f"--rank {rank}: the job has ranks 0-{len(rows) - 1}")
        console.print(f"\n[bold]environment of rank {rank}[/bold] (host {rows[rank].host})")
        for key, value in sorted(rows[rank].env.items()):
            console.print(Text(f"  {key}={printable(value)}"))
        return
    rule = _NodeRule(rows[:rpn], rpn)
    with paused_gc():  # one dict built and compared (in C) per row, no cycles
        odd = [r for r in rows[rpn:] if not rule.holds(r)]
    node_keys = set(_NodeRule.RANK_KEYS) if launch.nodes > 1 else set()
    differing = {k for r in odd for k in rule.differences(r)}
    shared = {k: v for k, v in rows[0].env.items()
              if k not in node_keys and k not in differing and all(r.env.get(k) == v for r in rows[:rpn])}
    varying = [k for k in ("RANK", "LOCAL_RANK", "NODE_RANK") if k not in shared]
    varying += sorted({k for r in rows[:rpn] for k in r.env} - set(shared) - set(varying))
    varying += sorted(differing - set(varying))
    console.print(f"\n[bold]environment of every rank[/bold] ({launch.world_size} ranks)")
    for key, value in shared.items():
        console.print(Text(f"  {key}={printable(value)}"))
    if node is not None:
        if not 0 <= node < launch.nodes:
            raise PlanQueryError(f"--node {node}: the job has nodes 0-{launch.nodes - 1}")
        console.print(_rank_table(f"node {node}", rows[node * rpn:(node + 1) * rpn], varying))
        return
    console.print(_rank_table("node 0" if launch.nodes > 1 else "per rank", rows[:rpn], varying))
    if launch.nodes > 2:
        console.print(Text(f"nodes 1-{launch.nodes - 2}: as node 0, with NODE_RANK = the node's index and "
                           f"RANK = NODE_RANK x {rpn} + LOCAL_RANK ('plan --node N' or '--rank N' shows any one; "
                           "'plan --json' lists every rank)"))
        middle = [r for r in odd if r.rank < len(rows) - rpn]
        if middle:
            console.print(_rank_table("ranks that differ from that rule", middle[:SWEEP_ROWS], varying))
    if launch.nodes > 1:
        console.print(_rank_table(f"node {launch.nodes - 1}", rows[-rpn:], varying))


class _NodeRule:
    """Every node is node 0 with NODE_RANK (and GROUP_RANK) = its index and RANK = NODE_RANK x rpn
    + LOCAL_RANK: a row's whole environment equals that of node 0's row with the same LOCAL_RANK,
    but for those three."""

    RANK_KEYS = ("RANK", "NODE_RANK", "GROUP_RANK")

    def __init__(self, first_node: list[RankRow], rpn: int) -> None:
        self.rpn = rpn
        self.first = [row.env for row in first_node]

    def expected(self, row: RankRow) -> dict[str, str] | None:
        """The environment the rule gives ``row``'s place, or None when the place itself is wrong."""
        if not 0 <= row.local_rank < min(self.rpn, len(self.first)) or \
                row.rank != row.node_rank * self.rpn + row.local_rank:
            return None
        env = self.first[row.local_rank].copy()
        node = str(row.node_rank)
        for key, value in (("RANK", str(row.rank)), ("NODE_RANK", node), ("GROUP_RANK", node)):
            if key in env:
                env[key] = value
        return env

    def holds(self, row: RankRow) -> bool:
        return row.env == self.expected(row)

    def differences(self, row: RankRow) -> list[str]:
        """The variables in which ``row`` breaks the rule (all of its rank keys if its place does)."""
        expected = self.expected(row)
        if expected is None:
            return [k for k in ("RANK", "LOCAL_RANK", "NODE_RANK") if k in row.env]
        return sorted(k for k in expected.keys() | row.env.keys() if expected.get(k) != row.env.get(k))


def _rank_table(title: str, rows: list[RankRow], varying: list[str]) -> Table:
    table = Table(title=title)
    for col in ("host", *varying):
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(Text(row.host), *(Text(printable(row.env.get(k, ""))) for k in varying))
    return table
