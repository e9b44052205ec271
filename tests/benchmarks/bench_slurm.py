"""The SLURM executor against plain sbatch, on a real cluster from deploy/cluster.sh.

Run (root): .venv/bin/python tests/benchmarks/bench_slurm.py [--repeat 5] [--cluster DIR] [--smoke]
It brings a 2-node cluster up in its own folder and takes it down at the end (stop the test
cluster first: both use the same namespaces), unless --cluster names a running one to use.

1. submit -> all ranks running: `orchestrator submit` of a 2 x 2 job whose ranks record the
   time they start, against `sbatch --wrap "srun ..."` running the same script. Ratio reported.
   Each job leaves the queue before the next is submitted. The controller's scheduling still
   moves single jobs by up to a second here: take medians of 5 or more.
2. submission of a 100-point sweep: wall time of `orchestrator submit` (one array). Target <= 2 s.
3. scheduler calls made by `status` over 100 jobs (100 array tasks + 20 single jobs): target 1-2.
4. scheduler calls made by `submit --wait` of a 2-minute job, counted by wrappers of sacct,
   squeue, scontrol and sinfo put first on PATH (they log, then run the real tool): target <= 15
   (issue 32; it was 110 at one query a second).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
CLUSTER = Path("/var/tmp/orch-bench-cluster")
TOOLS = ("sacct", "squeue", "scontrol", "sinfo")
SHARED = Path("/srv/orch-bench")
STARTED = """import os, sys, time
out = sys.argv[sys.argv.index('--out') + 1]
open(os.path.join(out, 'rank-' + os.environ.get('RANK', os.environ.get('SLURM_PROCID', '0'))), 'w').write(str(time.time()))
"""


def compile_package() -> None:
    """Our modules and torch's compiled, as a pip install leaves them. In this project's sandbox and
    CI PYTHONDONTWRITEBYTECODE is set, the jobs inherit it, and the venv's torch came without its
    .pyc files: without this, every rank, agent and standby compiles each module it imports again
    at its start (~17 ms a rank for what a rank imports before its entrypoint; importing torch took
    5.7 s instead of 2.5 s a rank on the 3-node cluster), which no user of an installed package pays."""
    import importlib.util

    folders = [str(ROOT / "orchestrator"), str(ROOT / "jobs")]
    for package in ("torch", "numpy"):
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            folders += list(spec.submodule_search_locations)
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *folders], check=False,
                   timeout=1200, env={**os.environ, "PYTHONDONTWRITEBYTECODE": ""},
                   stdout=subprocess.DEVNULL)  # a file of a package's tests that does not compile is its own


def wait_files(out: Path, n: int, timeout: float = 120) -> float:
    deadline = time.monotonic() + timeout
    while len(list(out.glob("rank-*"))) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(list(out.glob('rank-*')))} of {n} ranks started")
        time.sleep(0.05)
    time.sleep(0.05)
    return max(float(p.read_text()) for p in out.glob("rank-*"))


def wait_job_gone(job: str, timeout: float = 120) -> None:
    """Until SLURM holds no trace of the job: the next job measured must not wait for its nodes
    (before, the job that came first in each round paid for the previous round's last job)."""
    deadline = time.monotonic() + timeout
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job} still in the queue after {timeout:.0f} s")
        time.sleep(0.1)


def submitted_job(said: str) -> str:
    """The job id ``orchestrator submit`` printed ("submitted ID: job(s) J; run folder DIR")."""
    line = next(ln for ln in said.splitlines() if ln.startswith("submitted "))
    return line.split("job(s) ", 1)[1].split(";", 1)[0].split(",")[0]


def spec_file(tmp: Path, **fields: Any) -> Path:
    path = tmp / f"spec-{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump({"name": "bench", "executor": "slurm", "runs_dir": str(tmp / "runs"),
                                    "slurm": {"time": "00:05:00"}, **fields}))
    return path


