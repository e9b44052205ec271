"""Start-up and cancel of a many-node job against SLURM's own floor, on the deploy cluster (issue 36).

Run (root): .venv/bin/python tests/benchmarks/bench_scale.py [--nodes 64] [--repeat 3] [--cluster DIR] [--gloo]
            [--ranks-per-node R [--torchrun]]
Without --cluster it brings a cluster of ``--nodes`` nodes with one CPU each up in its own folder
(deploy/cluster.sh up --nodes N --cpus 1; stop the test cluster first: both use the same namespaces)
and takes it down at the end.

Every figure is a job of one rank a node running a script without torch (it records when it
started, then sleeps until cancelled), side by side with the floor, in the same run:

1. The floor inside one allocation (salloc): ``srun true``, ``srun python -c pass`` and ``srun
   python -c "import orchestrator.backends.slurm.node.slurm_rank"`` on every node: what a job step,
   an interpreter, and a rank's imports before its entrypoint cost at this many nodes.
2. submit -> every rank running: ``orchestrator submit`` against ``sbatch --wrap "srun python
   script"``, and where ours goes: the command, the job's start to the agent's first attempt, the
   health gate (recovery.json's ``gate_s``: from the ranks' step's start to the agent's decision,
   the gate running inside that step), then from the decision to the last rank's entrypoint.
3. cancel -> every rank gone: ``orchestrator cancel`` against ``scancel`` of the plain job, until
   no rank's process is left (the nodes are network namespaces: every rank is visible here). The
   ranks are watched while our command runs: it returns only once the job has left the queue,
   which it reports on its own line (until 2026-11-29 that wait was counted as the ranks').
4. the job's agent in steady state (the stall watchdog on, every rank running): its CPU time over
   10 s, against a bare loop that wakes as often (every 0.2 s) and does nothing.

After each job is cancelled the bench waits until it has left the queue (its nodes out of
COMPLETING), so that no job measured waits for the previous one's nodes.

``--gloo``: the job's script imports torch, joins a gloo process group and all-reduces once before
it records its start, as a training script's first step does; the plain job's batch script sets
what torchrun would (MASTER_ADDR from ``scontrol show hostnames``, the rank from SLURM_PROCID) and
GLOO_SOCKET_IFNAME, as a hand-written one must on these nodes. Each rank imports torch (about 2 s
of CPU and 280 MB here): at 64 ranks on this machine's 2 cores and 24 GB, run it at 32 nodes.
Each rank also notes when its entrypoint started ("submit -> all entrypoints reached").

``--ranks-per-node R --torchrun`` (with ``--gloo``): R CPU ranks a node, the plain job being the
usual hand-written one: ``srun`` one task a node running torchrun (``--nproc-per-node R``, c10d
rendezvous on the first node), which imports torch itself and starts the node's ranks.

The package is compiled first (``compileall``), as a pip install leaves it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml
from bench_slurm import compile_package, submitted_job, wait_job_gone  # this folder is on sys.path: the benchmarks run as scripts

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
CLUSTER = Path("/var/tmp/orch-scale-cluster")
SHARED = Path("/srv/orch-scale")
SCRIPT = """import os, sys, time
out = sys.argv[sys.argv.index('--out') + 1]
rank = os.environ.get('RANK', os.environ.get('SLURM_PROCID', '0'))
with open(os.path.join(out, 'rank-' + rank), 'w') as f:
    f.write(f"{time.time()} {os.getpid()}")
time.sleep(3600)
"""
GLOO = """import os, sys, time
t0 = time.time()  # the entrypoint reached
out = sys.argv[sys.argv.index('--out') + 1]
for name, slurm in (('RANK', 'SLURM_PROCID'), ('WORLD_SIZE', 'SLURM_NTASKS'), ('LOCAL_RANK', 'SLURM_LOCALID')):
    os.environ.setdefault(name, os.environ[slurm])  # plain srun: what torchrun would set
