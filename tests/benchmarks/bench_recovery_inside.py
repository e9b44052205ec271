"""Recovery inside the allocation against recovery by requeue, side by side on one SLURM cluster
(issue 35): a crash, a hang and a lost node, each from the failure to the next attempt's first
training step, and how many SLURM jobs and requeues it took.

Run (3 nodes: a 2-node job and its spare):
    deploy/cluster.sh up --nodes 3 --cpus 2 --profile site --dir /var/tmp/orch-exp
    SLURM_CONF=/var/tmp/orch-exp/slurm.conf .venv/bin/python tests/benchmarks/bench_recovery_inside.py \\
        --runs-dir /srv/exp/runs --rounds 2

The job: tests/integration/scripts/flaky_snapshot.py, a torchrun-style script that snapshots itself
every 3 steps (no rank API), one rank per node, ``recovery: {max_restarts: 2}``, everything else at
its default. Cases (``--cases``):

- ``crash``: its last rank raises at step 7 once; in the allocation (the default) and with
  ``in_allocation: false`` (a requeue: SLURM 22.05 holds the job ~120 s, then it queues again);
- ``hang``: its last rank sleeps at step 7 once, ``watchdog.stall_s: 6``, with ``spares: 1`` (the
  straggler sleeps outside any collective, so its node is blamed: without a spare the job would be
  requeued without it);
- ``node``: the last rank's node is set DOWN at step 5, with ``spares: 1`` (the spare takes its
  place inside the job) and without (the job is requeued without it). The node is resumed after.

The failure's instant is the script's own ``failing ... at T`` line (for a lost node: the moment
``scontrol update State=DOWN`` returned); the first new step is its ``first_step_time`` line of the
next attempt. Nothing is asserted but that each job completes: the figures are for
docs/PERFORMANCE.md. ``--smoke`` runs the in-allocation crash once, on 1 node (2 ranks).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from orchestrator import api
from orchestrator.core.recovery import History

SCRIPT = str(Path(__file__).resolve().parents[1] / "integration" / "scripts" / "flaky_snapshot.py")
#: case -> (the script's mode, the spec's recovery section, extra spec fields, what is done to it)
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any], str]] = {
    "crash inside": ("crash_once", {"max_restarts": 2}, {}, ""),
    # the same, every rank started by a new step (no warm standbys: the code before issue 50's item 2)
    "crash inside cold": ("crash_once", {"max_restarts": 2, "standbys": False}, {}, ""),
    "crash requeue": ("crash_once", {"max_restarts": 2, "in_allocation": False}, {}, ""),
    # the straggler sleeps outside any collective: its node is blamed, so a spare takes its place
    "hang inside with a spare": ("hang_once", {"max_restarts": 2, "spares": 1}, {"watchdog": {"stall_s": 6}}, ""),
    "node lost with a spare": ("none", {"max_restarts": 2, "spares": 1}, {}, "down"),
    "node lost requeue": ("none", {"max_restarts": 2}, {}, "down"),
}


def _spec(a: argparse.Namespace, case: str) -> dict[str, Any]:
    mode, recovery, extra, _ = CASES[case]
    ckpt = Path(a.runs_dir).resolve() / f"ckpt-{uuid.uuid4().hex[:8]}"
    steps = max(40 if mode == "none" else 12, a.fail_at + 5)
    return {"name": "inside-" + re.sub(r"\W+", "-", case), "entrypoint": SCRIPT, "executor": "slurm",
            "nodes": a.nodes, "cpu_ranks_per_node": a.ranks_per_node, "runs_dir": a.runs_dir,
            "args": {"ckpt": str(ckpt), "mode": mode, "steps": steps, "sleep": 0.3, "fail-at": a.fail_at},
            "checkpoint": {"dir": str(ckpt)}, "recovery": recovery, "slurm": {"time": "00:15:00"},
            "distributed": {"backend": "gloo"}, **extra}


def _logs(run_dir: Path) -> str:
    folder = run_dir / "slurm"
    return "".join(p.read_text(errors="replace") for p in sorted(folder.iterdir()) if p.is_file()) \
        if folder.is_dir() else ""


def _take_a_node_down(run_dir: Path, deadline: float, step: int) -> tuple[str, float]:
    """Once the job is at ``step``, its last node DOWN: (the node, when)."""
    while time.monotonic() < deadline:
        logs = _logs(run_dir)
        if re.search(rf"rank \d+: step {step}\b", logs):
            attempts = History.load(run_dir).attempts
            node = attempts[-1].nodes[-1]
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=bench"], check=True)
            return node, time.time()
        time.sleep(0.2)
    raise TimeoutError(f"the job never reached step {step}")


def one(a: argparse.Namespace, case: str) -> dict[str, Any]:
    run = api.submit(_spec(a, case), executor="slurm")
    node, downed = "", 0.0
    try:
        if CASES[case][3] == "down":
            node, downed = _take_a_node_down(run.run_dir, time.monotonic() + 300, 5 if a.fail_at == 7 else a.fail_at)
        state = str(run.wait(timeout=900))
    finally:
        if node:
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)
    logs = _logs(run.run_dir)
    history = History.load(run.run_dir)
    # (mode none prints a 'failing (none)' line at step 7 too, and goes on: the node's loss is the failure)
    failed = [downed] if downed else [float(t) for t in re.findall(r"failing \(\w+\) at (\d+\.\d+)", logs)]
    firsts = sorted(float(t) for t in re.findall(r"first_step_time (\d+\.\d+)", logs))
    after = [t for t in firsts if t > failed[0]]
    assert state == "COMPLETED" and after, (case, state, logs[-3000:])
    jobs = sorted({x.job for x in history.attempts})
    return {"case": case, "failure_to_first_step_s": round(after[0] - failed[0], 2), "jobs": len(jobs),
            "requeues": history.restarts_by_requeue(), "attempts": len(history.attempts)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--ranks-per-node", type=int, default=1)
    ap.add_argument("--runs-dir", default="/srv/exp/runs")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--fail-at", type=int, default=7,
                    help="the step the crash or hang comes at (40: after the job's standbys are warm)")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.nodes, a.ranks_per_node, a.rounds, a.cases = 1, 2, 1, "crash inside"
    if not os.environ.get("SLURM_CONF") and not Path("/etc/slurm/slurm.conf").exists():
        raise SystemExit("no SLURM cluster: bring one up (deploy/cluster.sh up) and set SLURM_CONF")
    results: dict[str, list[dict[str, Any]]] = {}
    for _ in range(a.rounds):  # the cases alternate, round after round: the cluster's state is shared
        for case in a.cases.split(","):
            r = one(a, case)
            results.setdefault(case, []).append(r)
            print(json.dumps(r), flush=True)
    print(f"\n| case ({a.nodes} node(s) x {a.ranks_per_node} rank(s)) | failure to first new step, s (median) | "
          "SLURM jobs | requeues |")
    print("|---|---|---|---|")
    for case, rows in results.items():
        print(f"| {case} | {statistics.median(r['failure_to_first_step_s'] for r in rows):.1f} "
              f"({', '.join(str(r['failure_to_first_step_s']) for r in rows)}) | {rows[0]['jobs']} | "
              f"{rows[0]['requeues']} |")


if __name__ == "__main__":
    main()
