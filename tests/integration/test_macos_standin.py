"""Local runs on macOS, without a Mac: the CLI as a user drives it, under the stand-in of
``macos_standin.py`` (Linux-only names gone, no prctl, the platform decided as macOS) with /proc
hidden in a private mount namespace, so that no process table can be read at all: a Mac without
psutil, the most degraded case. The processes stay in this host's PID namespace, so this test,
outside the namespace, checks with psutil that nothing a run started is left.

Only the gloo run imports torch; the runs that are stopped are plain Python, so that the whole
file takes well under a minute."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.integration.macos_standin import hidden_proc_argv, proc_can_be_hidden, shim_dir, standin_env

pytestmark = pytest.mark.skipif(proc_can_be_hidden() is not None, reason=str(proc_can_be_hidden()))

LIMITS = "on macOS the local executor cannot:"

#: A torchrun-style script: gloo all_reduce over the ranks; each rank leaves a child in its
#: process group, which the run's end must stop; it writes how it was started.
GLOO = """
import json, os, subprocess, sys
import torch, torch.distributed as dist
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"rank {rank}: sum {t.item():.0f}", flush=True)
dist.destroy_process_group()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # standin-leftover"])
with open(os.path.join(os.environ["ORCH_RUN_DIR"], f"started-{rank}.json"), "w") as fh:
    json.dump({"argv": sys.orig_argv, "child": child.pid, "pid": os.getpid()}, fh)
"""

#: Plain Python that runs until stopped: each rank starts a child in its group and records both.
LOOP = """
import os, subprocess, sys, time
rank = os.environ["RANK"]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # standin-leftover"])
path = os.path.join(os.environ["ORCH_RUN_DIR"], f"pids-{rank}")
with open(path + ".tmp", "w") as fh:
    fh.write(f"{os.getpid()} {child.pid}")
os.replace(path + ".tmp", path)
def waiting_in_user_code():
    while True:
        time.sleep(0.05)
waiting_in_user_code()
"""


def _project(tmp_path: Path, name: str, script: str) -> Path:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(script))
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({"name": name, "entrypoint": f"{name}.py", "nodes": 1, "cpu_ranks_per_node": 2,
                                    "runs_dir": str(tmp_path / "runs")}))
    return spec


def _argv(*args: str) -> list[str]:
    return hidden_proc_argv([sys.executable, "-m", "orchestrator", *args])


def orch(tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = standin_env(shim_dir(tmp_path / "shim"))
    out = subprocess.run(_argv(*args), capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)
    assert "Traceback" not in out.stderr + out.stdout, out.stderr
    return out


def _run_dir(tmp_path: Path, name: str) -> Path:
    found = list((tmp_path / "runs").glob(f"{name}-*"))
    assert len(found) == 1, found
    return found[0]


def _wait_for(path: Path, pattern: str, count: int, timeout_s: float = 60) -> list[Path]:
    deadline = time.monotonic() + timeout_s
    while len(found := sorted(path.glob(pattern))) < count:
        assert time.monotonic() < deadline, f"no {count} x {pattern} in {path}"
        time.sleep(0.05)
    return found


def _watched(pids: list[int]) -> list[psutil.Process]:
    """psutil's handles on the PIDs, taken now: ``is_running`` then also tells a reused PID apart."""
    out = []
    for pid in pids:
        try:
            out.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    return out


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _assert_all_end(procs_: list[psutil.Process], what: str, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while left := [p.pid for p in procs_ if _running(p)]:
        assert time.monotonic() < deadline, f"{what}: still running: {left}"
        time.sleep(0.1)


def _leftovers_named(marker: str) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])
            and _running(p)]


def test_validate_and_plan(tmp_path: Path) -> None:
    spec = _project(tmp_path, "plain", LOOP)
    out = orch(tmp_path, "validate", str(spec))
    assert out.returncode == 0 and out.stdout.startswith("ok: plain: 1 node(s) x 2 rank(s), gloo"), out.stderr
    out = orch(tmp_path, "plan", str(spec))
    assert out.returncode == 0, out.stderr
    assert "rank processes: a fresh interpreter each" in out.stdout
    assert "forking after import torch is not safe on macOS" in out.stdout + out.stderr


def test_the_debug_executor_runs_in_process(tmp_path: Path) -> None:
    """It failed at import on macOS, and recorded the run FAILED with that message."""
    spec = _project(tmp_path, "debugged", "import os\nprint('in process: rank', os.environ['RANK'])\n")
    out = orch(tmp_path, "run", str(spec), "--executor", "debug")
    assert out.returncode == 0 and "in process: rank 0" in out.stdout and ": COMPLETED" in out.stdout, out.stderr