import torch
import torch.distributed as dist
t1 = time.time()
dist.init_process_group('gloo')
t = torch.ones(1024)
dist.all_reduce(t)
assert t[0].item() == dist.get_world_size()
t2 = time.time()
name = os.path.join(out, 'rank-' + os.environ['RANK'])
with open(name + '.tmp', 'w') as f:  # when, who, how long importing torch and joining took, when it started
    f.write(f"{t2} {os.getpid()} {t1 - t0} {t2 - t1} {t0}")
os.replace(name + '.tmp', name)
time.sleep(3600)
"""
#: The plain job's batch script for --gloo: what a hand-written one sets before srun.
GLOO_ENV = ('export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1) MASTER_PORT=29555 '
            'GLOO_SOCKET_IFNAME=eth0; ')
AGENT_WINDOW_S = 10.0


def wait_ranks(out: Path, n: int, timeout: float = 300) -> tuple[float, list[int]]:
    """When the last of ``n`` ranks started, and their pids."""
    deadline = time.monotonic() + timeout
    while True:
        files = [p for p in out.glob("rank-*") if not p.name.endswith(".tmp")]
        values = [p.read_text().split() for p in files]
        if len(files) >= n and all(len(v) in (2, 5) for v in values):
            return max(float(v[0]) for v in values), [int(v[1]) for v in values]
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(files)} of {n} ranks started in {timeout:.0f} s (see {out}, and the job's "
                               f"log beside it)")
        time.sleep(0.05)


def phases(out: Path, t0: float) -> dict[str, float]:
    """--gloo: the median rank's seconds importing torch, and joining the group + the first all-reduce."""
    values = [p.read_text().split() for p in out.glob("rank-*") if not p.name.endswith(".tmp")]
    if not values or len(values[0]) < 5:
        return {}
    return {"submit -> all entrypoints reached": max(float(v[4]) for v in values) - t0,
            "importing torch (median rank)": statistics.median(float(v[2]) for v in values),
            "joining + first all-reduce (median rank)": statistics.median(float(v[3]) for v in values)}


def wait_gone(pids: list[int], timeout: float = 120) -> float:
    """When none of ``pids`` is alive any more."""
    deadline = time.monotonic() + timeout
    while any(Path(f"/proc/{pid}").exists() for pid in pids):
        if time.monotonic() > deadline:
            raise TimeoutError(f"ranks still alive {timeout:.0f} s after the cancel: {pids}")
        time.sleep(0.05)
    return time.time()


def floors(nodes: int) -> dict[str, float]:
    """Seconds of each srun inside one allocation of every node (median of 3)."""
    steps = {"srun true": "true", "srun python -c pass": f"{PY} -c pass",
             "srun python -c 'import ...slurm_rank'": f"{PY} -c 'import orchestrator.backends.slurm.node.slurm_rank'"}
    script = "\n".join(
        f'for i in 1 2 3; do t=$(date +%s.%N); srun -Q -N{nodes} --ntasks-per-node=1 {cmd} >/dev/null; '
        f'echo "{name}|$t|$(date +%s.%N)"; done' for name, cmd in steps.items())
    done = subprocess.run(["salloc", "-Q", f"-N{nodes}", "bash", "-c", script], capture_output=True, text=True,
                          timeout=600, check=True, cwd=ROOT)
    took: dict[str, list[float]] = {}
    for line in done.stdout.splitlines():
        name, t0, t1 = line.rsplit("|", 2)
        took.setdefault(name, []).append(float(t1) - float(t0))
    return {name: statistics.median(v) for name, v in took.items()}


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_over(pid: int, seconds: float) -> float:
    """The share of one core ``pid`` used over ``seconds``."""
    before = cpu_seconds(pid)
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / seconds


def agent_pid(run_dir: Path) -> int:
    """The job's agent: the batch script's python running slurm_job on this run's payload."""
    found = subprocess.run(["pgrep", "-f", f"slurm_job {run_dir}/payload.json"], capture_output=True, text=True)
    return int(found.stdout.split()[0])


def bare_loop_cpu(seconds: float) -> float:
    """The floor of the agent's steady state: a loop that wakes every 0.2 s (the agent's POLL_S)."""
    loop = subprocess.Popen([PY, "-c", "import time\nwhile True: time.sleep(0.2)"])
    try:
        time.sleep(1.0)  # past its start
        return cpu_over(loop.pid, seconds)
    finally:
        loop.kill()
        loop.wait()


