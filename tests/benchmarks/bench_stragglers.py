"""How soon a straggler is named, and how often a clean run names one (issue 51): local 2-rank
jobs.train runs on this machine.

Run:
    .venv/bin/python tests/benchmarks/bench_stragglers.py --clean-runs 8

Each slowed run trains clean for ``--clean-s`` seconds, then ``orchestrator chaos --slow-rank 1
--factor F`` (a SIGSTOP/SIGCONT duty cycle) for ``--slow-s`` seconds, for F in ``--factors``; each
clean run trains ``--clean-s`` seconds untouched. Once a second (the agent's and the local
supervisor's look) the bench reads every rank's smoothed ``busy_s`` from the progress files, as the
watchdog does, and judges offline, from the same series, for several ``watchdog.straggler_factor``
settings (``--judge-factors``): when rank 1 is first named after the slow-down (seconds and
steps), when it would count for ``recovery.on: [straggler]`` (``core.stragglers.Persistent`` with
``--window``), and how many looks of the clean phases name anyone (false positives), with this
machine's noise first (the ratio of the two clean ranks' figures). The job: digits, smallcnn,
``--batch-size`` a rank (big enough that a step's own work is well above the 5 ms floor), 2
ranks on one machine. Nothing is asserted: the figures are for docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from typing import Any, Optional

from orchestrator import api
from orchestrator.core.progress import read_progress
from orchestrator.core.stragglers import Persistent, straggler, this_attempts_busy
from orchestrator.front.chaos import Injection, inject


def _series(run: Any, seconds: float, since: float, phase: str, out: list[dict[str, Any]]) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        reports = read_progress(str(run.run_dir), 2)
        busy = this_attempts_busy(reports, since)
        steps = [r.step if r is not None else None for r in reports]
        out.append({"t": time.time(), "phase": phase, "busy": [busy[0], busy[1]], "steps": steps})
        time.sleep(1.0)


def one(a: argparse.Namespace, factor: Optional[float], runs_dir: str) -> list[dict[str, Any]]:
    spec = {"name": f"strag-{factor or 'clean'}", "entrypoint": "jobs.train:main", "runs_dir": runs_dir,
            "nodes": 2, "cpu_ranks_per_node": 1,
            "args": {"dataset": "digits", "model": "smallcnn", "batch-size": a.batch_size, "epochs": 1000,
                     "log-every": 50}}
    run = api.submit(spec, executor="local")
    series: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 120
        since = time.time()
        while not all(r is not None and r.busy_s is not None for r in read_progress(run.run_dir, 2)):
            if time.monotonic() > deadline:
                raise SystemExit(f"{run.run_dir}: no busy_s reported in 120 s")
            time.sleep(0.5)
        _series(run, a.clean_s, since, "clean", series)
        if factor is not None:
            inject(str(run.run_dir), Injection("slow-rank", rank=1, factor=factor, seconds=a.slow_s + 5))
            _series(run, a.slow_s, since, "slow", series)
    finally:
        run.cancel()
        run.wait(timeout=120)
    return series


def judge(series: list[dict[str, Any]], judge_factor: float, window: float) -> dict[str, Any]:
    clean = [s for s in series if s["phase"] == "clean"]
    slow = [s for s in series if s["phase"] == "slow"]
    false = sum(1 for s in clean if straggler(dict(enumerate(s["busy"])), judge_factor) is not None)
    quiet = Persistent(window, judge_factor)
    false_counted = any(quiet.observe(s["t"], dict(enumerate(s["busy"]))) for s in clean)
    named_s = named_steps = counted_s = None
    persistent = Persistent(window, judge_factor)
    for s in clean:  # its window holds the clean looks before the slow-down too, as the agent's does
        persistent.observe(s["t"], dict(enumerate(s["busy"])))
    for s in slow:
        found = straggler(dict(enumerate(s["busy"])), judge_factor)
        if found is not None and found.rank == 1 and named_s is None:
            named_s = round(s["t"] - slow[0]["t"] + 1.0, 1)  # the first look is a second after the injection
            named_steps = (s["steps"][0] or 0) - (slow[0]["steps"][0] or 0)
        counted = persistent.observe(s["t"], dict(enumerate(s["busy"])))
        if counted is not None and counted.rank == 1 and counted_s is None:
            counted_s = round(s["t"] - slow[0]["t"] + 1.0, 1)
    return {"false_positive_looks": false, "false_counted": false_counted, "clean_looks": len(clean), "named_after_s": named_s,
            "named_after_steps": named_steps, "counted_after_s": counted_s}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--factors", default="1.2,1.5,2,4")
    ap.add_argument("--judge-factors", default="1.1,1.25,1.5")
    ap.add_argument("--clean-runs", type=int, default=8)
    ap.add_argument("--clean-s", type=float, default=20.0)
    ap.add_argument("--slow-s", type=float, default=45.0)
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--runs-dir", default="")
    a = ap.parse_args()
    runs_dir = a.runs_dir or tempfile.mkdtemp(prefix="bench-stragglers-")
    runs: list[tuple[Optional[float], list[dict[str, Any]]]] = []
    for factor in [float(f) for f in a.factors.split(",") if f]:
        runs.append((factor, one(a, factor, runs_dir)))
        print(json.dumps({"slowed": factor, "looks": len(runs[-1][1])}), flush=True)
    for _ in range(a.clean_runs):
        runs.append((None, one(a, None, runs_dir)))
        print(json.dumps({"clean run looks": len(runs[-1][1])}), flush=True)
    ratios = [max(s["busy"]) / min(s["busy"]) for _, series in runs for s in series
              if s["phase"] == "clean" and all(b for b in s["busy"])]
    busy = [b for _, series in runs for s in series if s["phase"] == "clean" for b in s["busy"] if b]
    print(f"\nthis machine's noise, clean looks ({len(ratios)}): a step's own work {statistics.median(busy) * 1000:.1f} ms "
          f"(median); the two ranks' ratio median {statistics.median(ratios):.2f}, p99 "
          f"{sorted(ratios)[int(0.99 * (len(ratios) - 1))]:.2f}, max {max(ratios):.2f}")
    print(f"\n| slow-down | straggler_factor | named after (s, steps) | counted after (window {a.window:g} s) |")
    print("|---|---|---|---|")
    for judge_factor in [float(f) for f in a.judge_factors.split(",")]:
        for factor, series in runs:
            if factor is None:
                continue
            r = judge(series, judge_factor, a.window)
            named = "never" if r["named_after_s"] is None else f"{r['named_after_s']} s, {r['named_after_steps']} steps"
            counted = "never" if r["counted_after_s"] is None else f"{r['counted_after_s']} s"
            print(f"| {factor:g}x | {judge_factor:g} | {named} | {counted} |")
    print(f"\n| straggler_factor | clean looks naming anyone | clean looks | clean phases that would count one "
          f"(window {a.window:g} s) |")
    print("|---|---|---|---|")
    for judge_factor in [float(f) for f in a.judge_factors.split(",")]:
        results = [judge(series, judge_factor, a.window) for _, series in runs]
        print(f"| {judge_factor:g} | {sum(r['false_positive_looks'] for r in results)} | "
              f"{sum(r['clean_looks'] for r in results)} | {sum(r['false_counted'] for r in results)} of {len(results)} |")


if __name__ == "__main__":
    main()
