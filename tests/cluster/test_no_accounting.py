"""A real cluster without accounting (issue 32, item 3): ``deploy/cluster.sh up --no-accounting``,
no slurmdbd, AccountingStorageType=accounting_storage/none, so sacct answers "Slurm accounting
storage is disabled". submit, ``status``, ``submit --wait``, ``cancel`` and a 2-stage pipeline work
and report the right end states (COMPLETED, FAILED, CANCELLED) from squeue; once the controller
no longer knows a job (MinJobAge, here a controller that restarted with its state cleared), from
what the job's agent recorded in the run folder, and UNKNOWN, saying why, when it recorded
nothing.

This module runs last (tests/cluster/conftest.py): its fixture rebuilds the session's cluster
without accounting. Short jobs only; nothing waits out a time limit."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from orchestrator.cli import main
from orchestrator.backends.slurm import executor as slurm, slurm_status
from orchestrator.backends.slurm.executor import SlurmExecutor
from orchestrator.front.pipeline import pipeline_status, run_pipeline
from orchestrator.core.records import RunRecord
from orchestrator.core.recovery import History
from orchestrator.core.states import State

from .conftest import CLUSTER_DIR
from .test_slurm import SCHEDULER

#: A job that sleeps --seconds, then exits with --code.
JOB = """import sys, time
time.sleep(float(sys.argv[sys.argv.index("--seconds") + 1]))
sys.exit(int(sys.argv[sys.argv.index("--code") + 1]))
"""


@pytest.fixture
def no_acct(cluster_without_accounting: dict[str, str], tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The cluster without accounting, a folder of specs, and a record of every scheduler command
    this process runs. What this process learned about the cluster's accounting is forgotten
    first: each test finds out again, as a fresh ``orchestrator`` process would."""
    monkeypatch.setattr(slurm_status, "ACCOUNTING_OFF", {})
    calls: list[list[str]] = []
    real = subprocess.run

    def counting(cmd: Any, *a: Any, **k: Any) -> Any:
        if isinstance(cmd, (list, tuple)) and Path(str(cmd[0])).name in SCHEDULER:
            calls.append([str(c) for c in cmd])
        return real(cmd, *a, **k)

    monkeypatch.setattr(subprocess, "run", counting)
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "job.py").write_text(JOB)
    yield {"cluster": cluster_without_accounting, "folder": folder, "calls": calls}


def _spec(ctx: dict[str, Any], name: str, seconds: float = 0.5, code: int = 0, **fields: Any) -> str:
    path = ctx["folder"] / f"{name}.yaml"
    path.write_text(json.dumps({
        "name": name, "entrypoint": str(ctx["folder"] / "job.py"), "executor": "slurm", "nodes": 1,
        "cpu_ranks_per_node": 1, "runs_dir": ctx["cluster"]["runs_dir"], "code": {"snapshot": False},
        "slurm": {"time": "00:05:00", "max_requeues": 0, **fields.pop("slurm", {})},
        "args": {"seconds": seconds, "code": code}, **fields}))
    return str(path)


def _submit(spec: str, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, RunRecord]:
    rc = main(["submit", spec, *flags])
    out = capsys.readouterr().out
    run_dir = out.split("run folder ")[1].split()[0].rstrip(";")
    return rc, out, RunRecord.load(run_dir)


def _tools(calls: list[list[str]]) -> list[str]:
    return [Path(c[0]).name for c in calls]


def _until_ended(records: list[RunRecord], timeout: float = 120) -> list[RunRecord]:
    """Refresh until every run has ended (twice a second: the test's own pace, not a client's)."""
    ex, deadline = SlurmExecutor(), time.monotonic() + timeout
    while True:
        records = ex.refresh([RunRecord.load(r.run_dir) for r in records])
        if all(r.state.terminal for r in records):
            return records
        assert time.monotonic() < deadline, [(r.run_id, r.state) for r in records]
        time.sleep(0.5)


