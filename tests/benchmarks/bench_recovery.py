"""Time to recovery (issue 20): from a failure to the next attempt's first training step, and what
the health gate costs an attempt.

Run, locally:       .venv/bin/python tests/benchmarks/bench_recovery.py --executor local
Run, on SLURM:      deploy/cluster.sh up --nodes 3 --cpus 4 --profile site --dir /var/tmp/orch-bench-cluster
                    SLURM_CONF=/var/tmp/orch-bench-cluster/slurm.conf .venv/bin/python \\
                        tests/benchmarks/bench_recovery.py --executor slurm --nodes 2 --runs-dir /srv/orch-bench-runs

The job: tests/integration/scripts/flaky_snapshot.py, a torchrun-style script that snapshots itself
every 3 steps and whose last rank raises at step 7 once (``--mode crash_once``; ``kill_once``
SIGBUS-kills it instead, which blames its node), with ``recovery: {max_restarts: 1}`` and
everything else at its default. Reported per run:

- detection: the failure (the rank's own time stamp) to the decision (recovery.json: attempt 1's end);
- queue wait: the decision to the next attempt's agent starting (SLURM holds a requeued job for
  its requeue delay, ~120 s on SLURM 22.05, then schedules it: nothing the job can shorten);
- restart: the next attempt's start to its first step (health gate, srun, interpreter and torch
  start, rendezvous, resume from the snapshot);
- time to recovery = detection + restart (the target: detection + 30 s), and the wall time with
  the queue wait.

``--gate`` also runs a job that does not fail, with the health gate on and off, alternated, and
reports each attempt's start (agent or supervisor) to first step: the gate's cost.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import uuid
from pathlib import Path
from typing import Any

from orchestrator import api
from orchestrator.core.recovery import History

SCRIPT = str(Path(__file__).resolve().parents[1] / "integration" / "scripts" / "flaky_snapshot.py")


def _spec(a: argparse.Namespace, mode: str, recovery: dict[str, Any]) -> dict[str, Any]:
    ckpt = Path(a.runs_dir).resolve() / f"ckpt-{uuid.uuid4().hex[:8]}"
    spec: dict[str, Any] = {"name": f"ttr-{mode}", "entrypoint": SCRIPT, "executor": a.executor, "nodes": a.nodes,
                            "cpu_ranks_per_node": a.ranks_per_node, "runs_dir": a.runs_dir,
                            "args": {"ckpt": str(ckpt), "mode": mode, "steps": 12, "sleep": 0.2},
                            "checkpoint": {"dir": str(ckpt)}, "recovery": recovery,
                            "distributed": {"backend": "gloo"}}
    if a.executor == "slurm":
        spec["slurm"] = {"time": "00:15:00"}
    return spec


def _logs(run_dir: Path) -> str:
    folders = [run_dir / "logs", run_dir / "slurm"]
    return "".join(p.read_text(errors="replace") for f in folders if f.is_dir() for p in sorted(f.iterdir())
                   if p.is_file())


def _run(a: argparse.Namespace, mode: str, recovery: dict[str, Any]) -> tuple[Path, str]:
    run = api.submit(_spec(a, mode, recovery), executor=a.executor) if a.executor == "slurm" else \
        api.run(_spec(a, mode, recovery), wait=False, executor="local")
    state = run.wait(timeout=900)
    return run.run_dir, str(state)


def recovery_once(a: argparse.Namespace) -> dict[str, float]:
    run_dir, state = _run(a, a.mode, {"max_restarts": 1})
    history = History.load(run_dir)
    logs = _logs(run_dir)
    failed = [float(t) for t in re.findall(r"failing \(\w+\) at (\d+\.\d+)", logs)]
    firsts = sorted(float(t) for t in re.findall(r"first_step_time (\d+\.\d+)", logs))
    assert state == "COMPLETED" and len(history.attempts) == 2 and failed, (state, logs[-2000:])
    first, second = history.attempts
    assert first.ended is not None
    next_first_step = min(t for t in firsts if t > second.started)
    out = {"detection_s": first.ended - failed[0], "queue_wait_s": second.started - first.ended,
           "restart_s": next_first_step - second.started}
    out["ttr_s"] = out["detection_s"] + out["restart_s"]
    out["wall_s"] = next_first_step - failed[0]
    out["blamed"] = ",".join(first.blamed) or "-"  # type: ignore[assignment]
    return out


def start_to_first_step(a: argparse.Namespace, gate: bool) -> float:
    run_dir, state = _run(a, "none", {"health_check": gate})
    attempt = History.load(run_dir).attempts[-1]
    firsts = [float(t) for t in re.findall(r"first_step_time (\d+\.\d+)", _logs(run_dir))]
    assert state == "COMPLETED" and firsts, state
    return min(firsts) - attempt.started


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--executor", choices=["local", "slurm"], default="local")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--ranks-per-node", type=int, default=2)
    ap.add_argument("--runs-dir", default="runs/bench-recovery")
    ap.add_argument("--mode", default="crash_once", choices=["crash_once", "kill_once"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gate", action="store_true")
    a = ap.parse_args()
    results = []
    for i in range(a.rounds):
        r = recovery_once(a)
        results.append(r)
        print(json.dumps({"round": i, **{k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}}),
              flush=True)
    for key in ("detection_s", "queue_wait_s", "restart_s", "ttr_s", "wall_s"):
        print(f"{key:14} median {statistics.median(r[key] for r in results):7.2f}  "
              f"min {min(r[key] for r in results):7.2f}  max {max(r[key] for r in results):7.2f}")
    if a.gate:
        on, off = [], []
        for _ in range(a.rounds):
            off.append(start_to_first_step(a, False))
            on.append(start_to_first_step(a, True))
        print(f"start to first step, health gate off: median {statistics.median(off):.2f}s {['%.2f' % x for x in off]}")
        print(f"start to first step, health gate on:  median {statistics.median(on):.2f}s {['%.2f' % x for x in on]}")
        print(f"the gate's cost: {statistics.median(on) - statistics.median(off):+.2f}s per attempt (median)")


if __name__ == "__main__":
    main()
