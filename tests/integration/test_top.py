"""`orchestrator top RUN --once` on a running local job (issue 51, item 1): one row per rank with its
node, step and rate from the progress files, the run's attempt on top; and after a `chaos
--kill-rank` with survivors kept, the last recovery and a goodput that adds up while it runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.helpers import make_plan, start_detached, wait_ended

ARGS = {"dataset": "digits", "model": "smallcnn", "batch-size": 16, "epochs": 2, "log-every": 1, "step-delay": 0.1}


def _top(run_dir: str) -> str:
    done = subprocess.run([sys.executable, "-m", "orchestrator", "top", run_dir, "--once"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _steps(run_dir: str) -> int:
    path = Path(run_dir) / "metrics" / "rank-0.jsonl"
    return sum(1 for line in path.read_text().splitlines() if '"train"' in line) if path.exists() else 0


def test_top_shows_every_rank_and_after_a_recovery_a_goodput_that_adds_up(tmp_path: Path) -> None:
    launch = make_plan(tmp_path, nodes=2, cpu_ranks_per_node=1, args=ARGS,
                       recovery={"max_restarts": 1, "survivors": "keep"})
    start_detached(launch)
    deadline = time.monotonic() + 120
    while _steps(launch.run_dir) < 5:
        assert time.monotonic() < deadline, "training never started"
        time.sleep(0.1)
    time.sleep(1.2)  # a progress report from each rank (one a second)
    shown = _top(launch.run_dir)
    assert "RUNNING" in shown and "attempt 1" in shown, shown
    rows = {int(m.group(1)): int(m.group(2)) for m in re.finditer(r"^│\s+(\d)\s+│\s+\S+\s+│\s+(\d+)/\d+", shown, re.M)}
    assert sorted(rows) == [0, 1] and min(rows.values()) >= 1, shown
    from orchestrator.front.chaos import Injection, inject

    inject(launch.run_dir, Injection("kill-rank", rank=1))
    while "rejoined in generation 1" not in (Path(launch.run_dir) / "logs" / "rank-0.log").read_text():
        assert time.monotonic() < deadline + 60, "no rejoin"
        time.sleep(0.1)
    shown = _top(launch.run_dir)
    seen = time.monotonic()  # the recovery ends at the new attempt's first step, a report later (~1 s)
    while "last recovery: attempt 2 recovered in" not in shown and time.monotonic() < seen + 30:
        time.sleep(0.5)
        shown = _top(launch.run_dir)
    assert "attempt 2" in shown and "last recovery: attempt 2 recovered in" in shown, shown
    parts = re.search(r"(\d+)s training of (\d+)s since submit \(queue (\d+)s, start-up (\d+)s, recovery (\d+)s, "
                      r"lost work (\d+)s\)", shown)
    assert parts, shown
    training, wall, queue, startup, recovery, lost = map(int, parts.groups())
    assert training + queue + startup + recovery + lost >= 0.85 * wall - 2, shown  # accounted while it runs
    record = wait_ended(launch)
    assert record.state == "COMPLETED", record.error
    assert json.loads((Path(launch.run_dir) / "recovery.json").read_text())["attempts"][0]["outcome"] == "crash"


def test_a_rank_made_four_times_slower_is_named_the_straggler_and_its_peer_is_not(tmp_path: Path) -> None:
    """Issue 51's acceptance, locally: a 2-node x 1-rank jobs.train run; `chaos --slow-rank 1 --factor
    4` (a SIGSTOP/SIGCONT duty cycle); status and top name rank 1 the straggler within 45 s, never
    rank 0, and name no one before the slow-down. In lockstep DDP both ranks' step rates fall
    together: it is the time each spends outside its collectives that tells them apart. With
    recovery.on listing straggler, the attempt then ends as a 'straggler' failure and the ranks
    restart (locally: new processes)."""
    from orchestrator.front.chaos import Injection, inject

    launch = make_plan(tmp_path, nodes=2, cpu_ranks_per_node=1, args={**ARGS, "epochs": 16, "step-delay": 0.02},
                       recovery={"max_restarts": 1, "on": ["crash", "straggler"]}, watchdog={"straggler_window_s": 10})
    start_detached(launch)
    deadline = time.monotonic() + 120
    while _steps(launch.run_dir) < 20:
        assert time.monotonic() < deadline, "training never started"
        time.sleep(0.1)
    time.sleep(2)
    assert "STRAGGLER" not in _top(launch.run_dir)  # alike ranks: no one named
    said = inject(launch.run_dir, Injection("slow-rank", rank=1, factor=4, seconds=60))
    assert "slow-rank rank 1" in said and "4x slower" in said, said
    slowed = time.monotonic()
    while True:
        shown = _top(launch.run_dir)
        named = re.search(r"^│\s+(\d)\s+│.*STRAGGLER \(([\d.]+)x the others\)", shown, re.M)
        if named:
            break
        assert time.monotonic() - slowed < 45, f"no straggler named within 45 s:\n{shown}"
        time.sleep(1)
    assert named.group(1) == "1", shown
    status = subprocess.run([sys.executable, "-m", "orchestrator", "status", launch.run_dir], capture_output=True,
                            text=True, timeout=60).stdout
    assert re.search(r"straggler: rank 1 on \S+ spends \d+ ms a step outside collectives", status), status
    # recovery.on lists straggler: named for 10 s, it ends the attempt and every rank
    # restarts in a new process (the slow-down ends with the rank: chaos_node's loop sees it gone)
    record = wait_ended(launch, within=180)
    assert record.state == "COMPLETED", record.error
    first, second = json.loads((Path(launch.run_dir) / "recovery.json").read_text())["attempts"]
    assert first["outcome"] == "straggler" and "rank 1 spends" in first["why"] and "over 10s (watchdog" in \
        first["why"], first
    assert second["outcome"] == "completed", second
    chaos = (Path(launch.run_dir) / "chaos.jsonl").read_text()
    assert '"action": "slow-rank"' in chaos
