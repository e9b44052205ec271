"""Bring a real 2-node SLURM cluster up from deploy/ for this test session, and down after."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_DIR = Path("/var/tmp/orch-test-cluster")
# Every namespace node sees the host's filesystem: a path outside the node-local prefixes
# (/tmp, /var/tmp ...), which validate refuses for SLURM jobs, as on a real cluster.
RUNS_DIR = Path("/srv/orch-test-runs")
# The site profile (deploy/README.md): tasks bound to their CPUs, requeue only when asked for,
# preemption, KillWait 30 s, each node's own name on 127.0.1.1; as real sites are, not kinder.
# --login adds a login node reached over SSH as a non-root user (deploy/README.md, "Login node").
# --oci: SLURM's own OCI containers (runc, DIR/oci.conf) and a small bundle at DIR/oci-bundle.
UP_ARGS = ["up", "--nodes", "2", "--cpus", "4", "--gpus", "2", "--profile", "site", "--dir", str(CLUSTER_DIR),
           "--login", "--oci"]
LOGIN_DIR = CLUSTER_DIR / "login"


@pytest.fixture(scope="session")
def cluster() -> Iterator[dict[str, str]]:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the cluster tests need root and apt-get in CI")
        pytest.skip("the cluster tests need root and Debian's apt-get")
    up = subprocess.run(["bash", str(ROOT / "deploy" / "cluster.sh"), *UP_ARGS], capture_output=True, text=True,
                        timeout=900)
    if up.returncode != 0:
        subprocess.run(["bash", str(ROOT / "deploy" / "cluster.sh"), "down", "--dir", str(CLUSTER_DIR)], timeout=300)
        pytest.fail(f"deploy/cluster.sh up failed:\n{up.stdout}\n{up.stderr}")
    conf = str(CLUSTER_DIR / "slurm.conf")
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    shutil.rmtree(RUNS_DIR, ignore_errors=True)
    RUNS_DIR.mkdir(parents=True)
    try:
        yield {"SLURM_CONF": conf, "runs_dir": str(RUNS_DIR), "oci_bundle": str(CLUSTER_DIR / "oci-bundle"),
               # ssh -F login_ssh_config login_host CMD runs CMD on the login node as login_user.
               "login_ssh_config": str(LOGIN_DIR / "ssh_config"), "login_host": "orch-login",
               "login_user": (LOGIN_DIR / "user").read_text().strip(),
               "login_home": (LOGIN_DIR / "home").read_text().strip()}
    finally:
        subprocess.run(["bash", str(ROOT / "deploy" / "cluster.sh"), "down", "--dir", str(CLUSTER_DIR)], timeout=300)
        shutil.rmtree(RUNS_DIR, ignore_errors=True)
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
