"""Which cluster-test session a test runs in, when tests/run_suites.py runs the cluster suite as
several pytest sessions against one shared cluster (standard library only).

run_suites brings the cluster up once (``TESTS_CLUSTER_SHARED=1``: the ``cluster`` fixture
then neither brings it up nor down) and starts the sessions with ``TESTS_CLUSTER_STREAM`` set:

- ``serial`` first, alone: tests that change what every job sees (a node down or killed, a
  partition's PreemptMode, a job of the preempting 'high' partition, the login node re-deployed).
  First, not last: they mostly wait (SLURM noticing a lost node, a preemption's requeue), and at
  the start the unit and integration session uses the cores they leave; run last, they ended
  the suite with the cores half idle (2026-11-28: the last 2.6 of 22.7 minutes).
- ``a``, ``b`` and ``c`` at once: tests that use the cluster as any user would (their own jobs,
  read-only queries); a the CPU-heavy ones, b and c those that mostly wait (``WAITING``). Two
  2-node jobs of 2 ranks fit the 2 x 6 CPUs three side by side (conftest.CPUS); a fourth queues.
- ``last``, alone: the cluster rebuilt without accounting (test_no_accounting.py), which no test
  after it could use.

Without ``TESTS_CLUSTER_STREAM`` (``pytest tests/cluster``) one session runs them all, as before.
A session's check that its jobs left nothing behind skips the other stream's jobs: a job is a
session's when its logs are in that session's folders (``belongs_to_another_stream``). (The
variables' names do not start with ORCH_: sbatch passes them on to the ranks, and
tests/cluster/test_rank_contract_slurm.py proves that a rank gets no ORCH_ variable the plan
does not show.)
"""

from __future__ import annotations

import os
from pathlib import Path

STREAM_VAR = "TESTS_CLUSTER_STREAM"
SHARED_VAR = "TESTS_CLUSTER_SHARED"
#: The shareable streams, not alike. On 2 cores the suite was taken for CPU-bound, and the cluster's
#: tests were split by CPU: a few only wait, on SLURM's one-minute time limits or on ssh, and use
#: almost no CPU. Measured alone, each session by itself with the whole machine's CPU recorded
#: around each test (2026-11-28, 15:00): serial 3.3 min and 104 CPU-s; the CPU-heavy stream a 7.6
#: min and 423 CPU-s; the waiting tests 12.7 min and about 170 CPU-s. So the cluster's part, one
#: wait after another, took 16+ minutes even alone, while the whole suite asks for about 1,500 CPU-s
#: (12.5 min of 2 cores): the suite waited, not computed. The waiting tests are now two streams (b,
#: c) beside a; each holds a job slot for a minute or two. On 2 x 4 CPUs two such jobs fit and a
#: third queued: stream a's jobs waited behind b's and c's (a 13 s test took 148 s); the nodes now
#: claim 6 CPUs each (conftest.CPUS), a slot per stream.
PARALLEL = ("a", "b", "c")
SERIAL = "serial"
LAST = "last"

#: Whole modules that change the cluster for everyone.
SERIAL_MODULES = {
    "test_preemption.py",  # PreemptMode updates; a 'high' job takes every CPU (it would preempt the other stream)
    "test_site_defaults.py",  # a job in the 'high' partition (it preempts debug jobs when CPUs are short)
}
#: The module that rebuilds the cluster without slurmdbd: the ``last`` session.
LAST_MODULE = "test_no_accounting.py"
#: Single tests that do so inside otherwise shareable modules.
SERIAL_TESTS = {
    "test_slurm.py::test_lost_node_ends_the_job",  # kills node2's slurmd, re-runs cluster.sh up
    "test_recovery_slurm.py::test_a_node_taken_down_mid_run_is_left_behind",  # scontrol update state=down
    "test_chaos_slurm.py::test_node_down_refuses_a_node_that_runs_another_job",  # if it broke, node1 DOWN for all
    "test_login_node.py::test_totp_second_factor_then_batch_mode_through_the_master",  # re-runs cluster.sh up
    # a 'high' job over every CPU, as in the module's other tests (its own job's suspend is shareable)
    "test_preemption.py::test_a_real_preemption_requeues_a_rank_api_job_which_resumes_and_completes",
    "test_as_user.py::test_under_preempt_mode_cancel_the_site_ends_the_users_job_and_nothing_requeues_it",
}
#: Tests of the serial modules that touch only their own job, and run in a stream.
SHAREABLE_TESTS = {"test_preemption.py::test_a_suspended_job_is_not_called_stalled_and_completes"}
#: The waiting streams' tests (``module::test``, every parameter; or a whole module): the rest are
#: stream a's. (test_lightning_cancel.py stays in a: moved to c, beside c's tests, its SIGTERM
#: deadlock did not form once (a rank saw its peer's connection close first), 2026-11-28.) Wall and CPU as measured alone (2026-11-28). Whatever installs the login user's
#: orchestrator in its home (test_remote_slurm's fixture, bench_remote) runs in one stream: two
#: installs at once collide.
WAITING: dict[str, set[str]] = {
    "b": {  # 7.7 min
        "test_user_scripts.py::test_a_script_without_a_usr2_handler_runs_to_its_time_limit",  # 141 s, 5 CPU-s
        "test_rank_api_slurm.py::test_rank_api_script_resumes_bit_exactly_after_its_time_limit",  # 94 s, 44
        "test_code_snapshot_slurm.py::test_after_a_timeout_a_longer_time_limit_resumes_the_same_run",  # 80 s, 3
        "test_tracking_slurm.py",  # 53 s, 19
        # then, from stream a (13.0 min beside b's 8.6 and c's 10.8 in the first fresh-clone run),
        # tests that wait for much of their time: a suspension past stall_s, a hang, a chaos kill
        "test_preemption.py::test_a_suspended_job_is_not_called_stalled_and_completes",  # 52 s, 17
        "test_recovery_slurm.py::test_a_hang_restarts_without_the_stragglers_node",  # 21 s, 9
        "test_recovery_slurm.py::test_chaos_kills_a_rank_on_its_node_and_the_job_restarts_inside_itself",  # 22 s, 9
        "test_benchmarks_smoke.py::test_bench_goodput_slurm_runs_its_smoke_round",  # 60 s, mostly a job training
        "test_warm_restart_slurm.py",  # a job training at 0.1 s a step while its standbys import, then two kills
    },
    "c": {  # 6.6 min
        "test_user_scripts.py::test_snapshotting_script_outlives_its_time_limit_with_requeue_always",  # 86 s, 3
        "test_rank_api_slurm.py::test_a_checkpoint_folder_the_nodes_do_not_share_fails_the_job_naming_the_ranks",  # 69 s, 13
        "test_remote_slurm.py",  # 67 s, 15
        "test_as_user.py",  # the login user's orchestrator too (the same install)
        "test_benchmarks_smoke.py::test_bench_remote_runs_one_round_through_the_login_node",  # 51 s, 18
        "test_stacks_slurm.py",  # 121 s, 47
        "test_old_layout_slurm.py",  # a requeue's hold and a cancel: mostly waits
        "test_survivors_slurm.py",  # 53 s + 35 s alone, 7 CPU-s: training with a step delay
        "test_straggler_slurm.py",  # a job training with a step delay, slowed, then restarted on the spare
    },
}


