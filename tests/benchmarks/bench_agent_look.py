"""What the job's watchdog and the ranks' heartbeats cost the shared filesystem while a job runs,
on a simulated job (issue 36): no ranks are started, a run folder is laid out as N ranks on N/K
nodes leave it, and the product's own code reads and writes it.

Run: .venv/bin/python tests/benchmarks/bench_agent_look.py [--ranks 8192] [--ranks-per-node 8] [--repeat 5]

1. One look (``forensics.look``, what the SLURM agent and the local supervisor do once a second
   with ``watchdog.stall_s`` set), in steady state (every rank joined and sending heartbeats):
   its time, and its filesystem operations counted by strace (``openat``, ``stat`` family,
   ``getdents``: one look's worth, the same process's other work taken out), for the heartbeat
   layout of today (one file per node, ``progress/node-G.json``) against the one before (one
   file per rank). Target: <= 10 ms a look at 8,192 ranks on 1,024 nodes.
2. The heartbeats' writes to the shared folder: every rank of one node reporting every step for
   ``--seconds`` through ``orchestrator.core.progress.ProgressWriter`` (10 steps a second), counted by
   strace as creates and renames under the run folder, per node per second. Target: <= 2.
3. For a job with the stall watchdog off: the looks left once every rank has joined (none).

Figure 1 also for ranks that send no heartbeat (a script without the rank API: the main case),
whose logs' sizes the watchdog reads instead: a share of them a look at stall_s 600 (each at least
every 10 s, ``forensics.LogShare``), against every log every look, what a stall_s under 12 s still does.

Needs strace for the counts (Debian: apt-get install strace); without it the times alone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.node import forensics, join_hook
from orchestrator.core.progress import NodePlace, ProgressWriter, leave, progress_path
from orchestrator.node.watchdog import Watch

ROOT = Path(__file__).resolve().parents[2]
FILE_CALLS = "openat,open,stat,lstat,fstat,newfstatat,statx,getdents64,access,rename,renameat,renameat2,unlink,mkdir"


def lay_out(run: Path, ranks: int, per_node: int, layout: str) -> dict[int, Path]:
    """A run folder as the ranks leave it: logs, join markers, heartbeats (node or rank files)."""
    logs = {}
    (run / "logs").mkdir(parents=True, exist_ok=True)
    join_hook.joined_path(run, 0).parent.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        logs[r] = run / "logs" / f"rank-{r}.log"
        logs[r].write_text("step\n")
        join_hook.joined_path(run, r).write_text("")
    now = time.time()
    if layout == "none":  # scripts without the rank API: no heartbeats, the logs are all there is
        return logs
    if layout == "rank":
        progress_path(run, 0).parent.mkdir(parents=True, exist_ok=True)
        for r in range(ranks):
            progress_path(run, r).write_text(json.dumps({"rank": r, "time": now, "step": 1}))
    else:
        for r in range(ranks):
            ProgressWriter(run, r, attempt=0, min_interval_s=0, place=NodePlace(r // per_node, r % per_node, per_node)).report(
                1, force=r % per_node == per_node - 1)
        leave()
    return logs


#: Looks before the steady state: a large job's node files are read a share a look, each within
#: forensics.COVER_S looks, so the first ones still learn heartbeats (and read logs meanwhile).
WARM_LOOKS = int(forensics.COVER_S) + 2


def looks(run: Path, ranks: int, count: int, stall_s: float = 600.0) -> list[float]:
    """``count`` steady-state looks (after WARM_LOOKS that learn the heartbeats and joins)."""
    logs = {r: run / "logs" / f"rank-{r}.log" for r in range(ranks)}
    watch = Watch(ranks, time.time() - 3600, stall_s, 300.0)  # started before the layout was written
    for _ in range(WARM_LOOKS):
        forensics.look(watch, run, logs)
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        forensics.look(watch, run, logs)
        times.append(time.perf_counter() - t0)
    return times


def counted(argv: list[str]) -> dict[str, int] | None:
    """File syscalls of a child process, by name (strace -c), or None without strace."""
    if shutil.which("strace") is None:
        return None
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        subprocess.run(["strace", "-f", "-c", "-e", f"trace={FILE_CALLS}", "-o", out.name, *argv], check=True,
                       stdout=subprocess.DEVNULL, cwd=ROOT)
        calls = {}
        for line in out.read().splitlines():
            parts = line.split()
            if len(parts) >= 5 and parts[-1] in FILE_CALLS.split(",") and parts[3].isdigit():
                calls[parts[-1]] = int(parts[3])
        return calls


def ops_per_look(run: Path, ranks: int, stall_s: float = 600.0) -> float | None:
    """One steady look's file operations: a child that makes 10 looks after its warm-up, less one
    that makes none, over 10."""
    def child(n: int) -> list[str]:
        return [sys.executable, __file__, "--child-looks", str(n), "--run", str(run), "--ranks", str(ranks),
                "--child-stall", str(stall_s)]

    many, none = counted(child(10)), counted(child(0))
    if many is None or none is None:
        return None
    return (sum(many.values()) - sum(none.values())) / 10


def writes_per_node_second(per_node: int, seconds: float) -> float | None:
    """Creates and renames under the run folder while one node's ranks heartbeat every 0.1 s."""
    if shutil.which("strace") is None:
        return None
    with tempfile.TemporaryDirectory() as d, tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        argv = [sys.executable, __file__, "--child-beats", str(seconds), "--run", d, "--ranks-per-node", str(per_node)]
        subprocess.run(["strace", "-f", "-e", "trace=openat,rename,renameat,renameat2", "-o", out.name, *argv],
                       check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
        lines = out.read().splitlines()
        steady = next(i for i, ln in enumerate(lines) if "steady-from-here" in ln)  # after the first reports
        end = next(i for i, ln in enumerate(lines) if "steady-ends-here" in ln)
        shared = [ln for ln in lines[steady + 1:end] if d in ln and ("O_CREAT" in ln or "rename" in ln)]
        return len(shared) / seconds


def child_beats(run: Path, per_node: int, seconds: float) -> None:
    writers = [ProgressWriter(run, r, attempt=0, min_interval_s=1.0, place=NodePlace(0, r, per_node))
               for r in range(per_node)]
    step = 0

    def beat(until: float) -> None:
        nonlocal step
        while time.time() < until:
            step += 1
            for w in writers:
                w.report(step)
            time.sleep(0.1)

    beat(time.time() + 3)  # every rank's first report is published at once: the start, not the steady state
    (run / "steady-from-here").touch()
    beat(time.time() + seconds)
    (run / "steady-ends-here").touch()  # leaving publishes the last reports once: the end, not the steady state
    leave()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8192)
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=5.0, help="how long one node's ranks heartbeat (figure 2)")
    ap.add_argument("--child-looks", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child-beats", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--child-stall", type=float, default=600.0, help=argparse.SUPPRESS)
    ap.add_argument("--run", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child_looks is not None:
        looks(a.run, a.ranks, a.child_looks, a.child_stall)
        return
    if a.child_beats is not None:
        child_beats(a.run, a.ranks_per_node, a.child_beats)
        return
    nodes = -(-a.ranks // a.ranks_per_node)
    print(f"{a.ranks} ranks on {nodes} nodes ({a.ranks_per_node} a node), stall watchdog on, steady state:")
    cases = (("node", 600.0, "one heartbeat file per node (today)"), ("rank", 600.0, "one per rank (before)"),
             ("none", 600.0, "no rank API: logs, a share a look (today)"),
             ("none", 6.0, "no rank API: every log a look (before; today below stall_s 12)"))
    for layout, stall_s, name in cases:
        with tempfile.TemporaryDirectory() as d:
            run = Path(d)
            lay_out(run, a.ranks, a.ranks_per_node, layout)
            took = statistics.median(looks(run, a.ranks, a.repeat, stall_s))
            ops = ops_per_look(run, a.ranks, stall_s)
            said = f"{ops:.0f} file operations" if ops is not None else "file operations not counted (no strace)"
            print(f"  {name:62} {took * 1000:7.1f} ms a look, {said} a look")
    per_second = writes_per_node_second(a.ranks_per_node, a.seconds)
    if per_second is not None:
        print(f"  heartbeats: {per_second:.1f} creates+renames a node a second on the shared folder "
              f"({a.ranks_per_node} ranks reporting every 0.1 s; target <= 2)")
    with tempfile.TemporaryDirectory() as d:
        run = Path(d)
        logs = lay_out(run, a.ranks, a.ranks_per_node, "node")
        watch = Watch(a.ranks, time.time() - 1, None, 300.0)
        made = 0
        for _ in range(a.repeat):
            if not watch.settled():
                forensics.look(watch, run, logs)
                made += 1
        print(f"  watchdog off (init deadline only): {made} look(s) of {a.repeat} made; settled after: {watch.settled()}")


if __name__ == "__main__":
    main()