def test_sacct_is_disabled_on_this_cluster(no_acct: dict[str, Any]) -> None:
    out = subprocess.run(["sacct", "-n", "-X"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "Slurm accounting storage is disabled" in out.stderr, out
    status = subprocess.run(["bash", "deploy/cluster.sh", "status", "--dir", str(CLUSTER_DIR)], capture_output=True,
                            text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert "accounting: off" in status.stdout and "slurmdbd:" not in status.stdout, status.stdout


def test_submit_wait_status_and_cancel_report_the_right_end_states(no_acct: dict[str, Any],
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    calls = no_acct["calls"]
    # `orchestrator submit --wait` as a user runs it (its own process finds out that sacct is
    # disabled), beside this process's status and cancel of two other runs.
    waiting = subprocess.Popen([sys.executable, "-m", "orchestrator", "submit", _spec(no_acct, "na-done"), "--wait"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, _, sleeper = _submit(_spec(no_acct, "na-sleeper", seconds=300), capsys)
    _, _, failing = _submit(_spec(no_acct, "na-failing", code=3), capsys)
    calls.clear()
    failing = _until_ended([failing])[0]
    assert failing.state == State.FAILED, failing
    # sacct was asked once, said accounting is off, and was never asked again: squeue alone answers
    assert _tools(calls).count("sacct") == 1 and "squeue" in _tools(calls), calls
    assert "accounting_storage/none" in (slurm.accounting_off() or "")

    calls.clear()
    assert main(["status", sleeper.run_dir, failing.run_dir]) == 0
    shown = capsys.readouterr().out
    assert _tools(calls) == ["squeue"], calls  # one query for both runs
    assert _rows(shown) == {sleeper.run_id: "RUNNING", failing.run_id: "FAILED"}, shown

    started = time.monotonic()
    assert main(["cancel", sleeper.run_dir]) == 0
    assert f"{sleeper.run_id}: CANCELLED" in capsys.readouterr().out
    assert time.monotonic() - started < 40  # the ranks' stop grace and a few squeue calls, no more
    assert "sacct" not in _tools(calls)

    out, err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0 and ": COMPLETED" in out, (out, err)
    done = RunRecord.load(out.split("run folder ")[1].split()[0].rstrip(";"))
    assert done.state == State.COMPLETED
    assert main(["status", done.run_dir, sleeper.run_dir, failing.run_dir]) == 0
    assert _rows(capsys.readouterr().out) == {done.run_id: "COMPLETED", sleeper.run_id: "CANCELLED",
                                              failing.run_id: "FAILED"}


def _rows(shown: str) -> dict[str, str]:
    """status's lines: run id -> state."""
    return {line.split()[0]: line.split()[1] for line in shown.splitlines() if line.startswith("na-")}


def test_a_two_stage_pipeline_runs_in_order_and_a_failed_stage_cancels_its_child(no_acct: dict[str, Any]) -> None:
    folder, runs = no_acct["folder"], no_acct["cluster"]["runs_dir"]
    pipelines = {}
    for name, prep_code in (("good", 0), ("bad", 3)):
        for stage, code in (("prep", prep_code), ("train", 0)):
            (folder / f"{name}-{stage}.yaml").write_text(json.dumps({
                "name": f"na-{name}-{stage}", "entrypoint": str(folder / "job.py"), "executor": "slurm", "nodes": 1,
                "cpu_ranks_per_node": 1, "runs_dir": runs, "code": {"snapshot": False},
                "slurm": {"time": "00:05:00", "max_requeues": 0}, "args": {"seconds": 0.5, "code": code}}))
        pipelines[name] = folder / f"{name}.yaml"
        pipelines[name].write_text(f"stages:\n  prep: {{spec: {name}-prep.yaml}}\n"
                                   f"  train: {{spec: {name}-train.yaml, after: [prep]}}\n")
    good, bad = run_pipeline(pipelines["good"]), run_pipeline(pipelines["bad"])
    assert [r.action for r in good + bad] == ["submitted"] * 4, good + bad
    records = _until_ended([RunRecord.load(Path(runs) / r.run_id) for r in good + bad])
    assert [r.state for r in records] == ["COMPLETED", "COMPLETED", "FAILED", "CANCELLED"], records
    prep, train = (History.load(r.run_dir).attempts[-1] for r in records[:2])
    assert prep.ended is not None and train.started >= prep.ended, (prep, train)  # afterok held train back
    assert not History.load(records[3].run_dir).attempts  # SLURM cancelled it before it ever ran
    assert {r.name: r.state for r in pipeline_status(pipelines["bad"])} == {"prep": "FAILED", "train": "CANCELLED"}
    again = run_pipeline(pipelines["good"])  # both COMPLETED: nothing is submitted again
    assert [(r.action, r.state) for r in again] == [("skipped", "COMPLETED")] * 2, again


def _restart_controller_forgetting_jobs() -> None:
    """slurmctld again, with its saved state cleared (-c): it no longer knows any job, as it stops
    knowing each one MinJobAge (300 s on the site profile) after its end."""
    pid = int((CLUSTER_DIR / "slurmctld.pid").read_text())
    subprocess.run(["kill", str(pid)], check=True)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z":
        assert time.monotonic() < deadline, "slurmctld did not stop"
        time.sleep(0.1)
    subprocess.run(["slurmctld", "-c", "-f", str(CLUSTER_DIR / "slurm.conf")], check=True, timeout=60)
    while "UP" not in subprocess.run(["scontrol", "ping"], capture_output=True, text=True).stdout:
        assert time.monotonic() < deadline, "slurmctld did not come back"
        time.sleep(0.2)


def _agent_ended(record: RunRecord, timeout: float = 120) -> None:
    """Until the job's agent recorded its attempt's end and squeue lists the job no more as running."""
    deadline = time.monotonic() + timeout
    while True:
        attempts = History.load(record.run_dir).attempts
        queued = subprocess.run(["squeue", "-h", "-o", "%T", "-j", record.job_ids[0]], capture_output=True,
                                text=True).stdout.split()
        if attempts and attempts[-1].ended is not None and not queued:
            return
        assert time.monotonic() < deadline, (attempts, queued)
        time.sleep(0.3)


def test_jobs_the_controller_forgot_end_as_their_agents_recorded(no_acct: dict[str, Any],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """No accounting and no controller record: COMPLETED and FAILED from the agents' records (never
    COMPLETED without one), and UNKNOWN, with the reason, for a job whose agent never ran."""
    _, _, done = _submit(_spec(no_acct, "na-forgot-done"), capsys)
    _, _, failing = _submit(_spec(no_acct, "na-forgot-failing", code=3), capsys)
    _, _, held = _submit(_spec(no_acct, "na-forgot-held", slurm={"extra_sbatch": {"begin": "now+1hour"}}), capsys)
    for record in (done, failing):
        _agent_ended(record)
    _restart_controller_forgetting_jobs()
    calls = no_acct["calls"]
    calls.clear()
    assert main(["status", done.run_dir, failing.run_dir, held.run_dir]) == 0
    shown = capsys.readouterr().out
    assert _tools(calls) == ["sacct", "squeue"], calls
    assert _rows(shown) == {done.run_id: "COMPLETED", failing.run_id: "FAILED", held.run_id: "UNKNOWN"}, shown
    assert (f"job {held.job_ids[0]} is no longer known to SLURM" in shown and "no attempt of it is recorded" in shown
            and "how it ended is unknown" in shown), shown
    assert RunRecord.load(done.run_dir).ended is not None
