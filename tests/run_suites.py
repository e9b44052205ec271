"""Run every suite faster than the README's test command does: ``tests/cluster`` beside
``tests/unit`` and ``tests/integration``, in two pytest sessions at once (24 to 26 minutes on 2
cores instead of 38). CI still runs them one after the other: in one of two side-by-side runs a
time-limit test failed under the contention (since fixed at its cause, not yet re-run twice).

Why two at once: the cluster suite spends most of its 17 minutes waiting on SLURM (one-minute
time limits, requeue delays, a job's state reaching sacct), not on the CPU, and the unit and
integration suites do not touch the cluster. One after the other they took 38 minutes on 2 cores;
side by side the run takes about as long as the longer of the two. Each session has its own
temporary folders (``session-<pid>``), its own run registries (per test) and its own processes
(the integration tests look only for their own run folders' processes; the cluster tests only
inside the node namespaces), so neither sees the other.

The unit and integration session prints as it goes; the cluster session writes to a log printed
when it ends. The exit status is the first non-zero one of the two (so a failure in either fails
the run). Every wait is bounded: a session still running after ``--limit-min`` minutes gets
SIGINT (pytest then runs its teardown, which brings the cluster down), then SIGKILL.

Usage: .venv/bin/python tests/run_suites.py [--limit-min 50] [pytest options for both sessions...]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRACE_S = 180  # after SIGINT: time for the cluster's teardown (cluster.sh down) before SIGKILL


def start(args: list[str], out: int | None) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "pytest", *args], cwd=ROOT, stdout=out,
                            stderr=subprocess.STDOUT if out is not None else None, start_new_session=True)


def finish(proc: subprocess.Popen[bytes], deadline: float, name: str) -> int:
    """The session's exit status, once it ended, or after SIGINT/SIGKILL at the deadline."""
    try:
        return proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        print(f"[run_suites] the {name} session ran past its limit: interrupting it", flush=True)
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return 124


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit-min", type=float, default=50, help="bound on each session (minutes)")
    opts, pytest_args = parser.parse_known_args()
    deadline = time.monotonic() + opts.limit_min * 60
    log_dir = ROOT / ".pytest-tmp"
    log_dir.mkdir(exist_ok=True)
    log = log_dir / f"cluster-suite-{os.getpid()}.log"
    started = time.monotonic()
    with open(log, "wb") as fh:
        # The cache plugin would have two sessions writing one .pytest_cache: the cluster one keeps out.
        cluster = start(["-p", "no:cacheprovider", *pytest_args, "tests/cluster"], fh.fileno())
        try:
            main_rc = finish(start([*pytest_args, "tests/unit", "tests/integration"], None), deadline,
                             "unit and integration")
        finally:
            cluster_rc = finish(cluster, deadline, "cluster")
    print(f"\n{'=' * 30} tests/cluster (run beside the others; log {log}) {'=' * 30}", flush=True)
    sys.stdout.write(log.read_text(errors="replace"))
    log.unlink()
    took = (time.monotonic() - started) / 60
    print(f"[run_suites] unit+integration exit {main_rc}, cluster exit {cluster_rc}; {took:.1f} min in all",
          flush=True)
    return main_rc or cluster_rc


if __name__ == "__main__":
    sys.exit(main())
