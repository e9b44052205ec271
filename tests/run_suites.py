"""Run every suite at once: ``tests/unit`` and ``tests/integration`` in one pytest session (in one
process, or over pytest-xdist workers with ``--workers N``), and beside it ``tests/cluster`` against
one real SLURM cluster, in the sessions tests/cluster/streams.py names: one alone (``serial``: the
tests that change the cluster for every job), then its shareable streams side by side
(``PARALLEL``), then the cluster rebuilt without accounting (``last``). This is the README's test
command, so CI runs it.

Why side by side: the cluster tests spend most of their time waiting on SLURM (one-minute time
limits, requeue holds, KillWait, a job's state reaching sacct), not on the CPU, and the unit and
integration suites do not touch the cluster. Each session has its own temporary folders
(``session-<pid>``), its own run registries (per test) and its own processes (the integration
tests look only for their own run folders' processes; a cluster session only for its own jobs'
processes in the node namespaces), so none sees the others.

The cluster: brought up here once (deploy/cluster.sh up, with tests/cluster/conftest.py's options)
and taken down here at the end, whatever happened; the cluster sessions run with
``TESTS_CLUSTER_SHARED=1`` and their ``TESTS_CLUSTER_STREAM``. Without root and apt-get, one cluster
session runs (its tests skip, loudly; in CI they fail).

Contention: a test that fails side by side is run once more, alone, after every session ended
(cluster tests in one fresh session that brings its own cluster up and down).
It is reported either way, loudly (``[run_suites] FAILED under contention, passed alone: ...``),
since a failure that only contention shows can be a real bug (a slow start meeting a signal, as
in slurm_rank's time-limit notice once); a test that fails alone too fails the run.

Types: mypy checks orchestrator/ and jobs/ (pyproject.toml's [tool.mypy]) beside the sessions, in a
process of its own (about 30 s of CPU, cold); a finding fails the run, printed at the end. pyflakes'
checks (ruff) are a unit test (tests/unit/test_lint.py).

The unit and integration session prints as it goes; the cluster sessions write to logs printed
when they end. Every wait is bounded: a session still running after ``--limit-min`` minutes (from
the start) gets SIGINT (pytest then runs its teardown), then SIGKILL.

Usage: .venv/bin/python tests/run_suites.py [--limit-min 80] [pytest options for every session...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
GRACE_S = 180  # after SIGINT: time for a session's teardown (cluster.sh down) before SIGKILL
#: The unit and integration session's pytest-xdist workers (``--workers``). Alone, its tests wait
#: more than they compute (ranks' start-up, grace periods, init deadlines): one process took 31 min
#: on 2 cores (2026-11-27), two workers 11.8 min (2026-11-28, 985 CPU-s once the zygote shared
#: torch._dynamo and froze its heap; it was 1,457). Beside the cluster's sessions the cores are the
#: limit, and one process was the suite's longest session there (27.7 min). Two workers is what a
#: developer without the cluster gets too (``pytest -n 2 -m "not cluster"``).
WORKERS = 2
sys.path.insert(0, str(ROOT))

from tests.cluster import streams  # noqa: E402  (the checkout's tests package, after sys.path)


STARTED: list[subprocess.Popen[bytes]] = []
INTERRUPTED: list[int] = []  # the signal that interrupted this run, once one did


def start(args: list[str], out: IO[bytes] | None, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A pytest session in its own process group, with SIGINT's default action restored (a shell
    that runs this in the background starts it with SIGINT ignored, and then pytest would never
    get the SIGINT that ends it at the limit, teardown included)."""
    proc = subprocess.Popen([sys.executable, "-m", "pytest", *args], cwd=ROOT, stdout=out,
                            stderr=subprocess.STDOUT if out is not None else None, start_new_session=True,
                            env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    STARTED.append(proc)
    return proc


def _interrupt(signum: int, _frame: object) -> None:
    """Ctrl-C or SIGTERM to this run: pass SIGINT on to every session still running (each then runs
    its teardown); start no other session; the cluster still comes down."""
    INTERRUPTED.append(signum)
    print(f"[run_suites] interrupted ({signal.Signals(signum).name}): stopping every session", flush=True)
    for proc in STARTED:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass


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


def cluster_sessions(pytest_args: list[str], deadline: float, log_dir: Path) -> tuple[dict[str, int], list[Path]]:
    """Run tests/cluster: exit status and JUnit report per session; each session's log printed as it ends."""
    tag = os.getpid()
    common = ["-p", "no:cacheprovider", *pytest_args]
    if not (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get")):
        return _sessions({"cluster": None}, common, deadline, log_dir, tag), [log_dir / f"junit-cluster-{tag}.xml"]
    from tests.cluster.conftest import CLUSTER_DIR, RUNS_DIR, UP_ARGS

    cluster_sh = ["bash", str(ROOT / "deploy" / "cluster.sh")]
    began = time.monotonic()
    up = subprocess.run([*cluster_sh, *UP_ARGS], cwd=ROOT, capture_output=True, text=True, timeout=900)
    try:
        if up.returncode != 0:
            print(f"[run_suites] deploy/cluster.sh up failed (exit {up.returncode}):\n{up.stdout}\n{up.stderr}",
                  flush=True)
            return {"cluster up": up.returncode}, []
        print(f"[run_suites] cluster up in {time.monotonic() - began:.0f}s", flush=True)
        shutil.rmtree(RUNS_DIR, ignore_errors=True)
        RUNS_DIR.mkdir(parents=True)
        rc = _sessions({streams.SERIAL: streams.SERIAL}, common, deadline, log_dir, tag)
        rc.update(_sessions({name: name for name in streams.PARALLEL}, common, deadline, log_dir, tag))
        if any(rc.values()):
            keep_cluster_logs(CLUSTER_DIR / "log", log_dir / f"cluster-logs-{tag}")
        rc.update(_sessions({streams.LAST: streams.LAST}, common, deadline, log_dir, tag))
    finally:
        subprocess.run([*cluster_sh, "down", "--dir", str(CLUSTER_DIR)], cwd=ROOT, capture_output=True, timeout=300)
        shutil.rmtree(RUNS_DIR, ignore_errors=True)
    return rc, [log_dir / f"junit-cluster-{name}-{tag}.xml"
                for name in (streams.SERIAL, *streams.PARALLEL, streams.LAST)]


def _sessions(streams_: dict[str, str | None], common: list[str], deadline: float, log_dir: Path,
              tag: int) -> dict[str, int]:
    """Cluster sessions at once, one per stream (None: every cluster test, the fixture's own cluster)."""
    if INTERRUPTED:
        return {name: 130 for name in streams_}
    procs = {}
    for name, stream in streams_.items():
        env = dict(os.environ)
        if stream is not None:
            env.update({streams.STREAM_VAR: stream, streams.SHARED_VAR: "1"})
        report = log_dir / (f"junit-cluster-{stream}-{tag}.xml" if stream else f"junit-cluster-{tag}.xml")
        log = log_dir / f"cluster-{name}-{tag}.log"
        fh = open(log, "wb")
        procs[name] = (start([*common, f"--junitxml={report}", "tests/cluster"], fh, env), fh, log, time.monotonic())
    rc = {}
    for name, (proc, fh, log, began) in procs.items():
        rc[name] = finish(proc, deadline, f"cluster ({name})")
        fh.close()
        took = (time.monotonic() - began) / 60
        print(f"\n{'=' * 25} tests/cluster, session {name} (exit {rc[name]}, {took:.1f} min; log {log}) {'=' * 25}",
              flush=True)
        sys.stdout.write(log.read_text(errors="replace"))
        sys.stdout.flush()
        log.unlink()
    return rc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit-min", type=float, default=80, help="bound on every session, from the start (minutes)")
    parser.add_argument("--workers", type=int, default=WORKERS,
                        help="pytest-xdist workers of the unit and integration session (0: none, one process)")
    opts, pytest_args = parser.parse_known_args()
    deadline = time.monotonic() + opts.limit_min * 60
    # Python writes bytecode as it imports, as on any user's machine: a CI machine that sets
    # PYTHONDONTWRITEBYTECODE (this project's does) would have every one of the suite's several
    # hundred fresh interpreters compile torch's (lightning's, transformers'...) sources again,
    # since .ci/install does not compile them ahead: import torch took 5.4-6.4 s of CPU that way
    # against 3.3 s with the bytecode once written (2026-11-27, 2 cores), about twice the suite's
    # CPU. Every session, and the cluster (its jobs inherit the submitter's environment), gets it.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    log_dir = ROOT / ".pytest-tmp"
    log_dir.mkdir(exist_ok=True)
    started = time.monotonic()
    main_report = log_dir / f"junit-main-{os.getpid()}.xml"
    workers = ["-n", str(opts.workers), "--dist", "worksteal"] if opts.workers > 0 else []
    types = subprocess.Popen([sys.executable, "-m", "mypy", "--cache-dir", str(log_dir / "mypy-cache")], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    main = start([f"--junitxml={main_report}", *workers, *pytest_args, "tests/unit", "tests/integration"], None)
    main_ended: list[float] = []  # when the session ended, not when the cluster's sessions let us look
    threading.Thread(target=lambda: (main.wait(), main_ended.append(time.monotonic())), daemon=True).start()
    try:
        cluster_rc, cluster_reports = cluster_sessions(pytest_args, deadline, log_dir)
    finally:
        main_rc = finish(main, deadline, "unit and integration")
        main_took = ((main_ended[0] if main_ended else time.monotonic()) - started) / 60
    print(f"[run_suites] unit and integration: exit {main_rc}, {main_took:.1f} min", flush=True)
    reports = {"main": [main_report], "cluster": cluster_reports}
    rc = {"main": main_rc, "cluster": max(cluster_rc.values(), default=0)}
    for name, paths in reports.items():
        ids = sorted({i for path in paths for i in failed_tests(path)})
        for path in paths:
            path.unlink(missing_ok=True)
        statuses = [main_rc] if name == "main" else list(cluster_rc.values())
        if any(s not in (0, 1) for s in statuses) or not ids or time.monotonic() > deadline or INTERRUPTED:
            continue  # interrupted, an error pytest itself reports, or no time left: the exit stands
        print(f"\n[run_suites] {len(ids)} test(s) failed side by side; running them once more, alone:", flush=True)
        again = finish(start(["-p", "no:cacheprovider", *pytest_args, *ids], None), deadline, f"{name} rerun")
        print(f"[run_suites] FAILED under contention{', passed alone' if again == 0 else ', and alone too'}: "
              + ", ".join(ids), flush=True)
        rc[name] = again
    types_rc = typed(types, deadline)
    took = (time.monotonic() - started) / 60
    print(f"[run_suites] mypy exit {types_rc}, unit+integration exit {rc['main']}, cluster exit {rc['cluster']} "
          f"({', '.join(f'{k} {v}' for k, v in cluster_rc.items())}); {took:.1f} min in all", flush=True)
    return 130 if INTERRUPTED else rc["main"] or rc["cluster"] or types_rc


def typed(proc: subprocess.Popen, deadline: float) -> int:
    """mypy's exit (0: no finding), its report printed; killed (exit 124) past the deadline."""
    try:
        out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        print("[run_suites] mypy did not finish before --limit-min", flush=True)
        return 124
    print(f"[run_suites] mypy over orchestrator/ and jobs/: {out.strip().splitlines()[-1] if out.strip() else '(no output)'}",
          flush=True)
    if proc.returncode != 0:
        print(out, flush=True)
    return proc.returncode


#: What of SLURM's own logs a failed cluster session's report shows (the rest is kept in the copy).
LOG_NEWS = ("error", "kill", "signal", "oom", "fail")


def keep_cluster_logs(source: Path, target: Path, most: int = 80) -> None:
    """A cluster test failed: keep slurmctld's and every slurmd's log (``cluster.sh down`` removes
    them with the cluster) and print their lines about errors, kills and signals, so a failure
    that only the full load shows (a rank SIGKILLed as its job starts) can be read afterwards."""
    try:
        shutil.copytree(source, target, dirs_exist_ok=True)
    except OSError as exc:
        print(f"[run_suites] could not keep the cluster's logs from {source}: {exc}", flush=True)
        return
    lines = [f"{path.name}: {line}" for path in sorted(target.glob("slurm*.log"))
             for line in path.read_text(errors="replace").splitlines() if any(w in line.lower() for w in LOG_NEWS)]
    print(f"[run_suites] a cluster session failed: SLURM's logs kept in {target}; their last {min(most, len(lines))} "
          f"of {len(lines)} lines about errors, kills and signals:", flush=True)
    for line in lines[-most:]:
        print(f"  {line}", flush=True)


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
