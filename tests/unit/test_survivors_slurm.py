"""recovery.survivors: keep in a SLURM job, the pure parts (the processes are
tests/cluster/test_survivors_slurm.py): srun's lines about ended tasks, a replacement's srun and
its place in the ranks' step, each rank's exit as the agent knows it, and the plan."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.backends.slurm.node.agent_decisions import ended_tasks
from orchestrator.backends.slurm.node.agent_state import AgentContext, AgentState
from orchestrator.backends.slurm.node.agent_survivors import StandIns, exit_code_of, spare_hosts, stand_in_argv
from orchestrator.backends.slurm.node.slurm_task import SlurmJob, SlurmTask, stand_in
from orchestrator.core.recovery import History
from orchestrator.plan import plan
from orchestrator.spec.loading import spec_from_dict


def test_srun_lines_name_every_task_that_ended_badly_with_its_code() -> None:
    assert ended_tasks("srun: error: node2: task 1: Exited with exit code 3\n") == {1: 3}
    assert ended_tasks("srun: error: node1: tasks 0-1,3: Killed") == {0: 137, 1: 137, 3: 137}
    assert ended_tasks("srun: error: node1: task 4: Segmentation fault (core dumped)") == {4: 139}
    assert ended_tasks("srun: error: node1: task 4: Terminated") == {4: 143}
    assert ended_tasks("srun: Job step aborted: Waiting up to 32 seconds") == {}
    assert ended_tasks("srun: error: Node failure on node2") == {}


RANK_ARGV = ["srun", "--nodes=2", "--ntasks=4", "--nodelist=node1,node3", "--unbuffered", "--output",
             "/runs/r/slurm/%j_%t_log.out", "--kill-on-bad-exit=0", "--cpus-per-task=1", "/usr/bin/python3", "-m",
             "orchestrator.backends.slurm.node.slurm_rank", "/runs/r/payload.json", "--master-port", "29517"]


def test_a_replacement_runs_one_task_on_its_node_beside_the_step_appending_to_its_log() -> None:
    argv = stand_in_argv(RANK_ARGV, 3, "node3", "/runs/r/slurm/7_3_log.out", ("node1", "node3"))
    assert argv[:10] == ["srun", "--overlap", "--mem=0", "--nodes=1", "--ntasks=1", "--nodelist=node3",
                         "--output=/runs/r/slurm/7_3_log.out", "--open-mode=append", "--kill-on-bad-exit=0",
                         "--unbuffered"]
    assert "--cpus-per-task=1" in argv and "--ntasks=4" not in argv and "--nodelist=node1,node3" not in argv
    assert argv[argv.index("/usr/bin/python3"):] == [
        "/usr/bin/python3", "-m", "orchestrator.backends.slurm.node.slurm_rank", "/runs/r/payload.json",
        "--master-port", "29517", "--stand-in", "3", "--step-nodes", "node1,node3"]


def _task(procid: int = 0) -> SlurmTask:
    job = SlurmJob(job_id="7", raw_job_id="7", array_job_id=None, array_task=None, restart=0,
                   hosts=("node1", "node2", "node3"))
    return SlurmTask(job=job, procid=procid, localid=0, nodeid=0, ntasks=1, nnodes=1, cuda_visible_devices=None,
                     hosts=("node3",))


@settings(max_examples=100, deadline=None)
@given(nodes=st.integers(1, 4), per_node=st.integers(1, 4), data=st.data())
def test_a_replacement_takes_the_place_and_variables_the_ranks_step_gave_its_rank(nodes: int, per_node: int,
                                                                                   data: Any) -> None:
    hosts = [f"n{i}" for i in range(nodes)]
    rank = data.draw(st.integers(0, nodes * per_node - 1))
    task, env = stand_in(_task(), ["/p.json", "--stand-in", str(rank), "--step-nodes", ",".join(hosts)], per_node)
    assert (task.procid, task.localid, task.nodeid) == (rank, rank % per_node, rank // per_node)
    assert (task.ntasks, task.nnodes, task.hosts) == (nodes * per_node, nodes, tuple(hosts))
    assert env["SLURM_PROCID"] == str(rank) and env["SLURM_LOCALID"] == str(rank % per_node)
    assert env["SLURM_NTASKS"] == str(nodes * per_node) and env["SLURM_STEP_NODELIST"] == ",".join(hosts)


def test_a_task_srun_started_as_itself_is_left_as_it_is() -> None:
    assert stand_in(_task(2), ["/p.json", "--master-port", "1"], 2) == (_task(2), {})


def _ctx(tmp: Path, world_nodes: int = 2) -> AgentContext:
    launch = plan(spec_from_dict({"name": "t", "entrypoint": "jobs.train:main", "executor": "slurm",
                                  "nodes": world_nodes, "cpu_ranks_per_node": 2, "runs_dir": str(tmp / "runs"),
                                  "recovery": {"max_restarts": 3, "survivors": "keep"}}), "slurm")
    job = SlurmJob(job_id="7", raw_job_id="7", array_job_id=None, array_task=None, restart=0,
                   hosts=tuple(f"node{i + 1}" for i in range(world_nodes)))
    return AgentContext(launch.payload, job, History.load(launch.run_dir), AgentState(), "", "", 15)  # type: ignore[arg-type]


def test_each_ranks_exit_is_its_last_processs(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    keep = StandIns(ctx, RANK_ARGV, {})
    assert keep.codes(None) == [None] * 4 and keep.failed(None) == []
    ctx.state.task_ends.update({1: 3})
    assert keep.codes(None) == [None, 3, None, None] and keep.failed(None) == [1]
    assert keep.ctx.host_of(1) == "node1" and keep.ctx.host_of(3) == "node2"
    assert exit_code_of(1, keep.codes(1), bool(keep.steps)) == 1  # nothing replaced: the step's own code
    keep.steps[1] = subprocess.Popen([sys.executable, "-c", "pass"])  # its replacement, which ends 0
    keep.steps[1].wait()
    assert keep.codes(None) == [None, 0, None, None] and keep.failed(None) == []
    assert keep.codes(1) == [0, 0, 0, 0] and exit_code_of(1, keep.codes(1), True) == 0  # the 1 was rank 1's
    ctx.state.task_ends[2] = 137  # a survivor died after the rejoin
    assert exit_code_of(1, keep.codes(1), True) == 137
    failure = keep.failure([2], keep.codes(1))
    assert failure.why == "rank 2 on node2 was killed by a signal (SIGKILL)"


def test_the_ranks_step_lets_survivors_run_on_only_with_survivors_keep(tmp_path: Path) -> None:
    base = {"name": "t", "entrypoint": "jobs.train:main", "executor": "slurm", "runs_dir": str(tmp_path),
            "recovery": {"max_restarts": 1}}
    assert "--kill-on-bad-exit=1" in plan(spec_from_dict(base), "slurm").payload.srun
    keep = {**base, "recovery": {"max_restarts": 1, "survivors": "keep"}}
    assert "--kill-on-bad-exit=0" in plan(spec_from_dict(keep), "slurm").payload.srun


def _ctx3(tmp: Path) -> AgentContext:
    """A 2-node job of 2 ranks a node holding a third node as a spare, its ranks on node1 and node2."""
    return agent_ctx(tmp, cpu_ranks_per_node=2, recovery={"max_restarts": 3, "survivors": "keep", "spares": 1})


def agent_ctx(tmp: Path, **fields: Any) -> AgentContext:
    """The agent's context of a 2-node jobs.train job (``fields`` over it) in a 3-node allocation, its
    ranks on node1 and node2."""
    launch = plan(spec_from_dict({"name": "t", "entrypoint": "jobs.train:main", "executor": "slurm", "nodes": 2,
                                  "runs_dir": str(tmp / "runs"), **fields}), "slurm")
    job = SlurmJob(job_id="7", raw_job_id="7", array_job_id=None, array_task=None, restart=0,
                   hosts=("node1", "node2", "node3"))
    said: list[str] = []
    ctx = AgentContext(launch.payload, job, History.load(launch.run_dir), AgentState(), "", "", 15,  # type: ignore[arg-type]
                       say=said.append)
    ctx.step = ("node1", "node2")
    return ctx


def test_the_ranks_of_a_lost_node_move_to_the_spare_and_the_node_is_left_behind(tmp_path: Path) -> None:
    ctx = _ctx3(tmp_path)
    keep = StandIns(ctx, RANK_ARGV, {})
    assert spare_hosts(keep.ctx) == ["node3"] and keep.codes(None) == [None] * 4
    ctx.state.lost_nodes.add("node2")  # srun: "Node failure on node2", with no line for its tasks
    assert keep.codes(None) == [None, None, 137, 137] and keep.failed(None) == [2, 3]
    failure = keep.failure([2, 3], keep.codes(None))
    assert (failure.kind, failure.why, failure.blamed) == ("node_failure", "lost node(s) node2", ("node2",))
    assert keep.move_off_lost_nodes([2, 3])
    assert ctx.step == ("node1", "node3") and keep.ctx.host_of(2) == keep.ctx.host_of(3) == "node3" and keep.ctx.host_of(0) == "node1"
    assert ctx.history.excluded == ["node2"] and "node2" not in ctx.state.lost_nodes
    assert spare_hosts(keep.ctx) == []  # node2 is excluded, node3 runs ranks now
    ctx.state.lost_nodes.add("node3")  # and the spare goes too: nothing left to move to
    assert not keep.move_off_lost_nodes([2, 3]) and ctx.step == ("node1", "node3")


def test_a_crash_moves_nobody(tmp_path: Path) -> None:
    ctx = _ctx3(tmp_path)
    keep = StandIns(ctx, RANK_ARGV, {})
    ctx.state.task_ends[1] = 1
    assert keep.move_off_lost_nodes([1]) and ctx.step == ("node1", "node2") and ctx.history.excluded == []
    assert keep.failure([1], keep.codes(None)).why == "rank 1 on node1 ended with exit code 1"


def test_a_hung_rank_is_recorded_as_the_hang_that_ended_it(tmp_path: Path) -> None:
    from orchestrator.core.recovery import Failure

    ctx = _ctx3(tmp_path)
    keep = StandIns(ctx, RANK_ARGV, {})
    keep.hung[3] = Failure("hang", "no rank made progress for 10s (watchdog.stall_s); straggler: rank 3")
    ctx.state.task_ends[3] = 137  # killed alone by the agent
    assert keep.failure([3], keep.codes(None)).kind == "hang"


def test_a_slow_rank_alone_moves_to_the_spare_and_its_node_is_left_behind(tmp_path: Path,
                                                                          monkeypatch: Any) -> None:
    """recovery.on: [straggler] with survivors: keep: the straggler is killed alone and starts again
    on the spare, its node blamed and excluded; its peers keep their processes (the 3-node site
    run of 2026-12-06 restarted every rank: the straggler's verdict ended the whole step)."""
    from orchestrator.backends.slurm.node import agent_survivors, slurm_controller
    from orchestrator.node import forensics

    recovery = {"max_restarts": 3, "survivors": "keep", "spares": 1, "on": ["crash", "straggler"]}
    ctx = agent_ctx(tmp_path, cpu_ranks_per_node=1, recovery=recovery)
    keep = StandIns(ctx, RANK_ARGV, {})
    forensics.write_end(ctx.run_dir, "straggler", error="straggler: rank 1 on node2 ... 1.6x the others",
                        failed_rank=1)
    monkeypatch.setattr(keep.rejoins, "may_rejoin", lambda *a: True)  # every rank on jobs.Healer
    killed: list[list[str]] = []
    monkeypatch.setattr(slurm_controller, "run", lambda argv, *a, **k: killed.append(argv) or
                        slurm_controller.Answer(tuple(argv), 0, stdout=agent_survivors.SENT))
    assert keep.end_straggler(slow=True)
    assert len(killed) == 1 and "--nodelist=node2" in killed[0] and killed[0][-2:] == ["1", "KILL"]
    failure = keep.failure([1], keep.codes(None))
    assert (failure.kind, failure.blamed) == ("straggler", ("node2",)) and "1.6x" in failure.why
    assert keep.move_off_lost_nodes([1]) and ctx.step == ("node1", "node3") and ctx.history.excluded == ["node2"]
    assert keep.slow_nodes == set() and keep.ctx.host_of(1) == "node3" and keep.ctx.host_of(0) == "node1"

    for fields, why in (({"cpu_ranks_per_node": 2}, "its node holds other ranks"), ({}, "no spare is free")):
        ctx = agent_ctx(tmp_path / why.replace(" ", "-"), recovery=recovery, **fields)
        if not fields:
            ctx.slurm = SlurmJob(job_id="7", raw_job_id="7", array_job_id=None, array_task=None, restart=0,
                                 hosts=("node1", "node2"))
        keep = StandIns(ctx, RANK_ARGV, {})
        forensics.write_end(ctx.run_dir, "straggler", error="straggler: rank 1", failed_rank=1)
        monkeypatch.setattr(keep.rejoins, "may_rejoin", lambda *a: True)
        assert not keep.end_straggler(slow=True) and why in ctx.say.__self__[-1]  # type: ignore[attr-defined]
        assert keep.slow_nodes == set() and not keep.hung


def test_standbys_start_once_every_rank_trains_with_or_without_a_stall_watchdog(tmp_path: Path,
                                                                                 monkeypatch: Any) -> None:
    """On every node of the ranks and on the spare, once each rank reported progress in this attempt
    (not at the start, where their imports would slow the ranks'; and not through the watchdog,
    which stops reading the ranks' files once it has nothing to judge: no stall_s)."""
    import time

    from orchestrator.backends.slurm.node import agent_standby
    from orchestrator.backends.slurm.node.agent_warm_start import warm_up_once_training
    from orchestrator.core.progress import ProgressWriter

    started: list[str] = []

    class Up:
        def __init__(self, host: str, argv: list[str], env: dict[str, str]) -> None:
            started.append(host)

        def alive(self) -> bool:
            return True

    monkeypatch.setattr(agent_standby, "Standby", Up)
    ctx = _ctx3(tmp_path)
    pool = agent_standby.Standbys()
    since = ctx.state.started = time.time()
    ProgressWriter(ctx.run_dir, 0).report(1, force=True)
    warm_up_once_training(ctx, pool, RANK_ARGV, dict, None)
    assert started == []  # rank 1, 2 and 3 have not stepped yet
    for rank in (1, 2, 3):
        ProgressWriter(ctx.run_dir, rank).report(1, force=True)
    warm_up_once_training(ctx, pool, RANK_ARGV, dict, None)
    assert started == []  # looked less than a second ago
    pool.looked_at = 0.0
    warm_up_once_training(ctx, pool, RANK_ARGV, dict, None)
    assert started == ["node1", "node2", "node3"] and since
    pool.looked_at = 0.0
    warm_up_once_training(ctx, pool, RANK_ARGV, dict, None)
    assert started == ["node1", "node2", "node3"]  # once


def test_standbys_start_for_an_unmodified_script_once_it_shows_progress_after_its_join_or_a_minute() -> None:
    """A script without the rank API reports no progress: new output from every rank AFTER_JOIN_S
    after its join (past its own start: model, data, DDP) says it trains, or a minute of running
    does. A join alone does not: standbys importing then starved a rank's start past stall_s on
    the site cluster (2026-12-05)."""
    from orchestrator.backends.slurm.node.agent_standby import AFTER_JOIN_S, AFTER_START_S, training
    from orchestrator.node.watchdog import Watch

    none: list[float | None] = [None, None]
    watch = Watch(2, 100.0, stall_s=10.0, init_timeout_s=300.0)

    def past() -> list[bool]:
        return [watch.progressed_since_join(r, AFTER_JOIN_S) for r in range(2)]

    assert not training(none, past(), 100.0, 101.0)
    watch.observe(101.0, {0: 10, 1: 10}, {}, [0])
    watch.observe(102.0, {0: 20, 1: 20}, {}, [0, 1])  # output around the join: the join's own
    assert not training(none, past(), 100.0, 120.0)
    watch.observe(102.0 + AFTER_JOIN_S + 1, {0: 30, 1: 20}, {}, [0, 1])
    assert not training(none, past(), 100.0, 120.0)  # rank 1 silent since its join
    watch.observe(102.0 + AFTER_JOIN_S + 2, {0: 30, 1: 40}, {}, [0, 1])
    assert training(none, past(), 100.0, 120.0)
    assert training(none, [False, False], 100.0, 100.0 + AFTER_START_S)
    # without a stall watchdog nothing reads the ranks' output once all joined: the join and a while
    from orchestrator.backends.slurm.node.agent_warm_start import past_their_start

    quiet = Watch(2, 100.0, init_timeout_s=300.0)
    quiet.observe(101.0, {}, {}, [0, 1])
    assert past_their_start(quiet, 2, 101.0 + AFTER_JOIN_S - 0.1) == [False, False]
    assert past_their_start(quiet, 2, 101.0 + AFTER_JOIN_S) == [True, True]
    assert past_their_start(watch, 2, 200.0) == [True, True] and past_their_start(None, 2, 200.0) == [False, False]
    assert training([101.0, 101.5], [False, False], 100.0, 101.6)
    assert not training([99.0, 101.5], [False, False], 100.0, 101.6)  # rank 0's report is the attempt before's


def test_a_rank_started_again_beside_the_others_is_not_past_its_start_until_it_joins() -> None:
    """Watch.restart (survivors: keep): the stand-in is a new process; its predecessor's join and
    reports no longer make the stall clock run, so a stand-in still importing is not a hang; the
    init deadline bounds it, from the rejoin."""
    from orchestrator.node.watchdog import Watch

    watch = Watch(2, 100.0, stall_s=10.0, init_timeout_s=30.0)
    watch.observe(101.0, {0: 1, 1: 1}, {0: 101.0, 1: 101.0}, [0, 1])
    assert watch.stalled(112.0)
    watch.restart([1], 112.0)
    watch.observe(113.0, {0: 1, 1: 1}, {0: 101.0, 1: 105.0}, [0])  # rank 1's old report and no join
    assert not watch.past_start(1) and watch.past_start(0)
    assert not watch.stalled(140.0)  # rank 1 still starting: not a hang
    assert watch.never_joined(142.1) == [1]  # the init deadline, counted from the rejoin
    watch.observe(141.0, {0: 1, 1: 2}, {}, [0, 1])
    assert not watch.stalled(150.0) and watch.stalled(151.0)


def test_a_standby_holds_the_cpus_of_all_its_nodes_ranks_and_the_jobs_stop_grace() -> None:
    from orchestrator.backends.slurm.node.agent_standby import standby_argv

    argv = standby_argv(RANK_ARGV, "node3", ["torch"], ranks_per_node=2, stop_grace_s=30)
    assert "--cpus-per-task=2" in argv and "--cpus-per-task=1" not in argv and "--nodelist=node3" in argv
    assert argv[-3:] == ["--say-ready", "--stop-grace=30", "torch"]


def test_a_forked_attempt_says_what_srun_would_of_a_rank_that_ended_badly() -> None:
    from orchestrator.backends.slurm.node.agent_srun_messages import note_srun_line
    from orchestrator.backends.slurm.node.agent_warm_start import srun_words

    assert ended_tasks(srun_words("node2", 1, 3)) == {1: 3}
    assert ended_tasks(srun_words("node1", 0, 137)) == {0: 137}
    assert ended_tasks(srun_words("node1", 4, 139)) == {4: 139}
    state = AgentState()
    note_srun_line(srun_words("node2", 3, 137), state)
    assert state.killed == ("node2", 3, "Killed") and state.task_ends == {3: 137}


def test_a_restart_forks_its_ranks_only_where_every_node_holds_a_live_idle_standby(tmp_path: Path) -> None:
    from orchestrator.backends.slurm.node.agent_standby import Standbys
    from orchestrator.backends.slurm.node.agent_warm_start import may_fork

    class Warm:
        def __init__(self, ready: bool = True, alive: bool = True, running: set[int] | None = None) -> None:
            self.ready, self._alive, self.running = ready, alive, running or set()

        def alive(self) -> bool:
            return self._alive

    ctx = _ctx3(tmp_path)
    pool = Standbys()
    assert may_fork(ctx, pool, ["node1", "node2"]) == "no warm standby on node1, node2"
    pool.by_host.update(node1=Warm(), node2=Warm(ready=False), node3=Warm())  # type: ignore[dict-item]
    assert may_fork(ctx, pool, ["node1", "node2"]) is None  # node2's still imports: its ranks start once done
    assert may_fork(ctx, pool, ["node1", "node3"]) is None
    pool.by_host["node3"] = Warm(alive=False)  # type: ignore[assignment]
    assert may_fork(ctx, pool, ["node1", "node3"]) == "no warm standby on node3"
    pool.by_host["node3"] = Warm(running={2})  # type: ignore[assignment]
    assert may_fork(ctx, pool, ["node1", "node3"]) == "the standby on node3 still ends its ranks"
    pool.by_host["node3"] = Warm()  # type: ignore[assignment]
    from orchestrator.core.lean_record import replace

    for change, why in (({"standbys": False}, "recovery.standbys is off"),):
        ctx.payload = replace(ctx.payload, recovery=replace(ctx.payload.recovery, **change))
        assert may_fork(ctx, pool, ["node1", "node3"]) == why
    ctx.payload = replace(ctx.payload, recovery=replace(ctx.payload.recovery, standbys=True), backend="nccl")
    assert may_fork(ctx, pool, ["node1", "node3"]) == "an nccl job's standbys hold no GPUs"