def ours(shared: Path, nodes: int, i: int, script: Path, window_s: float = AGENT_WINDOW_S,
         ranks: int = 1) -> dict[str, float]:
    out = shared / f"ours-{i}"
    out.mkdir()
    spec = shared / f"spec-{i}.yaml"
    spec.write_text(yaml.safe_dump({"name": f"scale{i}", "executor": "slurm", "runs_dir": str(shared / "runs"),
                                    "entrypoint": str(script), "nodes": nodes, "cpu_ranks_per_node": ranks,
                                    "extra_args": ["--out", str(out)], "slurm": {"time": "00:10:00"},
                                    "watchdog": {"stall_s": 600}}))
    t0 = time.time()
    said = subprocess.run([PY, "-m", "orchestrator", "submit", str(spec)], check=True, capture_output=True,
                          text=True, cwd=shared).stdout  # "submitted ID: job(s) J; run folder DIR"
    command = time.time() - t0
    last, pids = wait_ranks(out, nodes * ranks)
    line = next(ln for ln in said.splitlines() if ln.startswith("submitted "))
    run_id, run_dir = line.split()[1].rstrip(":"), Path(line.rsplit("run folder ", 1)[1])
    agent_cpu = cpu_over(agent_pid(run_dir), window_s)
    c0 = time.time()
    # The command returns once the scheduler no longer lists the job (COMPLETING included): the
    # ranks' end is watched beside it, as the plain side's is after scancel returns.
    cancel = subprocess.Popen([PY, "-m", "orchestrator", "cancel", run_id], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, cwd=shared)
    gone = wait_gone(pids)
    if cancel.wait(timeout=300):
        raise RuntimeError(f"orchestrator cancel {run_id} failed (exit {cancel.returncode})")
    returned = time.time()
    deadline = time.monotonic() + 60  # the attempt's moments are recorded as it ends
    while True:
        attempt = json.loads((run_dir / "recovery.json").read_text())["attempts"][0]
        if attempt.get("ended") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    times = attempt.get("times", {})
    wait_job_gone(submitted_job(said), timeout=300)
    return {"submit -> all ranks": last - t0, "the command": command, "to the agent's first attempt": attempt["started"] - t0,
            "health gate": float(times.get("gate_s", 0.0)),
            "gate's decision -> last rank": last - float(times.get("ranks_at", last)),
            "cancel -> all ranks gone": gone - c0, "the cancel command, job out of the queue": returned - c0,
            "agent CPU": agent_cpu, **phases(out, t0)}


