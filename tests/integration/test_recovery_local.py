"""recovery on the local executor: the ranks restart in place after a crash or a hang, from the
script's own snapshot, and a failure that repeats without progress stops with "no progress"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.core.recovery import History
from tests.integration.helpers import SCRIPTS, make_plan, run_local


def _flaky(tmp_path: Path, mode: str, recovery: dict[str, Any], **fields: Any):
    ckpt = tmp_path / "ckpt"
    return make_plan(tmp_path, entrypoint=str(SCRIPTS / "flaky_snapshot.py"), nodes=1, cpu_ranks_per_node=2,
                     args={"ckpt": str(ckpt), "mode": mode}, checkpoint={"dir": str(ckpt)},
                     recovery=recovery, **fields), ckpt


def test_a_crash_restarts_in_place_and_resumes_from_the_snapshot(tmp_path: Path) -> None:
    launch, ckpt = _flaky(tmp_path, "crash_once", {"max_restarts": 2})
    record = run_local(launch)
    assert record.state == "COMPLETED", record.error
    assert record.attempts == 2
    assert json.loads((ckpt / "done.json").read_text()) == {"steps": 12, "start": 6}  # resumed, not from 0
    history = History.load(launch.run_dir)
    first, second = history.attempts
    assert (first.outcome, first.action, first.progress) == ("crash", "restart", True)
    assert "injected crash at step 7" in first.why
    assert (second.number, second.outcome) == (2, "completed")
    # the first attempt's traceback is kept, not shown as this attempt's
    assert list((Path(launch.run_dir) / "attempts" / "1" / "errors").glob("rank-*.json"))
    assert not list((Path(launch.run_dir) / "errors").glob("rank-*.json"))


def test_without_recovery_a_crash_ends_the_run(tmp_path: Path) -> None:
    launch, ckpt = _flaky(tmp_path, "crash_once", {})
    record = run_local(launch)
    assert record.state == "FAILED" and record.attempts == 1
    assert "injected crash" in (record.error or "")
    assert History.load(launch.run_dir).attempts[0].action == "stop"


def test_a_hang_restarts_after_stall_s(tmp_path: Path) -> None:
    launch, ckpt = _flaky(tmp_path, "hang_once", {"max_restarts": 1, "on": ["hang"]}, watchdog={"stall_s": 4})
    record = run_local(launch)
    assert record.state == "COMPLETED", record.error
    assert record.attempts == 2
    first = History.load(launch.run_dir).attempts[0]
    assert (first.outcome, first.action) == ("hang", "restart")
    assert json.loads((ckpt / "done.json").read_text())["start"] == 6


def test_a_hang_does_not_restart_when_on_leaves_it_out(tmp_path: Path) -> None:
    launch, ckpt = _flaky(tmp_path, "hang_once", {"max_restarts": 1, "on": ["crash"]}, watchdog={"stall_s": 4})
    record = run_local(launch)
    assert record.state == "FAILED" and record.attempts == 1
    assert not (ckpt / "done.json").exists()


def test_a_failure_that_repeats_without_progress_stops_with_no_progress(tmp_path: Path) -> None:
    launch, ckpt = _flaky(tmp_path, "crash_always", {"max_restarts": 5, "stop_without_progress": 2})
    record = run_local(launch)
    assert record.state == "FAILED"
    assert record.attempts == 2  # not 6: the second failure without a checkpoint stops it
    assert (record.error or "").startswith("no progress: 2 attempt(s) in a row")
    assert "always fails before its first checkpoint" in (record.error or "")
    assert [a.action for a in History.load(launch.run_dir).attempts] == ["restart", "stop"]


def test_a_failing_node_check_fails_before_any_rank_starts(tmp_path: Path) -> None:
    launch, ckpt = _flaky(tmp_path, "crash_once", {"node_check": ["sh", "-c", "echo GPU 3 has ECC errors; exit 4"]})
    record = run_local(launch)
    assert record.state == "FAILED"
    assert "GPU 3 has ECC errors" in (record.error or "") and "exit code 4" in (record.error or "")
    assert not ckpt.exists() or not (ckpt / "state.json").exists()  # no rank ran
    assert History.load(launch.run_dir).attempts[0].outcome == "unhealthy"


def test_a_rank_api_script_restarts_from_its_checkpoint(tmp_path: Path) -> None:
    launch = make_plan(tmp_path, entrypoint=str(SCRIPTS / "rank_api_crash_once.py"), nodes=2, cpu_ranks_per_node=1,
                       checkpoint={"interval_steps": 5}, recovery={"max_restarts": 1})
    record = run_local(launch)
    assert record.state == "COMPLETED", record.error
    logs = "".join(p.read_text() for p in sorted((Path(launch.run_dir) / "logs").glob("rank-*.log")))
    assert "injected crash at step 7" in logs
    assert logs.count("resumed at step 5") == 2 and logs.count("finished at step 10") == 2, logs[-2000:]
    first, second = History.load(launch.run_dir).attempts
    assert (first.outcome, first.action, first.progress) == ("crash", "restart", True)


def _warm(tmp_path: Path, **args: int):
    out = tmp_path / "seen"
    launch = make_plan(tmp_path, entrypoint=str(SCRIPTS / "warm_parent.py"), nodes=1, cpu_ranks_per_node=2,
                       args={"out": str(out), **{k.replace("_", "-"): v for k, v in args.items()}},
                       recovery={"max_restarts": 3, "stop_without_progress": 5})
    return launch, out


def _seen(out: Path) -> dict[tuple[int, int], dict[str, Any]]:
    found = {}
    for path in out.glob("attempt-*-rank-*.json"):
        _, attempt, _, rank = path.stem.split("-")
        found[(int(attempt), int(rank))] = json.loads(path.read_text())
    return found


def test_every_attempt_forks_from_the_same_warm_zygote(tmp_path: Path) -> None:
    """Issue 50: a restart forks its ranks from the run's warm zygote (torch already imported),
    not from a new interpreter; the zygote is gone once the run is."""
    import psutil

    launch, out = _warm(tmp_path, fail_attempts=2)
    record = run_local(launch)
    assert record.state == "COMPLETED", record.error
    assert record.attempts == 3
    seen = _seen(out)
    assert set(seen) == {(a, r) for a in (0, 1, 2) for r in (0, 1)}  # ORCH_ATTEMPT counts from 0
    parents = {v["ppid"] for v in seen.values()}
    assert len(parents) == 1, seen  # one zygote forked every attempt's ranks
    assert all(v["torch_loaded"] for v in seen.values())  # forked after its import of torch
    assert not psutil.pid_exists(parents.pop())


def test_a_zygote_lost_mid_attempt_is_replaced_by_a_new_one(tmp_path: Path) -> None:
    launch, out = _warm(tmp_path, fail_attempts=0, kill_parent_on=0)
    record = run_local(launch)
    assert record.state == "COMPLETED", record.error
    assert record.attempts == 2
    first = History.load(launch.run_dir).attempts[0]
    assert "local launcher process" in first.why and first.action == "restart"
    seen = _seen(out)
    assert seen[(0, 0)]["ppid"] != seen[(1, 0)]["ppid"] == seen[(1, 1)]["ppid"]
