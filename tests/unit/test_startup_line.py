"""``plan`` says what a job's start will do at its size (issue 36): the srun steps, the rendezvous
and what the watchdog reads a second; the figures it prints are the ones the code uses."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from orchestrator.front.startup import start_line
from orchestrator.node import forensics
from orchestrator.node.health import TOKEN_WAIT_S
from orchestrator.node.watchdog import Watch
from orchestrator.plan import LaunchPlan, plan
from orchestrator.spec.loading import spec_from_dict


def _plan(executor: str = "slurm", **fields: Any) -> LaunchPlan:
    spec = {"name": "big", "entrypoint": "jobs.train:main", "runs_dir": "/srv/runs", "executor": executor, "nodes": 1024,
            "gpus_per_node": 8, **fields}
    return plan(spec_from_dict(spec), executor)  # type: ignore[arg-type]


def test_a_thousand_node_job_names_its_one_step_and_its_rendezvous() -> None:
    line = start_line(_plan())
    assert line.startswith("start-up: one srun step starts the 8192 rank(s), 8 a node; each node's first rank runs "
                           "the health gate"), line
    assert f"the job agent's token in the folders the nodes share: one listing of a one-name folder, up to " \
           f"{TOKEN_WAIT_S:g}s" in line, line
    assert "no entrypoint starts before the job's agent has every node's verdict" in line, line
    assert "the 8192 ranks connect to rank 0's TCPStore, its libuv server" in line, line
    assert "within distributed.init_timeout_s, 300s" in line and "96K ranks" in line, line
    assert "nothing is read of the ranks' files (watchdog.stall_s is off)" in line, line


def test_what_holds_the_start_back_at_scale_is_named() -> None:
    old_store = start_line(_plan(env={"USE_LIBUV": "0"}))
    assert "not libuv (USE_LIBUV=0 in env" in old_store, old_store
    file_store = start_line(_plan(distributed={"init_method": "file"}))
    assert "FileStore" in file_store and "lock storm" in file_store and "use init_method env" in file_store, file_store
    no_gate = start_line(_plan(recovery={"health_check": False}))
    assert "health gate" not in no_gate and no_gate.startswith("start-up: one srun step starts the 8192"), no_gate
    small = start_line(_plan(nodes=2, gpus_per_node=2))
    assert "96K" not in small and "lock storm" not in small, small


def test_the_watchdog_share_it_prints_is_what_the_reader_reads(tmp_path: Path) -> None:
    """The number of heartbeat files a look reads, as the line says it, against a real look at a
    run folder of 1,024 node files; and the logs it reads of ranks that send no heartbeat."""
    line = start_line(_plan(watchdog={"stall_s": 120}))
    said = int(line.split("the stall watchdog reads ", 1)[1].split(" ", 1)[0])
    folder = tmp_path / "progress"
    folder.mkdir()
    now = time.time()
    for node in range(1024):
        ranks = {str(r): {"rank": r, "time": now, "step": 1} for r in range(node * 8, node * 8 + 8)}
        (folder / f"node-{node}.json").write_text(json.dumps({"ranks": ranks}))
    watch = Watch(8192, now - 60, 120.0, 300.0)
    heartbeats, logs = forensics._readers(watch, tmp_path)
    read = len(heartbeats.look()) // 8
    assert said == read == 103, (said, read, line)
    # A script without the rank API: its ranks' logs, a share a look too (the files need not exist to count)
    said_logs = int(line.split("has its log's size read instead: ", 1)[1].split(" ", 1)[0])
    stated = logs.look({r: tmp_path / f"rank-{r}.log" for r in range(8192)}, set(range(8192)))
    assert said_logs == len(stated) == 820, (said_logs, len(stated), line)
    assert "820 of the 8192 log(s) a second (each at least every 10s)" in line, line


def test_a_local_run_is_processes_on_this_machine() -> None:
    line = start_line(_plan("local", nodes=2, gpus_per_node=0, cpu_ranks_per_node=2))
    assert line.startswith("start-up: 4 rank process(es) on this machine (2 emulated node(s) of 2)"), line
    assert "srun" not in line, line


def test_spares_keep_the_gate_a_step_of_its_own_over_every_held_node() -> None:
    """A spare must be known good before it takes a node's place: the gate checks the whole
    allocation first, then the ranks' step starts."""
    line = start_line(_plan(recovery={"spares": 2, "max_restarts": 1}))
    assert line.startswith("start-up: one srun step runs the health gate on the 1026 node(s)"), line
    assert "then one srun step starts the 8192 rank(s), 8 a node" in line, line
