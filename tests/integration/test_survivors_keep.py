"""recovery.survivors: keep on the local executor (issue 50, item 3): a rank killed mid-training is
forked again from the warm zygote beside the survivors, which keep their processes; the group is
rebuilt (jobs.heal) and the replacement gets the model, optimizer and step from a survivor by
broadcast, no checkpoint read. The run's weights equal an uninterrupted run's, bit for bit."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import torch

from orchestrator.core.recovery import History
from orchestrator.core.records import RunRecord
from tests.integration.helpers import final_weights, leftover_ranks, make_plan, start_detached, wait_ended

ARGS = {"dataset": "digits", "model": "smallcnn", "batch-size": 16, "lr": 0.05, "momentum": 0.9,
        "epochs": 1, "max-steps": 0, "log-every": 1}
STEPS = 1437 // 4 // 16  # one epoch of digits, 4 ranks of 16


def _train_steps(run_dir: str) -> list[int]:
    path = Path(run_dir) / "metrics" / "rank-0.jsonl"
    if not path.exists():
        return []
    return [r["step"] for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "train"]


def test_a_killed_rank_rejoins_the_survivors_and_training_stays_bit_exact(tmp_path: Path) -> None:
    # 4 ranks: with 2, a reduction is a single addition and would hide summation-order effects.
    whole = make_plan(tmp_path / "a", nodes=2, cpu_ranks_per_node=2, args=ARGS)
    start_detached(whole)  # the uninterrupted reference trains beside the run that loses a rank
    launch = make_plan(tmp_path / "b", nodes=2, cpu_ranks_per_node=2, args={**ARGS, "step-delay": 0.05},
                       checkpoint={"interval_steps": 1000},  # no checkpoint before the end: nothing to resume from
                       recovery={"max_restarts": 2, "survivors": "keep"})
    start_detached(launch)
    deadline = time.monotonic() + 120
    while len(_train_steps(launch.run_dir)) < 5:
        assert time.monotonic() < deadline, "training never started"
        time.sleep(0.05)
    before = RunRecord.load(launch.run_dir).rank_pids
    killed_after = max(_train_steps(launch.run_dir))
    os.kill(before[3], signal.SIGKILL)
    record = wait_ended(launch)
    assert record.state == "COMPLETED", record.error
    assert record.attempts == 2
    after = record.rank_pids
    assert after[:3] == before[:3] and after[3] != before[3]  # the survivors kept their processes
    named = json.loads((Path(launch.run_dir) / "ranks" / "rank-3.json").read_text())
    assert named["pid"] == after[3]  # ranks/ names the live process (stacks, chaos)
    first, second = History.load(launch.run_dir).attempts
    assert (first.outcome, first.action) == ("crash", "restart") and second.outcome == "completed"
    assert "first_step_at" in second.times  # the rejoined world trained
    # ... from where the survivors were, not their first step ever: status counts no lost work
    assert second.times["first_step"] >= killed_after - 1, (killed_after, second.times)
    logs = {r: (Path(launch.run_dir) / "logs" / f"rank-{r}.log").read_text() for r in range(4)}
    assert "rejoined in generation 1" in logs[0] and "state from rank 0" in logs[0]
    assert "resumed from" not in "".join(logs.values())  # no checkpoint was read
    steps = _train_steps(launch.run_dir)
    assert steps[-1] == STEPS and len(set(steps)) == STEPS  # every step trained, at most the one in flight again
    assert len(steps) - STEPS <= 1, steps
    supervisor = psutil.Process(record.supervisor_pid) if psutil.pid_exists(record.supervisor_pid) else None
    if supervisor is not None:  # it recorded the end: it exits now
        supervisor.wait(timeout=30)
    assert not leftover_ranks(launch.run_dir)
    assert wait_ended(whole).state == "COMPLETED"
    a, b = final_weights(whole), final_weights(launch)
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after the rejoin"


def test_without_the_rank_api_every_rank_restarts(tmp_path: Path) -> None:
    """A script that cannot rejoin (no jobs.Healer, so it never said it can): no replacement is
    forked beside its survivors (one would join their stale group, and a survivor would train on
    with a peer resumed from an older snapshot); every rank restarts, as survivors: restart does."""
    from tests.integration.helpers import SCRIPTS, run_local

    launch = make_plan(tmp_path, entrypoint=str(SCRIPTS / "flaky_snapshot.py"), nodes=1, cpu_ranks_per_node=2,
                       args={"ckpt": str(tmp_path / "ckpt"), "mode": "crash_once"},
                       checkpoint={"dir": str(tmp_path / "ckpt")},
                       recovery={"max_restarts": 3, "survivors": "keep"})
    record = run_local(launch)
    assert record.state == "COMPLETED", record.error
    assert json.loads((tmp_path / "ckpt" / "done.json").read_text()) == {"steps": 12, "start": 6}
    assert [a.outcome for a in History.load(launch.run_dir).attempts] == ["crash", "completed"]
    logs = "".join((Path(launch.run_dir) / "logs" / f"rank-{r}.log").read_text() for r in range(2))
    assert "replaced" not in logs and "kept its process" not in logs


def test_a_rank_that_fails_at_the_same_step_again_stops_with_no_progress(tmp_path: Path) -> None:
    """The replacement resumes at the survivors' step and fails there again: each rejoin completes
    (generations 1 and 2), but the world never gets past the step, so the second failure in a row
    without a new step stops the run ("no progress") instead of using every restart."""
    from tests.integration.helpers import SCRIPTS, run_local

    launch = make_plan(tmp_path, entrypoint=str(SCRIPTS / "heal_loop.py"), nodes=1, cpu_ranks_per_node=3,
                       args={"crash": "1:10"},
                       recovery={"max_restarts": 6, "survivors": "keep"})
    record = run_local(launch)
    assert record.state == "FAILED"
    assert (record.error or "").startswith("no progress: 2 attempt(s) in a row"), record.error
    attempts = History.load(launch.run_dir).attempts
    assert [a.action for a in attempts] == ["restart", "restart", "stop"]
    assert [a.progress for a in attempts] == [True, False, False]
    log0 = (Path(launch.run_dir) / "logs" / "rank-0.log").read_text()
    assert "rejoined in generation 1" in log0 and "rejoined in generation 2" in log0
    assert "or training past the last step" in (record.error or "")


def test_a_user_loop_on_the_healer_finishes_with_the_weights_of_a_run_without_failure(tmp_path: Path) -> None:
    from tests.integration.helpers import SCRIPTS, run_local

    def checksum(run_dir: str) -> str:
        text = (Path(run_dir) / "logs" / "rank-0.log").read_text()
        return text.rsplit("final step 40 checksum ", 1)[1].split()[0]

    whole = make_plan(tmp_path / "a", entrypoint=str(SCRIPTS / "heal_loop.py"), nodes=1, cpu_ranks_per_node=3,
                      args={"step-s": 0.0})
    assert run_local(whole).state == "COMPLETED"
    # rank 2 fails at step 12, then rank 0 (the state's source so far) at step 25: two rejoins,
    # generations 1 and 2; each replacement resumes at the survivors' step and passes it
    launch = make_plan(tmp_path / "b", entrypoint=str(SCRIPTS / "heal_loop.py"), nodes=1, cpu_ranks_per_node=3,
                       args={"crash": ["2:12", "0:25"], "once": True},
                       recovery={"max_restarts": 2, "survivors": "keep"})
    record = run_local(launch)
    assert record.state == "COMPLETED", record.error
    assert [a.action for a in History.load(launch.run_dir).attempts] == ["restart", "restart", ""]
    logs = [(Path(launch.run_dir) / "logs" / f"rank-{r}.log").read_text() for r in range(3)]
    assert "rejoined in generation 2 with rank(s) 0" in logs[1] and "state from rank 1" in logs[1]
    assert checksum(launch.run_dir) == checksum(whole.run_dir)


def test_a_hung_rank_alone_is_replaced_and_the_survivors_rejoin_it(tmp_path: Path) -> None:
    """watchdog.stall_s names the straggler (rank 1, asleep outside any collective while its peers
    wait in the next one); only it is killed, its peers' collective fails on the lost peer, and
    they rejoin its replacement: chaos --stop-rank's case, recovered without a restart of all."""
    from tests.integration.helpers import SCRIPTS

    launch = make_plan(tmp_path, entrypoint=str(SCRIPTS / "heal_loop.py"), nodes=1, cpu_ranks_per_node=3,
                       args={"hang": "1:15", "once": True, "say-steps": True}, watchdog={"stall_s": 3},
                       recovery={"max_restarts": 1, "survivors": "keep"})
    from orchestrator.backends.local.supervisor import Supervisor
    from orchestrator.executors.base import prepare_run_dir

    echoed: list[tuple[int, str]] = []
    record = Supervisor(launch, *prepare_run_dir(launch),
                        echo_factory=lambda: lambda rank, line: echoed.append((rank, line))).run()
    assert record.state == "COMPLETED", record.error
    first, second = History.load(launch.run_dir).attempts
    assert (first.outcome, first.action) == ("hang", "restart") and second.outcome == "completed"
    logs = [(Path(launch.run_dir) / "logs" / f"rank-{r}.log").read_text() for r in range(3)]
    assert "rejoined in generation 1 with rank(s) 1" in logs[0] and "final step 40" in logs[0]
    # a survivor's output is echoed once, the rejoin's watch going on from where the first stopped
    said = [line for rank, line in echoed if rank == 0]
    assert "trained step 1" in said and said == logs[0].split("===\n", 1)[1].splitlines()
    assert "rank 0 kept its process" in logs[0] and "rank 1 replaced" in logs[1]
