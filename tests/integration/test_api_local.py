"""The Python API as a notebook drives it: no spec file, a JobSpec built in Python, a handle."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.integration.helpers import leftover_ranks


def _spec(tmp_path: Path, name: str = "api", **fields: object) -> object:
    from orchestrator import JobSpec

    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    fields = {"nodes": 2, "cpu_ranks_per_node": 2, **fields}
    return JobSpec(name=name, entrypoint="tests.integration.scripts.api_job:main", args={"out": str(out)},
                   runs_dir=str(tmp_path / "runs"), **fields)


def test_run_from_python_waits_and_reads_result_and_logs(tmp_path: Path) -> None:
    """The issue's acceptance: 2 nodes x 2 CPU ranks from Python, run, wait, result, logs(rank=3)."""
    from orchestrator import Run, run

    t0 = time.monotonic()
    handle = run(_spec(tmp_path, env={"API_JOB_ENV": "seen"}))
    assert time.monotonic() - t0 < 120
    assert handle.state == "COMPLETED", handle.error
    assert handle.wait(timeout=5) == "COMPLETED"
    assert handle.result() == {"world": 4, "sum": 6.0}
    assert "api_job: rank 3 of 4 sum 6" in handle.logs(rank=3)
    assert "attempt 1 started" in handle.logs(rank=3)
    rows = [json.loads((tmp_path / "out" / f"rank-{r}.json").read_text()) for r in range(4)]
    assert [(r["rank"], r["node_rank"]) for r in rows] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert [r["api_job_env"] for r in rows] == ["seen"] * 4  # the spec's env reached every rank
    assert handle.run_dir == tmp_path / "runs" / handle.id
    again = Run.get(handle.id)  # found again by id, by prefix and by folder
    assert again.run_dir == handle.run_dir == Run.get(handle.id[:6]).run_dir == Run.get(str(handle.run_dir)).run_dir
    assert again.status() == "COMPLETED"
    with pytest.raises(Exception, match="ranks 0-3"):
        handle.logs(rank=4)


@pytest.mark.parametrize("preload", [False, True], ids=["fresh", "forked"])
def test_ranks_are_named_in_ps(tmp_path: Path, preload: bool) -> None:
    pytest.importorskip("setproctitle")
    from orchestrator.backends.local import zygote

    if preload and "setproctitle" not in Path(zygote.__file__).read_text():
        pytest.skip("forked ranks are named once the zygote sets setproctitle up before it forks "
                    "(a forked rank clears its environment, after which setproctitle cannot start)")
    from orchestrator import run

    # one node of 2 ranks: each fresh rank imports torch itself, and naming is per rank
    handle = run(_spec(tmp_path, name="titled", nodes=1, local={"preload_torch": preload}))
    assert handle.state == "COMPLETED", handle.error
    titles = [json.loads((tmp_path / "out" / f"rank-{r}.json").read_text())["title"] for r in range(2)]
    started_as = "orchestrator.backends.local.zygote" if preload else " orchestrator.node.launcher "
    for rank, title in enumerate(titles):
        assert title.startswith(f"orchestrator: titled rank {rank}/2 ("), title
        assert started_as in title  # the command line it replaced stays readable


def test_detached_run_wait_with_timeout_then_cancel(tmp_path: Path) -> None:
    """run(wait=False) returns at once; wait(timeout) is bounded and says the run goes on; cancel
    stops every rank; result() of a cancelled run names the state."""
    from orchestrator import JobSpec, JobFailedError, RunNotFinishedError, WaitTimeoutError, run

    spec = JobSpec(name="slow", entrypoint="jobs.train:main", nodes=1, cpu_ranks_per_node=2,
                   runs_dir=str(tmp_path / "runs"),
                   args={"dataset": "digits", "epochs": 50, "batch-size": 16, "step-delay": 0.05,
                         "stop-check-every": 1})
    t0 = time.monotonic()
    handle = run(spec, wait=False)
    assert time.monotonic() - t0 < 30
    assert handle.state in ("PENDING", "RUNNING")
    with pytest.raises(RunNotFinishedError, match=r"call \.wait\(\) first"):
        handle.result()
    t0 = time.monotonic()
    with pytest.raises(WaitTimeoutError, match="it goes on") as caught:
        handle.wait(timeout=1.0)
    assert isinstance(caught.value, TimeoutError)
    assert time.monotonic() - t0 < 5
    assert handle.cancel() == "CANCELLED"
    assert handle.wait(timeout=30) == "CANCELLED"
    with pytest.raises(JobFailedError, match="ended CANCELLED"):
        handle.result()
    assert not leftover_ranks(str(handle.run_dir))


def test_a_failed_run_raises_with_the_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator import JobFailedError, run

    monkeypatch.setenv("CRASH_RANK", "1")
    handle = run({"name": "boom", "entrypoint": "tests.integration.scripts.crash:main", "nodes": 1,
                  "cpu_ranks_per_node": 2, "runs_dir": tmp_path / "runs"})
    assert handle.state == "FAILED"
    with pytest.raises(JobFailedError, match=r"boom on rank 1.*logs\(rank=1\)"):
        handle.result()