def stream_of(nodeid: str) -> str:
    """The stream a test (its pytest node id, e.g. tests/cluster/test_slurm.py::test_x[p]) runs in."""
    path, _, name = nodeid.partition("::")
    module = Path(path).name
    test = f"{module}::{name.split('[')[0]}"
    if module == LAST_MODULE:
        return LAST
    if test in SERIAL_TESTS or (module in SERIAL_MODULES and test not in SHAREABLE_TESTS):
        return SERIAL
    for stream, tests in WAITING.items():
        if (test in tests or module in tests) and stream in PARALLEL:
            return stream
    return PARALLEL[0]


def current() -> str | None:
    """This session's stream, or None when one session runs every cluster test."""
    return os.environ.get(STREAM_VAR) or None


def runs_dir(base: Path) -> Path:
    """The cluster tests' runs folder for this session: its own sub-folder in a stream, so a job's
    log path says which session submitted it."""
    mine = current()
    return base / mine if mine else base


def belongs_to_another_stream(pid: str) -> bool:
    """Whether a process in the node namespaces belongs to a job of the other session that runs
    beside this one: its job (the ``slurmstepd: [JOB.STEP]`` above it) logs outside this session's
    folders (its runs folder, its pytest base folder ``session-<pid>``), or it runs as a user other
    than root (the login node's jobs, tests/cluster/test_remote_slurm.py). Never true in the
    serial session, nor when one session runs every test. Unknown (no job found, SLURM forgot it):
    not another's, so a check of leftovers stays strict."""
    mine = current()
    if mine is None or mine in (SERIAL, LAST):
        return False
    try:
        if Path(f"/proc/{pid}").stat().st_uid != 0:
            return True
    except OSError:
        return False
    job = _job_of(pid)
    if job is None:
        return False
    if job not in _OWNED:
        _OWNED[job] = _logs_here(job)
    return _OWNED[job] is False


_OWNED: dict[str, bool | None] = {}  # job id -> logs in this session's folders (None: SLURM does not know it)


def _job_of(pid: str) -> str | None:
    """The SLURM job a process runs in: the id in the ``slurmstepd: [JOB.STEP]`` title of the
    nearest such ancestor (rank titles and environments may be rewritten by setproctitle)."""
    for _ in range(8):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        if title.startswith("slurmstepd: ["):
            return title[len("slurmstepd: ["):].split(".")[0].split("]")[0]
        pid = stat.rsplit(")", 1)[1].split()[1]
        if pid in ("0", "1"):
            return None
    return None


def _logs_here(job: str) -> bool | None:
    import subprocess

    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30).stdout
    paths = [field.split("=", 1)[1] for field in out.split() if field.startswith(("StdOut=", "WorkDir="))]
    if not paths:
        return None
    here = (f"/session-{os.getpid()}/", f"{RUNS_BASE}/{current()}/")
    return any(marker in path + "/" for path in paths for marker in here)


RUNS_BASE = "/srv/orch-test-runs"  # tests/cluster/conftest.py's RUNS_DIR
