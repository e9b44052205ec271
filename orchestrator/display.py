"""Human-readable output (rich). Only the CLI imports this."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from orchestrator.plan import LaunchPlan

def print_plan(launch: LaunchPlan, console: Console | None = None) -> None:
    console = console or Console(highlight=False, soft_wrap=True)
    console.print(f"[bold]{launch.run_id}[/bold]  executor={launch.executor}  "
                  f"{launch.nodes} node(s) x {launch.ranks_per_node} rank(s) = {launch.world_size}  "
                  f"backend={launch.backend}")
    console.print(f"run folder: {launch.run_dir}", markup=False)
    console.print(f"entrypoint: {launch.payload['entrypoint']} {' '.join(launch.payload['argv'])}", markup=False)
    for note in launch.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    if launch.sbatch_script is not None:
        console.print("\n[bold]sbatch script[/bold] (rendered by submitit, as it will be submitted):")
        console.print(launch.sbatch_script, markup=False)
        if len(launch.array_chunks) > 1:
            console.print(f"split into {len(launch.array_chunks)} arrays to fit MaxArraySize")
    keys = sorted({k for row in launch.ranks for k in row.env})
    shared = {k: launch.ranks[0].env.get(k) for k in keys
              if len({row.env.get(k) for row in launch.ranks}) == 1}
    console.print(f"\n[bold]environment of every rank[/bold] ({launch.world_size} ranks)")
    for key, value in shared.items():
        console.print(f"  {key}={value}", markup=False)
    first = ["RANK", "LOCAL_RANK", "NODE_RANK"]
    varying = [k for k in first if k not in shared] + [k for k in keys if k not in shared and k not in first]
    table = Table(title="per rank")
    for col in ("host", *varying):
        table.add_column(col, overflow="fold")
    for row in launch.ranks:
        table.add_row(row.host, *(row.env.get(k, "") for k in varying))
    console.print(table)
    if launch.sweep:
        sweep = Table(title=f"sweep: {len(launch.sweep)} points")
        sweep.add_column("index")
        sweep.add_column("args")
        sweep.add_column("run folder", overflow="fold")
        for point in launch.sweep:
            sweep.add_row(str(point.index), " ".join(point.argv), point.run_dir)
        console.print(sweep)
