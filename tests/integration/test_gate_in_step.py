"""The health gate inside the ranks' own srun step (orchestrator.backends.slurm.node.gate_step with the agent's
orchestrator.backends.slurm.node.agent_gate), without a cluster: the real job agent and the real
rank command on two stand-in nodes. A stand-in srun starts one task per node with SLURM's task
variables (each its own SLURMD_NODENAME), as srun would; scontrol and scancel are recording stubs.
The cluster tests run the same path on real SLURM daemons."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.core import lean_record
from orchestrator.core.recovery import History

NODES = ("gnode1", "gnode2")
PER_NODE = 2  # a node's second task waits on its first task's node-local copy of the decision

#: srun: the options are srun's (the gate's own step has --nodes and --ntasks-per-node; the ranks'
#: --output), then the command, run once a task (PER_NODE a node) with the task's variables; exits
#: as the worst task.
SRUN = """#!{python}
import os, subprocess, sys
args = sys.argv[1:]
calls = open({calls!r}, "a")
calls.write(" ".join(a for a in args if a.startswith("--")) + "\\n")
while args and args[0].startswith("--"):
    args = args[2:] if args[0] in ("--output",) else args[1:]
nodes, per_node = {nodes!r}, {per_node}
procs = []
for i, node in enumerate(nodes):
    for local in range(per_node):
        env = dict(os.environ, SLURM_PROCID=str(i * per_node + local), SLURM_LOCALID=str(local), SLURM_NODEID=str(i),
                   SLURM_NTASKS=str(len(nodes) * per_node), SLURM_STEP_NUM_NODES=str(len(nodes)),
                   SLURM_STEP_NODELIST=",".join(nodes), SLURMD_NODENAME=node, SLURM_STEP_ID="0")
        procs.append(subprocess.Popen(args, env=env))
sys.exit(max(p.wait() for p in procs))
"""

SCRIPT = """import os, sys, time
out = sys.argv[1]
open(os.path.join(out, "started-" + os.environ["RANK"]), "w").write(str(time.time()))
"""


def _job(tmp: Path, node_check: str | None = None) -> tuple[subprocess.CompletedProcess, Path, Path]:
    from orchestrator.plan import plan
    from orchestrator.spec.models import JobSpec

    out = tmp / "out"
    out.mkdir()
    script = tmp / "script.py"
    script.write_text(SCRIPT)
    recovery = {"node_check": [node_check]} if node_check else {}
    launch = plan(JobSpec(name="gate", entrypoint=str(script), extra_args=[str(out)], executor="slurm", nodes=2,
                          cpu_ranks_per_node=PER_NODE, runs_dir=str(tmp / "runs"), distributed={"interface": "lo"},
                          recovery=recovery))
    run_dir = Path(launch.run_dir)  # the ranks' srun names its payload there
    run_dir.mkdir(parents=True)
    lean_record.replace(launch.payload, rank_log=str(tmp / "rank-%t.log")).write(run_dir / "payload.json")
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(SRUN.format(python=sys.executable, calls=str(tmp / "srun-calls"), nodes=NODES, per_node=PER_NODE))
    for name in ("scontrol", "scancel"):
        (bin_dir / name).write_text(f"#!/bin/sh\necho {name} \"$@\" >> {tmp / 'calls'}\n")
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "91",
           "SLURM_JOB_NODELIST": ",".join(NODES), "SLURM_JOB_NUM_NODES": "2", "SLURM_CPUS_ON_NODE": "2"}
    done = subprocess.run([sys.executable, "-m", "orchestrator.backends.slurm.node.slurm_job", str(run_dir / "payload.json")],
                          env=env, capture_output=True, text=True, timeout=120)
    return done, out, run_dir


def test_a_healthy_job_runs_one_step_and_every_rank_starts_after_the_gate(tmp_path: Path) -> None:
    done, out, run = _job(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    calls = (tmp_path / "srun-calls").read_text().splitlines()
    assert len(calls) == 1 and "--gate" in calls[0], calls  # one srun: the ranks', with the gate in it
    assert sorted(p.name for p in out.iterdir()) == [f"started-{r}" for r in range(len(NODES) * PER_NODE)]
    from orchestrator.backends.slurm.node.gate_step import node_signal

    for node in NODES:  # each node's copy of the decision, gone once its other task read it
        here = node_signal(str(run), 1, node, {"SLURM_JOB_ID": "91", "SLURM_STEP_ID": "0"})
        assert not here.exists(), here
    assert "health gate: 2 node(s) healthy" in done.stderr and "inside the ranks' step" in done.stderr, done.stderr
    folder = run / "health" / "attempt-1"
    assert sorted(p.name for p in folder.glob("*.json")) == [f"{n}.json" for n in NODES]
    assert json.loads((folder / "decision" / "verdict.json").read_text()) == {"go": True, "why": ""}
    decided = (folder / "decision" / "verdict.json").stat().st_mtime
    assert all(float(p.read_text()) >= decided for p in out.iterdir())  # no entrypoint before the decision
    (attempt,) = History.load(run).attempts
    assert attempt.health == {} and attempt.times["gate_s"] < 30, attempt


def test_a_node_failing_the_gate_starts_no_entrypoint_and_is_blamed(tmp_path: Path) -> None:
    check = tmp_path / "node_check.sh"
    check.write_text('#!/bin/sh\nif [ "$ORCH_HEALTH_NODE" = gnode2 ]; then echo "GPU 0 has ECC errors"; exit 1; fi\n')
    check.chmod(0o755)
    done, out, run = _job(tmp_path, node_check=str(check))
    assert done.returncode != 0, done.stderr[-3000:]
    assert not list(out.iterdir()), "an entrypoint started although the gate failed"
    assert "health gate: gnode2: recovery.node_check" in done.stderr and "ECC errors" in done.stderr, done.stderr
    logs = "".join(p.read_text() for p in tmp_path.glob("rank-*.log")) + done.stderr
    assert "the health gate stopped the attempt: node(s) gnode2 failed it" in logs, logs[-3000:]
    (attempt,) = History.load(run).attempts
    assert attempt.outcome == "unhealthy" and attempt.blamed == ["gnode2"], attempt
    assert "ECC errors" in attempt.health["gnode2"] and "gnode1" not in attempt.health
    end = json.loads((run / "end.json").read_text())
    assert end["reason"] == "unhealthy" and "gnode2" in end["error"], end
    from orchestrator.backends.slurm.node.gate_step import node_signal

    for node in NODES:  # the node-local copies, gone though no entrypoint ran
        assert not node_signal(str(run), 1, node, {"SLURM_JOB_ID": "91", "SLURM_STEP_ID": "0"}).exists()