def latency(repeat: int, tmp: Path, script: Path) -> None:
    ours: list[float] = []
    plain: list[float] = []
    cli: list[float] = []
    plain_cli: list[float] = []
    ungated: list[float] = []  # the same submit with recovery.health_check off: what the gate's step costs
    for i in range(repeat):
        out = tmp / f"ours-{i}"
        out.mkdir()
        spec = spec_file(tmp, name=f"lat{i}", entrypoint=str(script), nodes=2, cpu_ranks_per_node=2,
                         extra_args=["--out", str(out)])
        t0 = time.time()
        said = subprocess.run([PY, "-m", "orchestrator", "submit", str(spec)], check=True, capture_output=True,
                              text=True).stdout
        cli.append(time.time() - t0)
        ours.append(wait_files(out, 4) - t0)
        wait_job_gone(submitted_job(said))
        out = tmp / f"nogate-{i}"
        out.mkdir()
        spec = spec_file(tmp, name=f"nogate{i}", entrypoint=str(script), nodes=2, cpu_ranks_per_node=2,
                         extra_args=["--out", str(out)], recovery={"health_check": False})
        t0 = time.time()
        said = subprocess.run([PY, "-m", "orchestrator", "submit", str(spec)], check=True, capture_output=True,
                              text=True).stdout
        ungated.append(wait_files(out, 4) - t0)
        wait_job_gone(submitted_job(said))
        out = tmp / f"plain-{i}"
        out.mkdir()
        t0 = time.time()
        job = subprocess.run(["sbatch", "--parsable", "-Q", "-N2", "--ntasks-per-node=2", "-o", "/dev/null", "--wrap",
                              f"srun {PY} {script} --out {out}"], check=True, capture_output=True,
                             text=True).stdout.strip().split(";")[0]
        plain_cli.append(time.time() - t0)
        plain.append(wait_files(out, 4) - t0)
        wait_job_gone(job)
    o, p = statistics.median(ours), statistics.median(plain)
    from bench_cli import bytecode_state  # this folder is on sys.path: the benchmarks run as scripts

    print(f"orchestrator bytecode: {bytecode_state()}")
    print(f"submit -> 4 ranks running: sbatch --wrap {p:.2f} s, orchestrator submit {o:.2f} s -> {o / p:.2f}x "
          f"(+{o - p:.2f} s)")
    print(f"  of which the command itself (until it returns): sbatch {statistics.median(plain_cli):.2f} s, "
          f"orchestrator submit {statistics.median(cli):.2f} s; from its return to 4 ranks running: "
          f"{statistics.median([a - b for a, b in zip(plain, plain_cli)]):.2f} s vs "
          f"{statistics.median([a - b for a, b in zip(ours, cli)]):.2f} s")
    g = statistics.median(ungated)
    print(f"  with the health gate off (recovery.health_check: false): {g:.2f} s (+{g - p:.2f} s): the gate "
          f"(inside the ranks' step) costs {o - g:.2f} s")


def sweep_submission(tmp: Path, script: Path, points: int = 100) -> list[str]:
    out = tmp / "sweep"
    out.mkdir()
    spec = spec_file(tmp, name=f"sweep{points}", entrypoint=str(script), extra_args=["--out", str(out)],
                     sweep={"seed": list(range(points))})
    t0 = time.perf_counter()
    subprocess.run([PY, "-m", "orchestrator", "submit", str(spec)], check=True, stdout=subprocess.DEVNULL)
    print(f"{points}-point sweep submitted as one array in {time.perf_counter() - t0:.2f} s wall (target <= 2 s for 100)")
    return []