def test_a_two_rank_gloo_run_completes_and_leaves_nothing(tmp_path: Path) -> None:
    spec = _project(tmp_path, "gloo", GLOO)
    out = orch(tmp_path, "run", str(spec), timeout=240)
    assert out.returncode == 0 and "gloo-" in out.stdout and ": COMPLETED" in out.stdout, out.stdout + out.stderr
    assert "[rank 0] rank 0: sum 3" in out.stdout and "[rank 1] rank 1: sum 3" in out.stdout
    limits = [line for line in out.stderr.splitlines() if LIMITS in line]
    assert len(limits) == 1 and "pip install psutil" in limits[0], out.stderr
    # each rank exited leaving a child in its process group: stopped with the run, and said so
    assert "left running in their process groups" in out.stderr
    run_dir = _run_dir(tmp_path, "gloo")
    started = [json.loads(p.read_text()) for p in _wait_for(run_dir, "started-*.json", 2)]
    for rank in started:  # a fresh interpreter (never a fork of a parent that imported torch), watching its pipe
        assert "orchestrator.node.launcher" in rank["argv"] and any(a.startswith("--parent-pipe=") for a in rank["argv"])
    _assert_all_end(_watched([r["child"] for r in started]), "the ranks' children", timeout_s=5)


def test_detach_stacks_cancel_leaves_no_process(tmp_path: Path) -> None:
    spec = _project(tmp_path, "detached", LOOP)
    out = orch(tmp_path, "run", str(spec), "--detach")
    assert out.returncode == 0 and out.stdout.startswith("started detached-"), out.stderr
    assert sum(LIMITS in line for line in out.stderr.splitlines()) == 1, out.stderr
    run_id = out.stdout.split()[1]
    run_dir = _run_dir(tmp_path, "detached")
    pids = [int(w) for p in _wait_for(run_dir, "pids-*", 2) for w in p.read_text().split()]
    record = json.loads((run_dir / "record.json").read_text())
    supervisor = record["supervisor_pid"]
    zygotes = [p.pid for p in psutil.process_iter(["cmdline"])
               if f"--parent={supervisor}" in (p.info["cmdline"] or [])]
    assert len(zygotes) == 1
    everything = _watched([supervisor, *zygotes, *pids])
    assert len(everything) == 6 and all(map(_running, everything))

    stacks = orch(tmp_path, "stacks", run_id)
    assert stacks.returncode != 0 and "cannot confirm that a rank's recorded PID" in stacks.stderr, stacks.stderr
    assert "pip install psutil" in stacks.stderr and all(map(_running, everything))  # nothing was signalled

    cancelled = orch(tmp_path, "cancel", run_id)
    assert cancelled.returncode == 0 and "CANCELLED" in cancelled.stdout + cancelled.stderr, cancelled.stderr
    _assert_all_end(everything, "after cancel", timeout_s=10)
    assert _leftovers_named(str(run_dir)) == []
    status = orch(tmp_path, "status", run_id, "--json")
    assert json.loads(status.stdout)[0]["state"] == "CANCELLED"


@pytest.mark.parametrize("killed", ["cli", "cli-and-launcher"])
def test_nothing_outlives_a_killed_cli(tmp_path: Path, killed: str) -> None:
    """No prctl: a killed foreground CLI (the supervisor) is seen by the zygote, which polls its
    parent and stops the ranks' groups; with the zygote killed too, each rank sees its pipe close
    and ends its own group."""
    spec = _project(tmp_path, "killed", LOOP)
    env = standin_env(shim_dir(tmp_path / "shim"))
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        cli = subprocess.Popen(_argv("run", str(spec)), stdout=out, stderr=err, env=env, cwd=tmp_path)
    try:
        run_dir = _wait_for(tmp_path / "runs", "killed-*", 1)[0]
        pids = [int(w) for p in _wait_for(run_dir, "pids-*", 2) for w in p.read_text().split()]
        zygotes = [p.pid for p in psutil.process_iter(["cmdline"]) if f"--parent={cli.pid}" in (p.info["cmdline"] or [])]
        assert len(zygotes) == 1
        everything = _watched([*zygotes, *pids])
        assert len(everything) == 5 and all(map(_running, everything))
        if killed == "cli-and-launcher":
            # The CLI stopped first: a supervisor that sees its zygote die stops the ranks itself,
            # and that race (won under load) is not what this case proves.
            os.kill(cli.pid, signal.SIGSTOP)
            os.kill(zygotes[0], signal.SIGKILL)
        cli.kill()
        cli.wait(timeout=10)
        _assert_all_end(everything, f"after the {killed} was killed", timeout_s=15)
    finally:
        cli.kill()
        cli.wait()
    logs = "".join(p.read_text() for p in (run_dir / "logs").glob("rank-*.log"))
    if killed == "cli-and-launcher":  # the ranks ended themselves: the pipe, not the zygote
        assert logs.count("the local launcher process is gone") == 2, logs
    else:
        assert "the local launcher process is gone" not in logs, logs
    assert _leftovers_named(str(run_dir)) == []