def plain(shared: Path, nodes: int, i: int, script: Path, prefix: str = "", ranks: int = 1,
          torchrun: bool = False) -> dict[str, float]:
    """``prefix``: what the batch script runs before srun (--gloo: GLOO_ENV). ``torchrun``: one srun
    task a node starts torchrun, which starts the node's ``ranks`` (the usual hand-written job);
    else srun starts every rank as a task of its own."""
    out = shared / f"plain-{i}"
    out.mkdir()
    launch = (f"srun {PY} -m torch.distributed.run --nnodes={nodes} --nproc-per-node={ranks} "
              f"--rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:29555 --rdzv-id=plain{i} {script} --out {out}"
              if torchrun else f"srun {PY} {script} --out {out}")
    t0 = time.time()
    shape = ["--ntasks-per-node=1", f"--cpus-per-task={ranks}"] if torchrun else [f"--ntasks-per-node={ranks}"]
    job = subprocess.run(["sbatch", "--parsable", f"-N{nodes}", *shape,
                          "-o", str(shared / f"plain-{i}.log"), "--wrap", f"{prefix}{launch}"],
                         check=True, capture_output=True,
                         text=True).stdout.strip().split(";")[0]
    last, pids = wait_ranks(out, nodes * ranks)
    c0 = time.time()
    subprocess.run(["scancel", job], check=True)
    gone = wait_gone(pids)
    wait_job_gone(job, timeout=300)
    return {"submit -> all ranks": last - t0, "cancel -> all ranks gone": gone - c0, **phases(out, t0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cluster", type=Path, default=None, help="a running deploy/ cluster's folder (kept up)")
    ap.add_argument("--shared", type=Path, default=SHARED, help="a folder every node sees, not node-local")
    ap.add_argument("--agent-window", type=float, default=AGENT_WINDOW_S, help="seconds the agent's CPU is measured over")
    ap.add_argument("--gloo", action="store_true", help="the job's script imports torch and all-reduces once over gloo")
    ap.add_argument("--ranks-per-node", type=int, default=1, help="CPU ranks a node (the cluster's nodes get as many CPUs)")
    ap.add_argument("--torchrun", action="store_true", help="the plain job runs torchrun on each node (needs --gloo)")
    a = ap.parse_args()
    if a.torchrun and not a.gloo:
        ap.error("--torchrun runs a torch job: add --gloo")
    folder = a.cluster or CLUSTER
    if a.cluster is None:
        subprocess.run(["bash", str(ROOT / "deploy" / "cluster.sh"), "up", "--nodes", str(a.nodes), "--cpus", str(a.ranks_per_node),
                        "--dir", str(folder)], check=True, cwd=ROOT, stdout=subprocess.DEVNULL, timeout=900)
    os.environ["SLURM_CONF"] = str(folder / "slurm.conf")
    compile_package()
    try:
        a.shared.mkdir(parents=True, exist_ok=True)
        shared = a.shared / f"bench-{os.getpid()}"
        shared.mkdir()
        script = shared / "started.py"
        script.write_text(GLOO if a.gloo else SCRIPT)
        what = "a torch script, started once past its first gloo all-reduce" if a.gloo else "a script without torch"
        side = "torchrun on each node" if a.torchrun else "srun's tasks"
        print(f"{a.nodes} nodes, {a.ranks_per_node} rank(s) a node ({what}; the plain job: {side}), {a.repeat} "
              "round(s), seconds (median):")
        for name, took in floors(a.nodes).items():
            print(f"  floor: {name:48} {took:6.2f}")
        mine: list[dict[str, float]] = []
        theirs: list[dict[str, float]] = []
        for i in range(a.repeat):  # alternated, so both see the same machine
            theirs.append(plain(shared, a.nodes, i, script, GLOO_ENV if a.gloo else "", a.ranks_per_node, a.torchrun))
            mine.append(ours(shared, a.nodes, i, script, a.agent_window, a.ranks_per_node))
        for key in ("submit -> all ranks", "cancel -> all ranks gone"):
            o, p = statistics.median(r[key] for r in mine), statistics.median(r[key] for r in theirs)
            print(f"  {key:28} orchestrator {o:6.2f}   sbatch+srun / scancel {p:6.2f}   +{o - p:.2f} s ({o / p:.2f}x)")
        for key in ("the command", "to the agent's first attempt", "health gate", "gate's decision -> last rank",
                    "the cancel command, job out of the queue"):
            print(f"    of ours: {key:40} {statistics.median(r[key] for r in mine):6.2f}")
        for key in ("submit -> all entrypoints reached", "importing torch (median rank)",
                    "joining + first all-reduce (median rank)"):
            if key in mine[0] and key in theirs[0]:
                o, p = statistics.median(r[key] for r in mine), statistics.median(r[key] for r in theirs)
                print(f"  {key:42} orchestrator {o:6.2f}   sbatch+srun {p:6.2f}")
        agent, bare = statistics.median(r["agent CPU"] for r in mine), bare_loop_cpu(a.agent_window)
        print(f"  the job's agent, steady state (stall watchdog on), over {a.agent_window:g} s: {agent * 100:.3f} % of a "
              f"core; a bare loop waking as often: {bare * 100:.3f} %")
    finally:
        if a.cluster is None:
            subprocess.run(["bash", str(ROOT / "deploy" / "cluster.sh"), "down", "--dir", str(folder)], cwd=ROOT,
                           stdout=subprocess.DEVNULL, timeout=300)


if __name__ == "__main__":
    main()
