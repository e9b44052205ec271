"""Run every suite in about two thirds of the time one session takes: ``tests/cluster`` beside
``tests/unit`` and ``tests/integration``, in two pytest sessions at once (26 minutes on 2 cores
instead of 38). This is the README's test command, so CI runs it.

Why two at once: the cluster suite spends most of its time waiting on SLURM (one-minute time
limits, requeue holds, KillWait, a job's state reaching sacct), not on the CPU, and the unit and
integration suites do not touch the cluster. Each session has its own temporary folders
(``session-<pid>``), its own run registries (per test) and its own processes (the integration
tests look only for their own run folders' processes; the cluster tests only inside the node
namespaces), so neither sees the other.

Contention: a test that fails side by side is run once more, alone, after both sessions ended.
It is reported either way, loudly (``[run_suites] FAILED under contention, passed alone: ...``),
since a failure that only contention shows can be a real bug (a slow start meeting a signal, as
in slurm_rank's time-limit notice once); a test that fails alone too fails the run.

The unit and integration session prints as it goes; the cluster session writes to a log printed
when it ends. Every wait is bounded: a session still running after ``--limit-min`` minutes gets
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
    reports = {name: log_dir / f"junit-{name}-{os.getpid()}.xml" for name in ("main", "cluster")}
    with open(log, "wb") as fh:
        # The cache plugin would have two sessions writing one .pytest_cache: the cluster one keeps out.
        cluster = start(["-p", "no:cacheprovider", f"--junitxml={reports['cluster']}", *pytest_args, "tests/cluster"],
                        fh.fileno())
        try:
            main_rc = finish(start([f"--junitxml={reports['main']}", *pytest_args, "tests/unit", "tests/integration"],
                                   None), deadline, "unit and integration")
        finally:
            cluster_rc = finish(cluster, deadline, "cluster")
    print(f"\n{'=' * 30} tests/cluster (run beside the others; log {log}) {'=' * 30}", flush=True)
    sys.stdout.write(log.read_text(errors="replace"))
    log.unlink()
    failed = {name: failed_tests(path) for name, path in reports.items()}
    rc = {"main": main_rc, "cluster": cluster_rc}
    for name, ids in failed.items():
        reports[name].unlink(missing_ok=True)
        if rc[name] not in (0, 1) or not ids or time.monotonic() > deadline:
            continue  # interrupted, an error pytest itself reports, or no time left: the exit stands
        print(f"\n[run_suites] {len(ids)} test(s) failed side by side; running them once more, alone:", flush=True)
        again = finish(start(["-p", "no:cacheprovider", *pytest_args, *ids], None), deadline, f"{name} rerun")
        print(f"[run_suites] FAILED under contention{', passed alone' if again == 0 else ', and alone too'}: "
              + ", ".join(ids), flush=True)
        rc[name] = again
    took = (time.monotonic() - started) / 60
    print(f"[run_suites] unit+integration exit {rc['main']}, cluster exit {rc['cluster']}; {took:.1f} min in all",
          flush=True)
    return rc["main"] or rc["cluster"]


def failed_tests(report: Path) -> list[str]:
    """The node ids of the tests a session's JUnit report marks failed or errored (none: no report)."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(report).getroot()
    except (OSError, ET.ParseError):
        return []
    ids = []
    for case in root.iter("testcase"):
        if case.find("failure") is None and case.find("error") is None:
            continue
        module, _, cls = case.get("classname", "").partition("::")
        path = module.replace(".", "/") + ".py"
        parts = [path, *([cls] if cls else []), case.get("name", "")]
        ids.append("::".join(parts))
    return sorted(set(ids))


if __name__ == "__main__":
    sys.exit(main())
