"""The job's agent restarting the ranks' step inside its own job (recovery.in_allocation, spares),
without a cluster: stand-in sruns (the ranks' fails once, then succeeds), a stand-in scontrol that
answers `show job` and records `update`. The same on a real cluster: tests/cluster/test_recovery_slurm.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.core.recovery import History
from tests.integration.test_slurm_agent import _payload

# The ranks' srun: records its argv and the attempt the agent gave it, fails the first time (with
# srun's line for a rank a SIGBUS ended on node2 when BUS=1, else a plain exit code), then succeeds.
RANKS = """
import json, os, sys
out = sys.argv[1]
calls = os.path.join(out, "rank-calls.jsonl")
first = not os.path.exists(calls)
with open(calls, "a") as fh:
    fh.write(json.dumps({"argv": sys.argv[2:], "attempt": os.environ.get("ORCH_JOB_ATTEMPT")}) + "\\n")
if first:
    if os.environ.get("BUS") == "1":
        print("srun: error: node2: task 1: Bus error", file=sys.stderr, flush=True)
        sys.exit(135)
    sys.exit(1)
"""


def _agent(tmp: Path, recovery: dict, nodes: int, nodelist: str, bus: bool) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp / 'scontrol-calls'}\n"
                                      f"test \"$1\" = show && echo 'JobId=77 JobState=RUNNING NodeList={nodelist}'\n"
                                      "exit 0\n")
    (bin_dir / "scontrol").chmod(0o755)
    (tmp / "ranks.py").write_text(RANKS)
    ranks_srun = bin_dir / "ranks-srun"  # srun's options (the step's nodes) come first, as to srun
    ranks_srun.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp / "ranks.py"} {tmp} "$@"\n')
    ranks_srun.chmod(0o755)
    _payload(tmp, spec={"nodes": nodes, "cpu_ranks_per_node": 1, "recovery": {"health_check": False, **recovery}},
             requeue="auto", max_requeues=0, srun=(str(ranks_srun),))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77",
           "SLURM_JOB_NODELIST": nodelist, "SLURMD_NODENAME": "node1", "BUS": "1" if bus else "0"}
    return subprocess.run([sys.executable, "-m", "orchestrator.backends.slurm.node.slurm_job", str(tmp / "payload.json")], env=env,
                          capture_output=True, text=True, timeout=120)


def _rank_calls(tmp: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp / "rank-calls.jsonl").read_text().splitlines()]


def test_a_crash_restarts_the_step_inside_the_job_with_the_next_attempt(tmp_path: Path) -> None:
    done = _agent(tmp_path, {"max_restarts": 2}, nodes=2, nodelist="node[1-2]", bus=False)
    assert done.returncode == 0, done.stderr
    first, second = _rank_calls(tmp_path)
    assert (first["attempt"], second["attempt"]) == ("0", "1")  # a fresh port, rendezvous and marker each
    assert not any(a.startswith("--nodelist") for a in first["argv"] + second["argv"])  # the whole allocation
    assert "restarting the ranks inside job 77 on node1,node2 (no requeue)" in done.stderr
    attempts = History.load(tmp_path / "run").attempts
    assert [(a.outcome, a.action, a.inside_job, a.job) for a in attempts] == \
        [("crash", "restart", True, "77"), ("completed", "", False, "77")]
    calls = (tmp_path / "scontrol-calls").read_text()
    assert "requeue" not in calls and "update" not in calls, calls  # no requeue, no node given back


def test_a_blamed_node_is_swapped_for_the_spare_and_given_back(tmp_path: Path) -> None:
    done = _agent(tmp_path, {"max_restarts": 2, "spares": 1}, nodes=2, nodelist="node[1-3]", bus=True)
    assert done.returncode == 0, done.stderr
    first, second = _rank_calls(tmp_path)
    assert "--nodelist=node1,node2" in first["argv"] and "--ntasks=2" in first["argv"]  # the spare held apart
    assert "--nodelist=node1,node3" in second["argv"]  # node2 (a SIGBUS: the machine's fault) swapped out
    calls = (tmp_path / "scontrol-calls").read_text().splitlines()
    assert "update JobId=77 NodeList=node1,node3" in calls, calls
    assert "gave node2 back to SLURM; the job holds node1,node3" in done.stderr
    history = History.load(tmp_path / "run")
    assert history.excluded == ["node2"] and history.attempts[0].blamed == ["node2"]
    assert [a.nodes for a in history.attempts] == [["node1", "node2"], ["node1", "node3"]]


def test_without_a_spare_a_blamed_node_means_a_requeue(tmp_path: Path) -> None:
    done = _agent(tmp_path, {"max_restarts": 2}, nodes=2, nodelist="node[1-2]", bus=True)
    assert len(_rank_calls(tmp_path)) == 1, done.stderr  # the agent ran the ranks once, then requeued
    assert "needs 2: requeued instead of restarted inside it" in done.stderr
    calls = (tmp_path / "scontrol-calls").read_text().splitlines()
    assert "requeue 77" in calls, calls
    (only,) = History.load(tmp_path / "run").attempts
    assert (only.action, only.inside_job) == ("restart", False)


def test_with_exclude_failed_nodes_off_a_blamed_node_is_kept(tmp_path: Path) -> None:
    done = _agent(tmp_path, {"max_restarts": 2, "spares": 1, "exclude_failed_nodes": False}, nodes=2,
                  nodelist="node[1-3]", bus=True)
    assert done.returncode == 0, done.stderr
    first, second = _rank_calls(tmp_path)
    assert "--nodelist=node1,node2" in first["argv"] and "--nodelist=node1,node2" in second["argv"]
    assert "update" not in (tmp_path / "scontrol-calls").read_text()  # nothing given back
    assert History.load(tmp_path / "run").excluded == []
