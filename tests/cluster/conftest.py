"""Bring a real 2-node SLURM cluster up from deploy/ for this test session, and down after.

tests/cluster/test_no_accounting.py runs last (``pytest_collection_modifyitems``): its module
fixture (``cluster_without_accounting``) brings the same cluster down and up again without
slurmdbd (``--no-accounting``), and the session's teardown takes that one down.

tests/run_suites.py runs this suite as several sessions against one cluster it brings up and down
itself (tests/cluster/streams.py): with ``TESTS_CLUSTER_STREAM`` set, a session keeps only its stream's
tests, and with ``TESTS_CLUSTER_SHARED=1`` the ``cluster`` fixture uses the cluster that is up."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from . import streams

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_DIR = Path("/var/tmp/orch-test-cluster")
# Every namespace node sees the host's filesystem: a path outside the node-local prefixes
# (/tmp, /var/tmp ...), which validate refuses for SLURM jobs, as on a real cluster.
RUNS_DIR = Path("/srv/orch-test-runs")
# The site profile (deploy/README.md): tasks bound to their CPUs, requeue only when asked for,
# preemption, KillWait 30 s, each node's own name on 127.0.1.1, associations enforced; as real
# sites are, not kinder.
# --login adds a login node reached over SSH as a non-root user (deploy/README.md, "Login node").
# --oci: SLURM's own OCI containers (runc, DIR/oci.conf) and a small bundle at DIR/oci-bundle.
#: CPUs each node claims (on 2 real cores). Six, so that the three shareable streams' 2-node jobs of
#: 2 ranks (2 CPUs a node each) run side by side instead of one queueing behind the other two's
#: minute-long waits (with 4, a 13 s test took 148 s in stream a, mostly queued).
CPUS = 6
UP_ARGS = ["up", "--nodes", "2", "--cpus", str(CPUS), "--gpus", "2", "--profile", "site", "--dir", str(CLUSTER_DIR),
           "--login", "--oci"]
LOGIN_DIR = CLUSTER_DIR / "login"
#: The module that needs the cluster without accounting: it runs last (it rebuilds the cluster).
NO_ACCOUNTING_MODULE = streams.LAST_MODULE


def _cluster_sh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ROOT / "deploy" / "cluster.sh"), *args], capture_output=True, text=True,
                          timeout=900)


def _down() -> None:
    subprocess.run(["bash", str(ROOT / "deploy" / "cluster.sh"), "down", "--dir", str(CLUSTER_DIR)], timeout=300)


def _machine_went_away() -> None:
    """What a restart of this machine does to the cluster: every daemon and every process in the
    node and login namespaces killed (SIGKILL, no clean-up of their own), the namespaces and the
    bridge gone; DIR (state, pid files, the login user) left as it was."""
    for pid_file in [*CLUSTER_DIR.glob("*.pid"), LOGIN_DIR / "sshd.pid"]:
        try:
            os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    for ns in [line.split()[0] for line in listed.splitlines() if line.startswith("orch-")]:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30).stdout
        for pid in pids.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
    time.sleep(1)  # the veth pairs go with their namespaces
    subprocess.run(["ip", "link", "del", "orchbr0"], capture_output=True, timeout=30)


def bring_up() -> None:
    """The cluster up, with an empty runs folder (pytest.fail with cluster.sh's output if not)."""
    up = _cluster_sh(*UP_ARGS)
    if up.returncode != 0:
        _down()
        pytest.fail(f"deploy/cluster.sh up failed:\n{up.stdout}\n{up.stderr}")
    shutil.rmtree(RUNS_DIR, ignore_errors=True)
    RUNS_DIR.mkdir(parents=True)


def take_down() -> None:
    _down()
    shutil.rmtree(RUNS_DIR, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Only this session's stream (tests/cluster/streams.py), where run_suites runs several. The
    no-accounting module last: its fixture rebuilds the session's cluster without slurmdbd,
    which no other test could then use (they read sacct). The others keep their order."""
    mine = streams.current()
    if mine is not None:
        here = str(Path(__file__).resolve().parent)
        other = [item for item in items
                 if str(item.fspath).startswith(here) and streams.stream_of(item.nodeid) != mine]
        if other:
            config.hook.pytest_deselected(items=other)
            items[:] = [item for item in items if item not in other]
    last = [item for item in items if Path(str(item.fspath)).name == NO_ACCOUNTING_MODULE]
    if last:
        items[:] = [item for item in items if item not in last] + last


def clear_node_memory(runs_dir: Path) -> None:
    """The heartbeat staging folders this session's jobs left in the nodes' memory (/dev/shm,
    one machine's for every emulated node): a rank SLURM killed never leaves its node, and no
    node here reboots or runs an epilog that would clear it (issue 36 notes the product's
    part). Only folders named by this session's runs: another session's runs go on."""
    from orchestrator.core.progress import staging_dirs

    runs = [p for p in runs_dir.glob("*") if p.is_dir()] + [p for p in runs_dir.glob("*/*") if p.is_dir()]
    for run in runs:
        for left in staging_dirs(run):
            shutil.rmtree(left, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster() -> Iterator[dict[str, str]]:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the cluster tests need root and apt-get in CI")
        pytest.skip("the cluster tests need root and Debian's apt-get")
    shared = os.environ.get(streams.SHARED_VAR) == "1"
    if shared:  # tests/run_suites.py brought it up, and takes it down
        if not (CLUSTER_DIR / "slurm.conf").exists():
            pytest.fail(f"{streams.SHARED_VAR}=1 but no cluster is up at {CLUSTER_DIR}")
    else:
        bring_up()
    conf = str(CLUSTER_DIR / "slurm.conf")
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    runs_dir = streams.runs_dir(RUNS_DIR)
    runs_dir.mkdir(parents=True, exist_ok=True)
    try:
        yield {"SLURM_CONF": conf, "runs_dir": str(runs_dir), "oci_bundle": str(CLUSTER_DIR / "oci-bundle"),
               # ssh -F login_ssh_config login_host CMD runs CMD on the login node as login_user.
               "login_ssh_config": str(LOGIN_DIR / "ssh_config"), "login_host": "orch-login",
               "login_user": (LOGIN_DIR / "user").read_text().strip(),
               "login_home": (LOGIN_DIR / "home").read_text().strip()}
    finally:
        clear_node_memory(runs_dir)
        if not shared:
            take_down()
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old


@pytest.fixture(scope="module")
def cluster_without_accounting(cluster: dict[str, str]) -> Iterator[dict[str, str]]:
    """The session's cluster, rebuilt with the same options but ``--no-accounting`` (no slurmdbd,
    no MariaDB: AccountingStorageType=accounting_storage/none), as small sites run. The cheapest
    honest way to a real cluster without accounting: the old one gone and an `up` (SLURM takes its
    AccountingStorageType only when slurmctld starts), about 15 s. Not undone: this module runs
    last, and the session's teardown takes the cluster down. Job ids start again at 1.

    The old one goes as a machine that restarts takes it, not by ``down``: every daemon and job
    process killed, the namespaces gone, DIR left as it was with a job still RUNNING in its state.
    ``up`` then starts from nothing (once, on a CI machine resumed from a snapshot, slurmctld
    recovered such a job and the nodes never came up idle)."""
    started = time.monotonic()
    held = subprocess.run(["sbatch", "--parsable", "-N", "2", "-J", "left-by-a-restart", "-o", "/dev/null",
                           "--wrap", "sleep 600"],
                          capture_output=True, text=True, timeout=60)
    assert held.returncode == 0, held.stderr
    for _ in range(150):
        state = subprocess.run(["squeue", "-h", "-j", held.stdout.strip(), "-o", "%T"], capture_output=True,
                               text=True, timeout=60).stdout.strip()
        if state == "RUNNING":
            break
        time.sleep(0.1)
    _machine_went_away()
    up = _cluster_sh(*UP_ARGS, "--no-accounting")
    if up.returncode != 0:
        pytest.fail(f"deploy/cluster.sh up --no-accounting failed:\n{up.stdout}\n{up.stderr}")
    assert "holds a cluster that is not running" in up.stderr + up.stdout
    left = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True, timeout=60)
    assert "left-by-a-restart" not in left.stdout, f"the old cluster's job came back: {left.stdout}"
    print(f"[cluster] rebuilt without accounting in {time.monotonic() - started:.1f}s")
    yield {**cluster, "accounting": "none"}