def counting_path(tmp: Path, log: Path) -> dict[str, str]:
    """An environment whose PATH puts wrappers of the scheduler's query tools first: each logs its
    call to ``log``, then runs the real tool. Counts what the orchestrator's own processes ask,
    whatever module asks it."""
    wrappers = tmp / f"counting-bin-{log.name}"
    wrappers.mkdir()
    for tool in TOOLS:
        real = subprocess.run(["which", tool], capture_output=True, text=True, check=True).stdout.strip()
        (wrappers / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {log}\nexec {real} "$@"\n')
        (wrappers / tool).chmod(0o755)
    return {**os.environ, "PATH": f"{wrappers}:{os.environ['PATH']}"}


def count_calls(log: Path) -> tuple[int, dict[str, int]]:
    calls = log.read_text().splitlines() if log.exists() else []
    return len(calls), {t: sum(c.startswith(t + " ") for c in calls) for t in TOOLS}


def status_calls(tmp: Path, script: Path, singles: int = 20) -> None:
    for i in range(singles):
        out = tmp / f"single-{i}"
        out.mkdir()
        subprocess.run([PY, "-m", "orchestrator", "submit", str(spec_file(tmp, name=f"single{i}", entrypoint=str(script),
                        extra_args=["--out", str(out)]))], check=True, stdout=subprocess.DEVNULL)
    log = tmp / "status-calls"
    env = counting_path(tmp, log)
    t0 = time.perf_counter()
    shown = subprocess.run([PY, "-m", "orchestrator", "list", "--json"], check=True, env=env, capture_output=True,
                           text=True).stdout
    took = time.perf_counter() - t0
    runs = [r for r in json.loads(shown) if r.get("executor") == "slurm"]
    jobs = sum(len(r.get("job_ids") or []) for r in runs)
    n, by_tool = count_calls(log)
    print(f"orchestrator list over {len(runs)} runs / {jobs} jobs: {n} scheduler call(s) "
          f"({', '.join(f'{t} {c}' for t, c in by_tool.items() if c)}), {took:.2f} s (target: 1-2 calls)")


def wait_queries(tmp: Path, seconds: int = 120) -> None:
    log = tmp / "wait-calls"
    env = counting_path(tmp, log)
    job = tmp / "sleeper.py"
    job.write_text(f"import time\ntime.sleep({seconds})\n")
    spec = spec_file(tmp, name=f"wait{seconds}s", entrypoint=str(job))
    t0 = time.perf_counter()
    subprocess.run([PY, "-m", "orchestrator", "submit", str(spec), "--wait"], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    took = time.perf_counter() - t0
    n, by_tool = count_calls(log)
    print(f"submit --wait of a {seconds} s job: {n} scheduler calls in {took:.0f} s ({by_tool}; "
          "target <= 15 for 120 s)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", choices=["latency", "sweep", "status", "wait"], action="append",
                    help="run only these figures (repeatable); all four by default")
    ap.add_argument("--cluster", type=Path, default=None,
                    help="use this running deploy cluster (its folder); neither brought up nor down")
    ap.add_argument("--shared", type=Path, default=SHARED, help="a folder every node sees, not node-local")
    ap.add_argument("--smoke", action="store_true",
                    help="one short round of each figure: does it still run? (its figures mean nothing)")
    args = ap.parse_args()
    only = set(args.only or ["latency", "sweep", "status", "wait"])
    sizes = {"points": 100, "singles": 20, "wait_s": 120}
    if args.smoke:
        args.repeat, sizes = 1, {"points": 5, "singles": 2, "wait_s": 5}
    own = args.cluster is None
    cluster = CLUSTER if own else args.cluster
    if own:
        up = subprocess.run(["bash", str(ROOT / "deploy" / "cluster.sh"), "up", "--nodes", "2", "--cpus", "4",
                             "--gpus", "0", "--dir", str(CLUSTER)])
        if up.returncode:
            sys.exit("could not bring the cluster up")
    os.environ["SLURM_CONF"] = str(cluster / "slurm.conf")
    try:
        # Not under /var/tmp or /tmp: validate refuses node-local folders for SLURM runs, as a site's
        # nodes would not see them. /srv is outside every node-local prefix, and every namespace
        # node sees it.
        args.shared.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=args.shared) as d:
            tmp = Path(d)
            os.environ["ORCHESTRATOR_HOME"] = str(tmp / "home")
            script = tmp / "started.py"
            script.write_text(STARTED)
            if "latency" in only:
                latency(args.repeat, tmp, script)
            if "sweep" in only:
                sweep_submission(tmp, script, sizes["points"])
            if "status" in only:
                status_calls(tmp, script, sizes["singles"])
            if "wait" in only:
                wait_queries(tmp, sizes["wait_s"])
    finally:
        if own:
            subprocess.run(["bash", str(ROOT / "deploy" / "cluster.sh"), "down", "--dir", str(CLUSTER)])


if __name__ == "__main__":
    main()
