"""What you submit is what runs, on the 2-node site-profile cluster, through the CLI as a user runs it:
a job held in the queue runs the code as it was at ``submit`` although the files were edited
before it started, and so does its requeued attempt; after a TIMEOUT, submitting again with a
longer ``slurm.time`` resumes the same run at its last checkpoint's step."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from orchestrator.backends.slurm.executor import SlurmExecutor
from orchestrator.core.records import RunRecord

from .test_rank_api_slurm import _run_releasing_requeues
from .test_slurm import no_job_processes

PROJECTS = Path("/srv/orch-test-projects")  # shared with the nodes, as a home folder is

SCRIPT = '''\
import os, pathlib, sys, time
import helper

ckpt = pathlib.Path(os.environ["ORCH_CHECKPOINT_DIR"])
ckpt.mkdir(parents=True, exist_ok=True)
here = pathlib.Path(sys.argv[sys.argv.index("--project") + 1])
done = sorted(int(p.name[5:15]) for p in ckpt.glob("ckpt-*.pt"))
start = done[-1] if done else 0
attempt = os.environ.get("ORCH_ATTEMPT")
print(f"VERSION helper={helper.V} script={MARK} start={start} attempt={attempt} file={__file__}", flush=True)
if "--crash-once" in sys.argv and not (here / "crashed").exists():
    (here / "started").write_text("1")
    deadline = time.time() + 120
    while not (here / "go").exists() and time.time() < deadline:
        time.sleep(0.2)
    (here / "crashed").write_text("1")
    raise RuntimeError("injected crash on the first attempt")
step = start
while not (here / "finish").exists() and step < 100000:
    step += 1
    (ckpt / f"ckpt-{step:010d}.pt").write_text(str(step))
    time.sleep(0.5)
print(f"ENDED at {step}", flush=True)
'''


@pytest.fixture
def project() -> Iterator[Path]:
    folder = PROJECTS / uuid.uuid4().hex[:10]
    folder.mkdir(parents=True)
    (folder / "train.py").write_text(SCRIPT.replace("MARK", "'A'"))
    (folder / "helper.py").write_text("V = 1\n")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            PROJECTS.rmdir()


def _spec(project: Path, cluster: dict[str, str], name: str, *extra_args: str, **slurm: object) -> Path:
    spec = {"name": name, "entrypoint": "train.py", "executor": "slurm", "nodes": 1, "cpu_ranks_per_node": 1,
            "runs_dir": cluster["runs_dir"], "extra_args": ["--project", str(project), *extra_args],
            "slurm": {"time": "00:10:00", **slurm}}
    path = project / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _orch(project: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=project, capture_output=True, text=True,
                          timeout=timeout)


def _submitted(out: subprocess.CompletedProcess[str]) -> RunRecord:
    assert out.returncode == 0, out.stderr
    run_dir = re.search(r"run folder (\S+)", out.stdout)
    assert run_dir, out.stdout
    return RunRecord.load(run_dir[1])


def _edit(project: Path) -> None:
    (project / "helper.py").write_text("V = 2\n")
    (project / "train.py").write_text(SCRIPT.replace("MARK", "'B'"))


def _log(record: RunRecord) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((Path(record.run_dir) / "slurm").glob("*_log.out")))


def _wait_for(path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)


def test_a_held_job_runs_the_code_as_submitted(cluster: dict[str, str], project: Path) -> None:
    (project / "finish").write_text("1")
    out = _orch(project, "submit", str(_spec(project, cluster, "snap-held", extra_sbatch={"hold": True})))
    record = _submitted(out)
    assert "identity: new run" in out.stderr, out.stderr
    _edit(project)  # while the job waits in the queue
    subprocess.run(["scontrol", "release", *record.job_ids], check=True, timeout=30)
    record = _run_releasing_requeues(SlurmExecutor(), record, 240)
    assert record.state == "COMPLETED", (record.error, _log(record)[-3000:])
    log = _log(record)
    assert "VERSION helper=1 script=A start=0" in log and "helper=2" not in log, log
    assert "/.code/trees/" in log  # imported from the snapshot, not the project folder
    code = json.loads((Path(record.run_dir) / "code.json").read_text())
    frozen = json.loads(Path(code["manifest"]).read_text())["files"]
    assert {"train.py", "helper.py", "spec.yaml"} <= set(frozen) and code["how"] == "folder", frozen
    diff = _orch(project, "diff", record.run_id)
    assert "modified  helper.py" in diff.stdout and "+V = 2" in diff.stdout, diff.stdout + diff.stderr
    assert no_job_processes()


def test_the_requeued_attempt_runs_the_submitted_code_too(cluster: dict[str, str], project: Path) -> None:
    (project / "finish").write_text("1")
    spec = _spec(project, cluster, "snap-requeue", "--crash-once")
    spec.write_text(spec.read_text() + "recovery: {max_restarts: 1}\n")
    record = _submitted(_orch(project, "submit", str(spec)))
    _wait_for(project / "started")
    _edit(project)  # while attempt 1 runs; attempt 2 starts after a requeue
    (project / "go").write_text("1")
    record = _run_releasing_requeues(SlurmExecutor(), record, 300)
    assert record.state == "COMPLETED", (record.error, _log(record)[-3000:])
    versions = re.findall(r"VERSION helper=(\d) script=(\w) start=\d+ attempt=(\d)", _log(record))
    assert [v[:2] for v in versions] == [("1", "A"), ("1", "A")] and versions[0][2] != versions[1][2], _log(record)
    assert no_job_processes()


def test_after_a_timeout_a_longer_time_limit_resumes_the_same_run(cluster: dict[str, str], project: Path) -> None:
    spec = _spec(project, cluster, "snap-timeout", time="00:01:00", signal_margin_s=20, requeue="never")
    first = _submitted(_orch(project, "submit", str(spec)))
    deadline = time.monotonic() + 240
    ex = SlurmExecutor()
    while not first.state.terminal:
        assert time.monotonic() < deadline, first
        time.sleep(2)
        first = ex.refresh([RunRecord.load(first.run_dir)])[0]
    assert first.state == "TIMEOUT", (first.state, first.error)
    saved = sorted(Path(first.run_dir, "checkpoints").glob("ckpt-*.pt"))
    assert saved, "the first attempt left no checkpoint"
    step = int(saved[-1].name[5:15])
    (project / "finish").write_text("1")
    spec = _spec(project, cluster, "snap-timeout", time="00:05:00", requeue="never")
    planned = _orch(project, "plan", str(spec))
    assert f"resumes run {first.run_id} at step {step}" in planned.stdout, planned.stdout
    second = _submitted(_orch(project, "submit", str(spec)))
    assert second.run_id == first.run_id
    second = _run_releasing_requeues(ex, second, 240)
    assert second.state == "COMPLETED", (second.error, _log(second)[-3000:])
    assert f"start={step} attempt=" in _log(second), _log(second)
    assert no_job_processes()
