"""container: {runtime: oci} on the 2-node site cluster (deploy/cluster.sh up --oci: SLURM 22.05's
own ``srun --container`` with runc, and a bundle whose rootfs is not the host's): every rank runs
inside the bundle, the job's agent on the host, through the CLI as a user runs it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import yaml

from orchestrator.backends.slurm.executor import SlurmExecutor
from orchestrator.core.records import RunRecord

from .test_slurm import no_job_processes

PROJECTS = Path("/srv/orch-test-projects")

SCRIPT = '''\
import json, os, pathlib, socket, sys
import orchestrator
out = {"rank": os.environ["RANK"], "world": os.environ["WORLD_SIZE"], "host": socket.gethostname(),
       "marker": os.path.exists("/orch-oci-marker"), "os_release": open("/etc/os-release").read(),
       "pid": os.getpid(), "foo": os.environ.get("FOO"), "python": sys.executable,
       "orchestrator": orchestrator.__file__, "cwd": os.getcwd()}
folder = pathlib.Path(os.environ["ORCH_RUN_DIR"]) / "inside"
folder.mkdir(exist_ok=True)
(folder / f"rank-{out['rank']}.json").write_text(json.dumps(out))
print("INSIDE", json.dumps(out), flush=True)
'''


def _orch(project: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=project, capture_output=True, text=True,
                          timeout=timeout)


def _finished(run_dir: str, timeout: float = 60) -> RunRecord:
    ex, deadline = SlurmExecutor(), time.monotonic() + timeout
    while True:
        record = ex.refresh([RunRecord.load(run_dir)])[0]
        if record.state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return record
        assert time.monotonic() < deadline, record
        time.sleep(0.5)


def test_oci_ranks_run_inside_the_bundle_and_the_agent_on_the_host(cluster: dict[str, str]) -> None:
    assert not os.path.exists("/orch-oci-marker")  # the marker is the bundle's alone
    project = PROJECTS / f"oci-{uuid.uuid4().hex[:8]}"
    project.mkdir(parents=True)
    try:
        (project / "train.py").write_text(SCRIPT)
        spec = {"name": "oci", "entrypoint": "train.py", "executor": "slurm", "nodes": 2, "cpu_ranks_per_node": 1,
                "runs_dir": cluster["runs_dir"], "env": {"FOO": "from-the-spec"}, "slurm": {"time": "00:05:00"},
                "container": {"runtime": "oci", "image": cluster["oci_bundle"]}}
        (project / "spec.yaml").write_text(yaml.safe_dump(spec))
        checked = _orch(project, "validate", "spec.yaml", "--cluster")  # the image's python, on one node
        assert checked.returncode == 0, checked.stdout + checked.stderr
        bad = _orch(project, "validate", "spec.yaml", "--cluster", "--set", "container.python=/usr/bin/python2")
        assert bad.returncode == 2 and "Python >= 3.10" in bad.stderr, bad.stderr
        plan = _orch(project, "plan", "spec.yaml", "--json")
        assert plan.returncode == 0, plan.stderr
        srun = json.loads(plan.stdout)["payload"]["srun"]
        assert any(a.startswith("--container=") for a in srun), srun
        out = _orch(project, "submit", "spec.yaml")
        assert out.returncode == 0, out.stderr
        run_dir = re.search(r"run folder (\S+)", out.stdout)[1]  # type: ignore[index]
        record = _finished(run_dir)
        logs = "".join(p.read_text(errors="replace") for p in sorted((Path(run_dir) / "slurm").glob("*_log.out")))
        assert record.state == "COMPLETED", (record.state, record.error, logs[-3000:])
        inside = {int(p.stem[5:]): json.loads(p.read_text()) for p in (Path(run_dir) / "inside").glob("rank-*.json")}
        assert sorted(inside) == [0, 1], logs
        assert {r["host"] for r in inside.values()} == {"node1", "node2"}  # the node's own network and name
        for r in inside.values():
            assert r["marker"] and "ID=orch-oci" in r["os_release"], r  # the bundle's rootfs, not the host's
            assert r["pid"] == 1, r  # a pid namespace of its own
            assert r["foo"] == "from-the-spec" and r["world"] == "2", r  # the job's env reached it
            assert r["orchestrator"] == "/opt/orchestrator/orchestrator/__init__.py", r  # bound in, read-only
        # The agent stayed on the host: its health gate ran srun on both nodes, and it wrote the
        # run's bundle (the image's rootfs bound at /, then the run's mounts) before starting them.
        assert "health gate: 2 node(s) healthy" in logs, logs
        config = json.loads((Path(run_dir) / "container" / "oci-bundle" / "config.json").read_text())
        assert config["mounts"][0]["source"] == os.path.join(cluster["oci_bundle"], "rootfs")
        assert any(m["destination"] == run_dir for m in config["mounts"])
        assert no_job_processes()
    finally:
        shutil.rmtree(project, ignore_errors=True)
