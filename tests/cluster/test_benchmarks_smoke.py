"""The SLURM benchmarks still run: one short round of each against the session's cluster.

Their figures are not asserted (docs/PERFORMANCE.md has them, measured alone); that they run to
their end through today's product is. The other benchmarks' smoke runs are in
tests/integration/test_benchmarks_smoke.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "tests" / "benchmarks"


def _bench(args: list[str], env: dict[str, str], timeout: float = 600) -> str:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL)
    said = done.stdout + done.stderr
    assert done.returncode == 0, f"{args[0]} exited {done.returncode}:\n{said[-4000:]}"
    return said


def test_bench_slurm_runs_one_short_round_on_a_running_cluster(cluster: dict[str, str], tmp_path: Path) -> None:
    folder = Path(cluster["SLURM_CONF"]).parent
    shared = Path(cluster["runs_dir"]) / "bench-slurm-smoke"
    said = _bench([str(BENCH / "bench_slurm.py"), "--cluster", str(folder), "--shared", str(shared), "--smoke"],
                  {**os.environ, "SLURM_CONF": cluster["SLURM_CONF"]})
    for line in (r"submit -> 4 ranks running: sbatch --wrap [\d.]+ s, orchestrator submit [\d.]+ s",
                 r"5-point sweep submitted as one array", r"orchestrator list over \d+ runs / \d+ jobs: \d+ scheduler call",
                 r"submit --wait of a 5 s job: \d+ scheduler calls"):
        assert re.search(line, said), f"no /{line}/ in:\n{said[-4000:]}"


def test_bench_remote_runs_one_round_through_the_login_node(cluster: dict[str, str]) -> None:
    folder = Path(cluster["SLURM_CONF"]).parent
    said = _bench([str(BENCH / "bench_remote.py"), "--cluster", str(folder), "--rounds", "1", "--changed-mb", "1"],
                  dict(os.environ))
    assert re.search(r"status --remote - status there = [+-][\d.]+ s", said), said[-4000:]
    assert re.search(r"submit --remote changed\s+[\d.]+ s", said), said[-4000:]


def test_bench_recovery_inside_runs_one_round(cluster: dict[str, str]) -> None:
    said = _bench([str(BENCH / "bench_recovery_inside.py"), "--smoke", "--runs-dir", cluster["runs_dir"]],
                  {**os.environ, "SLURM_CONF": cluster["SLURM_CONF"]})
    assert re.search(r"\| crash inside \| [\d.]+ \([\d., ]+\) \| 1 \| 0 \|", said), said[-4000:]


def test_bench_scale_runs_one_round_on_the_sessions_nodes(cluster: dict[str, str]) -> None:
    folder = Path(cluster["SLURM_CONF"]).parent
    said = _bench([str(BENCH / "bench_scale.py"), "--cluster", str(folder), "--nodes", "2", "--repeat", "1",
                   "--agent-window", "1", "--shared", str(Path(cluster["runs_dir"]) / "bench-scale-smoke")],
                  {**os.environ, "SLURM_CONF": cluster["SLURM_CONF"]})
    for line in (r"floor: srun true\s+[\d.]+", r"submit -> all ranks\s+orchestrator\s+[\d.]+\s+sbatch\+srun",
                 r"cancel -> all ranks gone\s+orchestrator\s+[\d.]+", r"of ours: health gate\s+[\d.]+",
                 r"the job's agent, steady state .*: [\d.]+ % of a core; a bare loop waking as often: [\d.]+ %"):
        assert re.search(line, said), f"no /{line}/ in:\n{said[-4000:]}"


def test_bench_goodput_slurm_runs_its_smoke_round(cluster: dict[str, str]) -> None:
    said = _bench([str(BENCH / "bench_goodput_slurm.py"), "--smoke", "--runs-dir", cluster["runs_dir"]],
                  {**os.environ, "SLURM_CONF": cluster["SLURM_CONF"]})
    assert re.search(r"state COMPLETED, SLURM job \d+, Restarts=0", said), said[-4000:]
    assert "restarted inside the job: rank 1 on node2 was killed by a signal" in said, said[-4000:]
    assert re.search(r"goodput \d+(\.\d)?%: \d+s training of \d+s since submit", said), said[-4000:]
