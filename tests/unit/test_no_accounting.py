"""A SLURM cluster without accounting (no slurmdbd; issue 32, item 3): sacct answers "Slurm
accounting storage is disabled", so status, ``--wait``, ``cancel``, pipelines and ``after:`` work
from squeue and the run folder.

The pure parts are tested directly: which sacct answers mean "no accounting", and the end state a
job gets from its agent's record once squeue no longer lists it (``end_from_agent``: never
COMPLETED without the agent saying so). The refresh around them is tested with a scheduler that
answers as SLURM 22.05 did on ``deploy/cluster.sh up --no-accounting`` (sacct: exit 1 and that
line; ``squeue -t all``: finished jobs with their end states until MinJobAge; ``squeue -j ID`` of
one job it no longer knows: exit 1, "Invalid job id specified"). tests/cluster/test_no_accounting.py
runs the same against a real cluster without slurmdbd."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.spec.after import resolve, slurm_dependencies
from orchestrator.core.errors import SubmissionError
from orchestrator.core.end_verdict import EndVerdict
from orchestrator.backends.slurm.node import slurm_controller
from orchestrator.backends.slurm import executor as slurm, slurm_status
from orchestrator.backends.slurm.executor import (OUTCOME_STATE, SlurmExecutor, account_hint, end_from_agent,
                                          sacct_unusable)
from orchestrator.core.records import RunRecord, register
from orchestrator.core.recovery import Attempt, History
from orchestrator.spec.models import AfterSpec
from orchestrator.core.states import TERMINAL, State

DISABLED = "Slurm accounting storage is disabled\n"


# ---- which sacct answers mean "no accounting" ---------------------------------------------------
def test_only_a_disabled_or_missing_sacct_means_no_accounting() -> None:
    assert "accounting_storage/none" in (sacct_unusable(1, DISABLED) or "")
    assert sacct_unusable(None, "") == "sacct is not installed here"
    # slurmdbd down is a problem to report, not a cluster without accounting
    assert sacct_unusable(1, "sacct: error: Problem talking to the database: Connection refused") is None
    assert sacct_unusable(0, "") is None and sacct_unusable(0, DISABLED) is None


# ---- the end a job gets from its agent's record -------------------------------------------------
HISTORY = Path("/runs/r-0123abcd/recovery.json")


def _ended(job: str, outcome: str, action: str = "", number: int = 1, why: str = "") -> Attempt:
    return Attempt(number, 1.0, ["node1"], job=job, ended=2.0, outcome=outcome, action=action, why=why)


@pytest.mark.parametrize("outcome, state", sorted(OUTCOME_STATE.items()))
def test_the_agents_recorded_outcome_is_the_jobs_end(outcome: str, state: State) -> None:
    assert end_from_agent("7", [_ended("7", outcome)], None, False, HISTORY) == (state, "")
    assert state.terminal


def test_the_time_limits_sigterm_is_a_timeout_not_a_cancel() -> None:
    """At the limit the agent gets SIGTERM, which it records as 'cancelled'; end.json says time_limit."""
    attempts = [_ended("7", "cancelled")]
    assert end_from_agent("7", attempts, EndVerdict("time_limit"), False, HISTORY)[0] == State.TIMEOUT
    # orchestrator cancel asked: a cancel, whatever the notice before it
    assert end_from_agent("7", attempts, EndVerdict("time_limit"), True, HISTORY)[0] == State.CANCELLED
    assert end_from_agent("7", attempts, EndVerdict("stall"), False, HISTORY)[0] == State.CANCELLED


def test_a_cancelled_job_that_never_ran_is_cancelled() -> None:
    """orchestrator cancel of a pending job: no agent ever ran, the request is in the run folder."""
    assert end_from_agent("7", [], None, True, HISTORY) == (State.CANCELLED, "")


def test_an_earlier_submissions_attempts_say_nothing_about_this_job() -> None:
    attempts = [_ended("3", "completed")]  # the run's previous job, resubmitted as 7
    state, why = end_from_agent("7", attempts, None, False, HISTORY)
    assert state == State.UNKNOWN
    assert why.startswith("job 7 is no longer known to SLURM") and f"no attempt of it is recorded in {HISTORY}" in why


@pytest.mark.parametrize("attempts, seen", [
    ([], "no attempt of it is recorded in"),
    ([Attempt(1, 1.0, ["node1"], job="7")], "recorded attempt 1's start in"),
    ([_ended("7", "requeued", "requeue")], "recorded a requeue after attempt 1"),
    ([_ended("7", "crash", "restart")], "recorded a restart after attempt 1"),
    ([_ended("7", "lost", why="job 7 ended without its agent recording how")], "attempt 1 is recorded as lost"),
])
def test_unknown_only_when_neither_knows_and_the_line_says_why(attempts: list[Attempt], seen: str) -> None:
    state, why = end_from_agent("7", attempts, None, False, HISTORY)
    assert state == State.UNKNOWN and seen in why and "how it ended is unknown" in why, why
    assert "orchestrator logs RUN" in why


def test_the_last_attempt_of_the_job_decides() -> None:
    attempts = [_ended("7", "crash", "restart", 1), _ended("7", "completed", "", 2)]
    assert end_from_agent("7", attempts, None, False, HISTORY)[0] == State.COMPLETED
    attempts = [_ended("7", "completed", "", 1), _ended("7", "hang", "stop", 2)]
    assert end_from_agent("7", attempts, None, False, HISTORY)[0] == State.FAILED


OUTCOMES = st.sampled_from([*OUTCOME_STATE, "requeued", "lost", "weird", None])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["7", "8"]), OUTCOMES, st.sampled_from(["", "restart", "requeue", "stop"]),
                          st.booleans()), max_size=6),
       st.sampled_from([None, EndVerdict("time_limit"), EndVerdict("did_nothing")]), st.booleans())
def test_never_completed_unless_the_agent_recorded_it(rows, end, cancel) -> None:
    attempts = [Attempt(n + 1, 1.0, [], job=job, ended=2.0 if ended else None, outcome=outcome, action=action)
                for n, (job, outcome, action, ended) in enumerate(rows)]
    state, why = end_from_agent("7", attempts, end, cancel, HISTORY)
    mine = [a for a in attempts if a.job == "7"]
    if state == State.COMPLETED:
        assert mine[-1].outcome == "completed" and mine[-1].ended is not None
        assert mine[-1].action not in ("restart", "requeue")
    assert state.terminal or (state == State.UNKNOWN and why)
    assert (state == State.UNKNOWN) == bool(why)


# ---- refresh on a cluster without accounting --------------------------------------------------
class NoAccounting:
    """A scheduler as SLURM 22.05 answers without slurmdbd: sacct refuses; squeue -t all lists the
    jobs in ``queue`` ({id: state}), the others not at all. Counts its calls."""

    def __init__(self, queue: dict[str, str]) -> None:
        self.queue = queue
        self.calls: list[list[str]] = []

    def run(self, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        self.calls.append(list(cmd))
        if cmd[0] == "sacct":
            return subprocess.CompletedProcess(cmd, 1, "", DISABLED)
        if cmd[0] == "squeue":
            asked = cmd[cmd.index("-j") + 1].split(",")
            listed = [f"{j}|{s}\n" for j, s in self.queue.items() if j.split("_")[0] in asked]
            if not listed and len(asked) == 1:
                return subprocess.CompletedProcess(cmd, 1, "", "slurm_load_jobs error: Invalid job id specified\n")
            return subprocess.CompletedProcess(cmd, 0, "".join(listed), "")
        raise AssertionError(f"unexpected command {cmd}")

    def tools(self) -> list[str]:
        return [c[0] for c in self.calls]


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=orch\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(slurm_status, "ACCOUNTING_OFF", {})
    scheduler = NoAccounting({})
    monkeypatch.setattr(slurm_controller, "subprocess", SimpleNamespace(run=scheduler.run, TimeoutExpired=subprocess.TimeoutExpired))
    return SimpleNamespace(conf=conf, scheduler=scheduler, runs=tmp_path / "runs")


def _run(c: SimpleNamespace, name: str, job: str, state: State = State.RUNNING, **fields) -> RunRecord:
    folder = c.runs / f"{name}-0123abcd"
    folder.mkdir(parents=True)
    rec = RunRecord(run_id=folder.name, run_dir=str(folder), executor="slurm", state=state, job_ids=[job], **fields)
    rec.save()
    register(rec)
    return rec


def test_sacct_is_asked_once_then_squeue_alone_answers(cluster: SimpleNamespace) -> None:
    c = cluster
    c.scheduler.queue.update({"11": "RUNNING", "12": "PENDING"})
    recs = [_run(c, "a", "11"), _run(c, "b", "12")]
    ex = SlurmExecutor()
    assert [r.state for r in ex.refresh(recs)] == [State.RUNNING, State.PENDING]
    assert c.scheduler.tools() == ["sacct", "squeue"]
    assert "accounting_storage/none" in (slurm.accounting_off() or "")
    c.scheduler.calls.clear()
    for _ in range(3):
        ex.refresh([RunRecord.load(r.run_dir) for r in recs])
    assert c.scheduler.tools() == ["squeue"] * 3  # one query a refresh, for every run
    assert c.scheduler.calls[0][:5] == ["squeue", "-h", "-r", "-t", "all"]


def test_a_rebuilt_cluster_at_the_same_path_is_asked_again(cluster: SimpleNamespace) -> None:
    c = cluster
    c.scheduler.queue["11"] = "RUNNING"
    rec = _run(c, "a", "11")
    SlurmExecutor().refresh([rec])
    c.conf.write_text("ClusterName=orch\nAccountingStorageType=accounting_storage/slurmdbd\n")
    import os
    os.utime(c.conf, ns=(1, 1))  # a new mtime, whatever the clock's resolution
    c.scheduler.calls.clear()
    SlurmExecutor().refresh([RunRecord.load(rec.run_dir)])
    assert c.scheduler.tools() == ["sacct", "squeue"]


def test_squeues_end_states_are_used_while_it_lists_the_job(cluster: SimpleNamespace) -> None:
    c = cluster
    c.scheduler.queue.update({"21": "COMPLETED", "22": "FAILED", "23": "CANCELLED", "24": "TIMEOUT"})
    recs = [_run(c, f"s{j}", j) for j in ("21", "22", "23", "24")]
    assert [r.state for r in SlurmExecutor().refresh(recs)] == ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"]


def test_a_job_squeue_forgot_ends_as_its_agent_recorded(cluster: SimpleNamespace) -> None:
    """Past MinJobAge: the run folder tells, for each run, in the same one squeue call."""
    c = cluster
    done, crashed, cancelled, pending_cancel = (_run(c, n, j) for n, j in
                                                (("done", "31"), ("crashed", "32"), ("cancelled", "33"), ("pend", "34")))
    History(Path(done.run_dir) / "recovery.json", [_ended("31", "completed")]).save()
    History(Path(crashed.run_dir) / "recovery.json", [_ended("32", "crash", "stop", why="rank 1 raised")]).save()
    History(Path(cancelled.run_dir) / "recovery.json", [_ended("33", "cancelled")]).save()
    (Path(pending_cancel.run_dir) / "requests").mkdir()
    (Path(pending_cancel.run_dir) / "requests" / "cancel").write_text("{}")  # cancelled while pending
    fresh = SlurmExecutor().refresh([done, crashed, cancelled, pending_cancel])
    assert [r.state for r in fresh] == ["COMPLETED", "FAILED", "CANCELLED", "CANCELLED"]
    assert all(r.ended for r in fresh) and c.scheduler.tools() == ["sacct", "squeue"]
    assert [r.state for r in map(RunRecord.load, [r.run_dir for r in fresh])] == [r.state for r in fresh]


def test_unknown_with_a_clear_line_when_neither_knows(cluster: SimpleNamespace, capsys) -> None:
    c = cluster
    rec = _run(c, "lost", "41")
    History(Path(rec.run_dir) / "recovery.json", [Attempt(1, 1.0, ["node2"], job="41")]).save()
    fresh = SlurmExecutor().refresh([rec])[0]
    assert fresh.state == State.UNKNOWN and not fresh.ended
    assert fresh.error and fresh.error.startswith("job 41 is no longer known to SLURM"), fresh.error
    from orchestrator.front.operations import status

    capsys.readouterr()
    status([rec.run_dir])
    shown = capsys.readouterr().out
    assert "UNKNOWN" in shown and "recorded attempt 1's start" in shown and "how it ended is unknown" in shown
    # the agent's end shows up late (a slow shared filesystem): the line goes with the unknown
    History(Path(rec.run_dir) / "recovery.json", [_ended("41", "completed")]).save()
    again = SlurmExecutor().refresh([RunRecord.load(rec.run_dir)])[0]
    assert again.state == State.COMPLETED and again.error is None


def test_a_sweeps_tasks_each_end_as_their_points_agent_recorded(cluster: SimpleNamespace) -> None:
    c = cluster
    c.scheduler.queue["50_1"] = "RUNNING"
    rec = _run(c, "sweep", "50_0", sweep_size=3)
    rec.update(job_ids=["50_0", "50_1", "50_2"])
    for index, outcome in ((0, "completed"), (2, "completed")):
        History(Path(rec.run_dir) / "points" / f"{index:04d}" / "recovery.json", [_ended(f"50_{index}", outcome)]).save()
    fresh = SlurmExecutor().refresh([rec])[0]
    assert fresh.state == State.RUNNING and fresh.point_states == {"0": "COMPLETED", "1": "RUNNING", "2": "COMPLETED"}
    c.scheduler.queue.clear()
    History(Path(rec.run_dir) / "points" / "0001" / "recovery.json", [_ended("50_1", "crash", "stop")]).save()
    assert SlurmExecutor().refresh([fresh])[0].state == State.FAILED


def test_wait_ends_on_a_cluster_without_accounting(cluster: SimpleNamespace, monkeypatch) -> None:
    """submit --wait: the job leaves squeue's view before the next look; the agent's end answers."""
    from orchestrator import api
    from orchestrator.api import Run

    c = cluster
    c.scheduler.queue["61"] = "RUNNING"
    rec = _run(c, "w", "61")
    clock = SimpleNamespace(now=0.0)

    def sleep(seconds: float) -> None:
        clock.now += seconds
        if clock.now > 30 and "61" in c.scheduler.queue:
            History(Path(rec.run_dir) / "recovery.json", [_ended("61", "completed")]).save()
            del c.scheduler.queue["61"]

    monkeypatch.setattr(api, "_now", lambda: clock.now)
    monkeypatch.setattr(api, "_sleep", sleep)
    assert Run(RunRecord.load(rec.run_dir)).wait(timeout=600, attempts=False) == State.COMPLETED
    assert "sacct" in c.scheduler.tools()[:1] and set(c.scheduler.tools()[1:]) == {"squeue"}


def test_wait_ends_with_unknown_when_nothing_can_tell(cluster: SimpleNamespace, monkeypatch) -> None:
    """The job left squeue's view and its agent recorded no end (its node lost): the wait does not
    poll forever; it returns UNKNOWN with the reason on the record, well inside its timeout."""
    from orchestrator import api
    from orchestrator.api import Run

    c = cluster
    c.scheduler.queue["62"] = "RUNNING"
    rec = _run(c, "lost-wait", "62")
    History(Path(rec.run_dir) / "recovery.json", [Attempt(1, 1.0, ["node2"], job="62")]).save()
    clock = SimpleNamespace(now=0.0)

    def sleep(seconds: float) -> None:
        clock.now += seconds
        if clock.now > 30:
            c.scheduler.queue.pop("62", None)

    monkeypatch.setattr(api, "_now", lambda: clock.now)
    monkeypatch.setattr(api, "_sleep", sleep)
    run = Run(RunRecord.load(rec.run_dir))
    assert run.wait(timeout=3600, attempts=False) == State.UNKNOWN
    assert clock.now < 300, clock.now
    assert (run.record.error or "").startswith("job 62 is no longer known to SLURM")


def test_after_and_pipelines_see_the_agents_end_through_refresh(cluster: SimpleNamespace) -> None:
    """A parent squeue forgot: COMPLETED by its agent needs no dependency (SLURM would refuse one on
    a job it no longer knows); FAILED by its agent can never satisfy 'ok'."""
    c = cluster
    ok, bad = _run(c, "prep", "71"), _run(c, "other", "72")
    History(Path(ok.run_dir) / "recovery.json", [_ended("71", "completed")]).save()
    History(Path(bad.run_dir) / "recovery.json", [_ended("72", "crash", "stop")]).save()
    ex = SlurmExecutor()
    parents = resolve([AfterSpec(run=ok.run_id)], "slurm", ex._refresh_slurm)
    assert parents[0].state == State.COMPLETED and slurm_dependencies(parents) == []
    parents = resolve([AfterSpec(run=bad.run_id, when="ok")], "slurm", ex._refresh_slurm)
    with pytest.raises(SubmissionError, match="ended FAILED, and when: ok"):
        slurm_dependencies(parents)
    c.scheduler.queue["73"] = "RUNNING"
    live = _run(c, "live", "73")
    assert slurm_dependencies(resolve([AfterSpec(run=live.run_id)], "slurm", ex._refresh_slurm)) == [("ok", ["73"])]


def test_every_end_the_agent_can_record_is_a_terminal_state() -> None:
    assert set(OUTCOME_STATE.values()) <= TERMINAL and State.COMPLETED in OUTCOME_STATE.values()


# ---- an account the user may not charge (site profile: AccountingStorageEnforce=associations) ----
REFUSED = "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified"


def test_an_invalid_account_is_named_with_where_it_came_from() -> None:
    line = account_hint(REFUSED, "chemistry", "debug", {}, user="alice")
    assert "the account 'chemistry' (slurm.account) is not one user alice may charge on partition 'debug'" in line
    assert "sacctmgr show assoc user=alice format=account,partition" in line
    line = account_hint(REFUSED, None, None, {"SBATCH_ACCOUNT": "bio", "SBATCH_PARTITION": "gpu"}, user="alice")
    assert "the account 'bio' (SBATCH_ACCOUNT in this environment)" in line and "partition 'gpu'" in line
    assert "alice's default account (the spec names none)" in account_hint(REFUSED, None, None, {}, user="alice")
    assert account_hint("Requested node configuration is not available", "chemistry", None, {}) == ""
