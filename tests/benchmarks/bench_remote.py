"""``--remote`` against working on the login node itself (issue 21): what submitting and asking
for status from a laptop adds, side by side in one run.

Needs the deploy cluster with its login node, and the login user's own install (as
tests/cluster/test_remote_slurm.py makes it):

    bash deploy/cluster.sh up --nodes 2 --cpus 4 --profile site --login --dir /var/tmp/orch-bench-cluster
    .venv/bin/python tests/benchmarks/bench_remote.py --cluster /var/tmp/orch-bench-cluster [--rounds 5]

Per round, alternated:
- ``ssh true`` through the master: one SSH round trip (the floor of anything remote);
- ``status RUN`` on the login node itself (the login user's orchestrator, run as that user);
- ``orchestrator --remote HOST status RUN`` from the host (the laptop): the target is the login
  node's own status plus one round trip (and this side's interpreter start);
- ``submit`` on the login node itself, from its checkout of the project, and
  ``--remote HOST submit`` from the laptop's copy (nothing changed since the last submission,
  then ``--changed-mb`` MB of new files): the target is the login node's submit plus one round trip
  plus the changed bytes. Each submitted job is cancelled at once.
The count of SSH sessions each remote command opened (``-O check`` excluded) is printed too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def timed(cmd: list[str], **kw) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    took = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {out.stdout}\n{out.stderr}")
    return took, out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cluster", default="/var/tmp/orch-bench-cluster")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--changed-mb", type=int, default=10)
    a = p.parse_args()
    cluster = Path(a.cluster)
    ssh_config = str(cluster / "login" / "ssh_config")
    # deploy/cluster.sh up --login records the login user and its home (created or found) there
    user = (cluster / "login" / "user").read_text().strip()
    home = Path((cluster / "login" / "home").read_text().strip())
    venv = home / "venv"
    if not (venv / "bin" / "orchestrator").exists():
        sys.path.insert(0, str(ROOT))
        from tests.cluster.test_remote_slurm import install_for_login

        install_for_login(str(home), user)
    # the login user's own registry (in its HOME), never this process's ORCHESTRATOR_HOME (root's, private)
    login_env = ["runuser", "-u", user, "--", "env", "-u", "ORCHESTRATOR_HOME", f"SLURM_CONF={cluster / 'slurm.conf'}",
                 f"HOME={home}"]
    orch_login = [*login_env, str(venv / "bin" / "orchestrator")]
    base = Path("/srv/orch-bench-projects") / uuid.uuid4().hex[:8]
    base.mkdir(parents=True)
    control = f"/tmp/orch-bench-{uuid.uuid4().hex[:6]}-%C"
    calls = base / "ssh-calls"
    counting = base / "ssh"
    counting.write_text(f'#!/bin/sh\ncase " $* " in *" -O "*) ;; *) echo x >> {calls} ;; esac\nexec ssh "$@"\n')
    counting.chmod(0o755)
    config = base / "config.yaml"
    config.write_text(yaml.safe_dump({"remote": {"host": "orch-login", "ssh": [str(counting), "-F", ssh_config],
                                                 "control_path": control, "command": [str(venv / "bin" / "orchestrator")],
                                                 "allow_runs_in_home": True}}))  # runs_dir: runs, in the checkout
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env["ORCHESTRATOR_CONFIG"] = str(config)
    project = base / "project"
    project.mkdir()
    for i in range(200):
        (project / f"mod{i}.py").write_text(f"X = {i}\n" * 200)
    (project / "train.py").write_text("import time\ntime.sleep(30)\n")
    (project / "spec.yaml").write_text(yaml.safe_dump({
        "name": "bench-remote", "entrypoint": "train.py", "executor": "slurm", "nodes": 1, "cpu_ranks_per_node": 1,
        "runs_dir": "runs", "slurm": {"time": "00:05:00"}}))
    with open(base / "master.log", "w") as log:
        subprocess.run(["ssh", "-F", ssh_config, "-o", f"ControlPath={control}", "-M", "-o", "ControlPersist=yes", "-fN",
                        "--", "orch-login"], stdin=subprocess.DEVNULL, stdout=log, stderr=log, check=True, timeout=60)
    laptop = [sys.executable, "-m", "orchestrator"]
    try:
        _, out = timed([*laptop, "submit", "spec.yaml"], cwd=project, env=env)
        run_id = re.search(r"submitted (\S+) on", out.stdout)[1]  # type: ignore[index]
        checkout = re.search(r"run folder (\S+)/runs/", out.stdout)[1]  # type: ignore[index]
        timed([*laptop, "cancel", run_id], env=env)
        rows: dict[str, list[float]] = {k: [] for k in ("ssh true", "status there", "status --remote", "submit there",
                                                         "submit --remote", "submit --remote changed")}
        sessions: dict[str, int] = {}

        def remote(name: str, *args: str) -> None:
            calls.unlink(missing_ok=True)
            took, _ = timed([*laptop, *args], cwd=project, env=env)
            rows[name].append(took)
            sessions[name] = len(calls.read_text().splitlines())

        for r in range(a.rounds):
            rows["ssh true"].append(timed(["ssh", "-F", ssh_config, "-o", f"ControlPath={control}", "-o", "BatchMode=yes",
                                           "--", "orch-login", "true"])[0])
            rows["status there"].append(timed([*orch_login, "status", run_id], cwd=checkout)[0])
            remote("status --remote", "status", run_id)
            rows["submit there"].append(timed([*orch_login, "submit", "spec.yaml"], cwd=checkout)[0])
            timed([*orch_login, "cancel", run_id], cwd=checkout)
            remote("submit --remote", "submit", "spec.yaml")
            timed([*laptop, "cancel", run_id], env=env)
            (project / f"data{r}").mkdir()
            (project / f"data{r}" / "blob.bin").write_bytes(os.urandom(a.changed_mb * 1000 * 1000))
            remote("submit --remote changed", "submit", "spec.yaml")
            timed([*laptop, "cancel", run_id], env=env)
        med = {k: statistics.median(v) for k, v in rows.items()}
        print(f"{a.rounds} rounds, medians (login node: a network namespace over a veth, so a round trip is ~0.1 ms)")
        for name, value in med.items():
            extra = f"  ({sessions[name]} SSH session(s))" if name in sessions else ""
            print(f"  {name:24} {value:.3f} s{extra}")
        print(f"  status --remote - status there = {med['status --remote'] - med['status there']:+.3f} s "
              f"(one round trip {med['ssh true']:.3f} s + this side's interpreter)")
        print(f"  submit --remote - submit there = {med['submit --remote'] - med['submit there']:+.3f} s; with "
              f"{a.changed_mb} MB changed: {med['submit --remote changed'] - med['submit there']:+.3f} s")
        print(json.dumps({k: [round(x, 4) for x in v] for k, v in rows.items()}))
    finally:
        subprocess.run(["ssh", "-F", ssh_config, "-o", f"ControlPath={control}", "-O", "exit", "--", "orch-login"],
                       capture_output=True, timeout=30)
        shutil.rmtree(base, ignore_errors=True)
        with contextlib.suppress(OSError):
            base.parent.rmdir()


if __name__ == "__main__":
    main()
