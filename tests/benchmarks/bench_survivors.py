"""Survivors keep their state (issue 50, item 3) against a restart of every rank, side by side in
one session, locally or on a SLURM cluster: ``jobs.train`` (digits, smallcnn, 4 ranks on 2 simulated nodes, SGD with
momentum, a checkpoint every ``--interval`` steps), one rank SIGKILLed mid-training; alternated,
``--rounds`` of each.

    .venv/bin/python tests/benchmarks/bench_survivors.py --rounds 3

On SLURM (``--executor slurm``: 2 nodes x 1 rank, ``--spares`` more held by the job), against the
cluster that ``SLURM_CONF`` names, the rank is killed with ``orchestrator chaos --kill-rank`` on
its node once rank 0 logged ``--kill-at`` steps and, with ``keep``, the node's warm standby said it
is ready (before that, a replacement waits for the standby's imports). ``--failure node`` sets rank
1's node DOWN instead (``chaos --node-down``): ``keep`` then starts it on the spare's standby, and
the node is resumed after each round:
    deploy/cluster.sh up --nodes 3 --cpus 2 --profile site --dir /var/tmp/orch-exp
    SLURM_CONF=/var/tmp/orch-exp/slurm.conf .venv/bin/python tests/benchmarks/bench_survivors.py \
        --executor slurm --runs-dir /srv/exp/runs --rounds 3

- ``restart``: ``recovery: {max_restarts: 1}`` (survivors: restart, the default): every rank is
  forked again from the run's warm zygote and resumes from the last checkpoint;
- ``keep``: ``recovery: {max_restarts: 1, survivors: keep}``: the killed rank alone is forked
  again, the survivors rejoin it and hand it their state by broadcast (jobs.heal).

Reported per run, from recovery.json: the failure seen to the first new step of every rank
(``recovered``: the supervisor's failed_at to the next attempt's first_step_at; on SLURM also
``from_kill``: chaos's record of the kill to the same first step), the steps trained
again (the steps of attempt 2 at or below the last step before the failure: what was lost), and
whether rank 0 kept its PID. Nothing is asserted: the figures are for docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from orchestrator import api
from orchestrator.core.recovery import History
from orchestrator.core.records import RunRecord

ARGS = {"dataset": "digits", "model": "smallcnn", "batch-size": 16, "lr": 0.05, "momentum": 0.9, "epochs": 2,
        "log-every": 1, "step-delay": 0.05}


def _steps(run_dir: str) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics" / "rank-0.jsonl"
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "train"]


def once(a: argparse.Namespace, survivors: str, n: int) -> dict[str, Any]:
    spec = {"name": f"bench-survivors-{survivors}-{n}", "entrypoint": "jobs.train:main", "nodes": 2,
            "cpu_ranks_per_node": 2, "args": {**ARGS, "epochs": a.epochs}, "runs_dir": a.runs_dir,
            "checkpoint": {"interval_steps": a.interval},
            "recovery": {"max_restarts": 1, "survivors": survivors}}
    run = api.run(spec, wait=False, executor="local", fresh=True)
    record = run.record
    deadline = time.monotonic() + 120
    while len(_steps(record.run_dir)) < a.kill_at:
        if time.monotonic() > deadline:
            raise SystemExit("training never reached the step to kill at")
        time.sleep(0.02)
    pids = RunRecord.load(record.run_dir).rank_pids
    before = max(r["step"] for r in _steps(record.run_dir))
    os.kill(pids[3], signal.SIGKILL)
    run.wait(timeout=300, attempts=False)
    record = run.record
    first, second = History.load(record.run_dir).attempts[:2]
    again = [r["step"] for r in _steps(record.run_dir) if r.get("time", 0) >= second.started and r["step"] <= before]
    failed, back = first.times.get("failed_at"), second.times.get("first_step_at")
    return {"survivors": survivors, "state": str(record.state), "recovered_s": round(back - failed, 3)
            if failed and back else None, "steps_again": len(again), "rank0_kept": record.rank_pids[0] == pids[0]}


def _wait_idle(node: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], capture_output=True, text=True).stdout
        if state.splitlines() and state.splitlines()[0].strip() == "idle":
            return
        time.sleep(2)
    raise SystemExit(f"{node} never came back idle")


def once_slurm(a: argparse.Namespace, survivors: str, n: int) -> dict[str, Any]:
    from orchestrator.front.chaos import Injection, inject

    spec = {"name": f"bench-survivors-slurm-{survivors}-{n}-{int(time.time())}", "entrypoint": "jobs.train:main", "executor": "slurm",
            "nodes": 2, "cpu_ranks_per_node": 1, "args": {**ARGS, "epochs": a.epochs, "step-delay": 0.1},
            "runs_dir": a.runs_dir, "checkpoint": {"interval_steps": a.interval}, "slurm": {"time": "00:15:00"},
            "recovery": {"max_restarts": 1, "survivors": survivors, "spares": a.spares}}
    run = api.submit(spec)
    run_dir = run.record.run_dir
    batch = Path(run_dir) / "slurm"
    deadline = time.monotonic() + 300

    def warm() -> bool:  # a replacement on the victim's node would start warm (keep), or no wait (restart)
        text = "".join(p.read_text(errors="replace") for p in batch.glob("*_0_log.out"))
        return survivors != "keep" or text.count("warm standby ready on") >= 2 + a.spares

    while len(_steps(run_dir)) < a.kill_at or not warm():
        if time.monotonic() > deadline:
            raise SystemExit(f"{run_dir}: training never reached step {a.kill_at} with warm standbys")
        time.sleep(0.1)
    rank0 = json.loads((Path(run_dir) / "ranks" / "rank-0.json").read_text())["pid"]
    before = max(r["step"] for r in _steps(run_dir))
    node = json.loads((Path(run_dir) / "ranks" / "rank-1.json").read_text())["host"]
    inject(run_dir, Injection("kill-rank", rank=1) if a.failure == "kill" else Injection("node-down", node=node))
    killed_at = json.loads((Path(run_dir) / "chaos.jsonl").read_text().splitlines()[-1])["time"]
    try:
        run.wait(timeout=600, attempts=False)
    finally:
        if a.failure == "node":  # back for the next round (SLURM takes up to a minute to see it respond)
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True)
            _wait_idle(node)
    first, second = History.load(run_dir).attempts[:2]
    again = [r["step"] for r in _steps(run_dir) if r.get("time", 0) >= second.started and r["step"] <= before]
    failed, back = first.times.get("failed_at"), second.times.get("first_step_at")
    kept = json.loads((Path(run_dir) / "ranks" / "rank-0.json").read_text())["pid"] == rank0
    return {"survivors": survivors, "state": str(run.record.state), "recovered_s": round(back - failed, 3)
            if failed and back else None, "from_kill_s": round(back - killed_at, 3) if back else None,
            "steps_again": len(again), "rank0_kept": kept, "same_job": first.job == second.job}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs-dir", default="runs/bench-survivors")
    ap.add_argument("--interval", type=int, default=10, help="checkpoint every this many steps")
    ap.add_argument("--epochs", type=int, default=2, help="of jobs.train (22 steps each)")
    ap.add_argument("--kill-at", type=int, default=25, help="kill a rank once rank 0 logged this many steps")
    ap.add_argument("--executor", choices=("local", "slurm"), default="local")
    ap.add_argument("--spares", type=int, default=1, help="on SLURM: spare nodes the job holds")
    ap.add_argument("--failure", choices=("kill", "node"), default="kill",
                    help="on SLURM: chaos --kill-rank 1, or --node-down on rank 1's node (resumed after)")
    a = ap.parse_args()
    results: list[dict[str, Any]] = []
    for n in range(a.rounds):
        for survivors in ("restart", "keep"):
            r = once(a, survivors, n) if a.executor == "local" else once_slurm(a, survivors, n)
            print(json.dumps(r), flush=True)
            results.append(r)
    for survivors in ("restart", "keep"):
        mine = [r for r in results if r["survivors"] == survivors and r["recovered_s"] is not None]
        if mine:
            times = [r["recovered_s"] for r in mine]
            print(f"{survivors:8} failure to first new step: median {statistics.median(times):.2f}s "
                  f"(min {min(times):.2f}, max {max(times):.2f}); from the kill: "
                  f"{[r.get('from_kill_s') for r in mine]}; steps trained again: "
                  f"{[r['steps_again'] for r in mine]}; rank 0 kept its process: {[r['rank0_kept'] for r in mine]}")


if __name__ == "__main__":
    main()
