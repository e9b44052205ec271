"""Every benchmark in tests/benchmarks/ still runs: one short round each, so none rots unnoticed.

A benchmark's figures prove speed (docs/PERFORMANCE.md) and are never asserted here: under the
suite's load they mean nothing. What is asserted is that each one runs to its end through the
product as it is today and prints its table (``--smoke`` shrinks a round to its smallest sizes).
The SLURM ones run against the test cluster in tests/cluster/test_benchmarks_smoke.py; the GPU
ones run their cases here up to the point where a GPU is needed, and on a GPU machine for real
(the device check in the closing notes).

``test_every_benchmark_has_a_smoke_run`` fails when a new benchmark has none.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "tests" / "benchmarks"

#: benchmark -> (arguments of one short round, a line its output must hold)
LOCAL: dict[str, tuple[list[str], str]] = {
    "bench_agent_look.py": (["--ranks", "64", "--repeat", "1", "--seconds", "1"],
                            r"one heartbeat file per node \(today\)\s+[\d.]+ ms a look"),
    "bench_cli.py": (["--repeat", "1"], r"4096 x 8: plan [\d.]+ s"),
    "bench_frameworks.py": (["--smoke", "--only", "accelerate"], r"accelerate\s+[\d.]+s\s+[\d.]+s"),
    "bench_heap_retention.py": (["--repeats", "1", "--gb", "0.2"], r"override\s+[\d.]+"),
    "bench_recovery.py": (["--executor", "local", "--rounds", "1", "--runs-dir", "{tmp}/runs"], r"ttr_s\s+median"),
    "bench_survivors.py": (["--rounds", "1", "--epochs", "1", "--kill-at", "8", "--interval", "5",
                            "--runs-dir", "{tmp}/runs"], r"keep\s+failure to first new step: median [\d.]+s"),
    "bench_resnet.py": (["--repeat", "1", "--steps", "2", "--warmup", "1", "--batch", "8"], r"runtime/hand [\d.]+x"),
    "bench_runtime.py": (["--smoke"], r"defaults [\d.]+s vs best hand-set"),
    "bench_stragglers.py": (["--factors", "4", "--clean-runs", "0", "--clean-s", "3", "--slow-s", "4", "--window", "3",
                             "--judge-factors", "1.5", "--runs-dir", "{tmp}/runs"], r"\| 4x \| 1.5 \|"),
    "bench_status.py": (["--runs", "50", "--repeat", "1"], r"status, 50 runs all open \(first look\)\s+[\d.]+\s+1\s"),
    "bench_snapshot.py": (["--files", "20", "--rounds", "1", "--changed-mb", "1", "--dir", "{tmp}"],
                          r"changed\s+\(1 MB new\): ours [\d.]+ s"),
    "bench_snapshot_messy.py": (["--mb", "2"], r"\| after, no writer \| again \|"),
    "side_by_side.py": (["--base", str(ROOT), "--rounds", "1", "bench_agent_look.py", "--ranks", "8", "--repeat", "1",
                         "--seconds", "1"], r"watchdog off \(init deadline only\)"),
}
#: Over a minute on 2 busy cores even at their smallest (each trains through several launches).
SLOW = {"bench_runtime.py", "bench_resnet.py"}
#: GPU benchmarks: one case each; without a GPU the case must fail for want of one, not for a bug.
GPU: dict[str, tuple[list[str], str, list[str]]] = {
    "gpu_paths.py": (["--only", "nccl_no_teardown", "--runs-dir", "{tmp}/runs"], "gpu_paths.json", ["nccl_no_teardown"]),
    "bench_gpu_train.py": (["--only", "local_rank_script"], "gpu_train.json", ["local_rank_script"]),
    "gpu_recovery.py": ([], "gpu_recovery.json", ["nccl_crash_once"]),
}
#: Run on the SLURM test cluster (tests/cluster/test_benchmarks_smoke.py).
CLUSTER = {"bench_slurm.py", "bench_remote.py", "bench_recovery_inside.py", "bench_scale.py", "bench_goodput_slurm.py"}
#: Not benchmarks: the peers and rank scripts the benchmarks start.
HELPERS = {"bare_allreduce.py", "first_allreduce.py", "hand_ddp_loop.py"}
NO_GPU = re.compile(r"no GPUs? found|NVIDIA driver|sees no GPU|CUDA|cuda|nvidia-smi|GPU", re.I)


def _run(name: str, args: list[str], tmp: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(BENCH / name), *(a.replace("{tmp}", str(tmp)) for a in args)]
    env = {**os.environ, "BENCH_DIR": str(tmp), "TMPDIR": str(tmp)}
    return subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL)


def test_every_benchmark_has_a_smoke_run() -> None:
    files = {p.name for p in BENCH.glob("*.py")}
    covered = set(LOCAL) | set(GPU) | CLUSTER | HELPERS
    assert files - covered == set(), f"benchmarks with no smoke run: add them to {__file__}"
    assert covered - files == set(), f"smoke runs of benchmarks that are gone: {sorted(covered - files)}"


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(LOCAL)])
def test_benchmark_runs_one_short_round(name: str, tmp_path: Path) -> None:
    args, expected = LOCAL[name]
    done = _run(name, args, tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{said[-4000:]}"
    assert re.search(expected, said), f"{name} did not print /{expected}/:\n{said[-4000:]}"


@pytest.mark.parametrize("name", sorted(GPU))
def test_gpu_benchmark_runs_its_case(name: str, tmp_path: Path) -> None:
    """The harness runs each case through the product and records it; on this CPU machine the
    case fails for want of a GPU (any other error is the harness or the product rotting)."""
    import torch

    args, written, cases = GPU[name]
    out = tmp_path / "out"
    done = _run(name, [*args, "--out", str(out)], tmp_path)
    said = done.stdout + done.stderr
    assert (out / written).exists(), f"{name} wrote no {written} (exit {done.returncode}):\n{said[-4000:]}"
    results = json.loads((out / written).read_text())
    for case in cases:
        assert case in results, f"{name} did not record {case}: {sorted(results)}"
        result = results[case]
        if torch.cuda.is_available():
            assert result.get("ok", True), result
        else:
            seen = json.dumps(result)
            assert NO_GPU.search(seen), f"{name} {case} failed, but not for want of a GPU: {seen[:3000]}"
