"""Small user-facing fixes, each checked where the text is made:

- the login node's prune after a remote submission says when it kept trees holding files runs
  wrote, as ``gc`` says it (it printed only when something was removed or skipped);
- chaos's no-progress refusal names the checkpoint folder when no checkpoint ever appeared there,
  instead of "wait for its next checkpoint" (which would never come);
- a stopped rank (SIGSTOP, ^Z, a debugger) is named as stopped by the stall watchdog, locally and
  through the SLURM agent's capture, not as a rank that "did not answer the stack request";
- a restart cancelled before it trained shows no "recovered in" line (status, report); goodput
  still counts that time as recovery.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core import stacks
from orchestrator.core.attempt_times import goodput
from orchestrator.core.recovery import Attempt, History, describe
from orchestrator.core.states import Action, Outcome
from orchestrator.front import snapshot_prune
from orchestrator.front.chaos import Injection, budget_refusal
from orchestrator.front.report import recovery_lines
from orchestrator.node import forensics, stack_requests
from orchestrator.node.watchdog import Watch, judge
from orchestrator.plan import plan
from orchestrator.remote import remote_receive
from orchestrator.spec.loading import spec_from_dict

SITE = sysconfig.get_paths()["purelib"]
OURS = str(Path(stacks.__file__).parents[1] / "node")
#: rank 0's dump: its main thread waits in all_reduce.
IN_ALL_REDUCE = ('Current thread 0x00007f0000000001 (most recent call first):\n'
                 f'  File "{SITE}/torch/distributed/distributed_c10d.py", line 3913 in all_reduce\n'
                 '  File "/home/u/train.py", line 70 in <module>\n'
                 f'  File "{OURS}/launcher.py", line 50 in call_entrypoint\n')


# ---- 1. the prune after a remote submission -----------------------------------------------------
def test_the_login_node_says_which_trees_its_prune_kept_for_files_runs_wrote(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    held = snapshot_prune.Held(tree="trees/abc/proj", runs=("train-1a2b3c4d",), found="out/model.pt")
    report = snapshot_prune.Pruned(store=tmp_path, kept=3, held=[held])  # nothing removed, nothing skipped
    monkeypatch.setattr(snapshot_prune, "prune", lambda store: report)
    remote_receive._prune(tmp_path)
    said = capsys.readouterr().err
    assert said == report.line() + "\n", said  # the lines gc prints
    assert "kept trees/abc/proj (used by run train-1a2b3c4d)" in said and "out/model.pt" in said, said


def test_a_prune_with_nothing_to_say_stays_quiet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(snapshot_prune, "prune", lambda store: snapshot_prune.Pruned(store=tmp_path, kept=3))
    remote_receive._prune(tmp_path)
    assert capsys.readouterr().err == ""


# ---- 2. chaos's no-progress refusal -------------------------------------------------------------
def _recovery(tmp_path: Path) -> Any:
    spec = {"name": "c", "entrypoint": "jobs.train:main", "runs_dir": str(tmp_path / "runs"), "nodes": 1,
            "cpu_ranks_per_node": 2, "recovery": {"max_restarts": 5}}
    return plan(spec_from_dict(spec), "local").payload.recovery


def test_chaos_names_the_checkpoint_folder_that_never_held_a_checkpoint(tmp_path: Path) -> None:
    folder = str(tmp_path / "ckpt")
    never = History(tmp_path / "recovery.json", [
        Attempt(number=1, started=0.0, outcome="crash", progress=False, action="restart", checkpoint_dir=folder),
        Attempt(number=2, started=1.0, checkpoint_dir=folder)])
    said = budget_refusal("r", _recovery(tmp_path), never, Injection("kill-rank", rank=0), False) or ""
    assert f"no checkpoint ever appeared in {folder} (checkpoint.dir)" in said, said
    assert "waiting will not bring one" in said and "set checkpoint.dir to that folder" in said, said
    assert "wait for its next checkpoint" not in said and "\n" not in said, said


# ---- 3. a stopped rank, named as stopped ---------------------------------------------------------
def _stalled() -> Watch:
    watch = Watch(2, started=0.0, stall_s=5.0)
    watch.observe(1.0, {}, {}, [0, 1])  # both joined at 1.0, nothing since
    return watch


STOPPED_SAID = "straggler: rank 1: it is stopped (SIGSTOP, ^Z or a debugger): not asked for its stacks"


def test_the_local_watchdog_names_a_stopped_rank_as_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stack_requests, "request_local_explained",
                        lambda run_dir, ranks: ({0: IN_ALL_REDUCE}, {1: stack_requests.STOPPED}))
    verdict = judge(_stalled(), 10.0, lambda: [], lambda reason, always: forensics.capture_local(tmp_path, reason, [0, 1]))
    assert verdict is not None and verdict.rank == 1, verdict
    assert verdict.message.endswith(STOPPED_SAID), verdict.message
    assert "did not answer" not in verdict.message
    saved = (tmp_path / "stacks" / "rank-1.txt").read_text()
    assert f"(not asked: {stack_requests.STOPPED})" in saved, saved
    waits = forensics.waits_of(verdict.dumps)  # what run and status print under the verdict
    assert waits == {"0": "train.py:70 in <module>, waiting in all_reduce", "1": forensics.STOPPED_WAIT}, waits


def test_a_rank_that_did_not_answer_is_still_said_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stack_requests, "request_local_explained",
                        lambda run_dir, ranks: ({0: IN_ALL_REDUCE, 1: ""}, {}))
    verdict = judge(_stalled(), 10.0, lambda: [], lambda reason, always: forensics.capture_local(tmp_path, reason, [0, 1]))
    assert verdict is not None and verdict.rank == 1
    assert "it did not answer the stack request" in verdict.message, verdict.message


def test_the_slurm_agent_names_a_stopped_rank_as_the_local_supervisor_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.backends.slurm.node import stacks_probe
    from orchestrator.backends.slurm.node.agent_watch import AgentWatch

    from .test_survivors_slurm import agent_ctx

    ctx = agent_ctx(tmp_path)
    problem = f"rank 1: not asked: {stack_requests.STOPPED}"  # request_slurm's line for a probe's 'refused 1 ...'
    monkeypatch.setattr(stacks_probe, "request_slurm", lambda *a, **k: ({0: IN_ALL_REDUCE, 1: ""}, problem))
    verdict = judge(_stalled(), 10.0, lambda: [], AgentWatch(ctx, {}).capture)
    assert verdict is not None and verdict.rank == 1, verdict
    assert verdict.message.endswith(STOPPED_SAID), verdict.message
    assert 1 not in verdict.dumps  # no empty dump: the agent would take it for a rank outside any collective
    saved = (Path(ctx.run_dir) / "stacks" / "rank-1.txt").read_text()
    assert f"(not asked: {stack_requests.STOPPED})" in saved, saved


# ---- 4. a restart cancelled before it trained -----------------------------------------------------
def _crash_then(second: Attempt, folder: Path) -> History:
    first = Attempt(number=1, started=100.0, ended=131.0, outcome=Outcome.CRASH, action=Action.RESTART,
                    times={"ranks_at": 101.0, "joined_at": 104.0, "failed_at": 130.7})
    return History(folder / "recovery.json", [first, second])


def test_a_restart_cancelled_before_it_trained_recovered_nothing(tmp_path: Path) -> None:
    cancelled = Attempt(number=2, started=131.0, ended=131.5, outcome=Outcome.CANCELLED, times={"ranks_at": 131.0})
    history = _crash_then(cancelled, tmp_path)
    shown = "\n".join(describe(history))
    assert "attempt 2: cancelled" in shown, shown
    assert "recovered in" not in shown, shown
    lines = recovery_lines(history, 100.0)
    assert not any("recovered in" in line for line in lines), lines
    measured = goodput(history.attempts, 100.0, 200.0)  # the time still went to recovering: left as it was
    assert measured is not None and round(measured.recovery_s, 2) == 0.3, measured


def test_a_cancelled_attempt_that_trained_still_shows_its_recovery(tmp_path: Path) -> None:
    trained = Attempt(number=2, started=131.0, ended=140.0, outcome=Outcome.CANCELLED,
                      times={"ranks_at": 131.0, "joined_at": 133.0})
    history = _crash_then(trained, tmp_path)
    assert any("recovered in 2.3s from attempt 1" in line for line in describe(history)), describe(history)
    assert any("recovered in 2.3s" in line for line in recovery_lines(history, 100.0))
