"""Which cluster-test session a test runs in, when tests/run_suites.py runs the cluster suite as
several pytest sessions against one shared cluster (standard library only).

run_suites brings the cluster up once (``TESTS_CLUSTER_SHARED=1``: the ``cluster`` fixture
then neither brings it up nor down) and starts the sessions with ``TESTS_CLUSTER_STREAM`` set:

- ``serial`` first, alone: tests that change what every job sees (a node down or killed, a
  partition's PreemptMode, a job of the preempting 'high' partition, the login node re-deployed).
  First, not last: they mostly wait (SLURM noticing a lost node, a preemption's requeue), and at
  the start the unit and integration session uses the cores they leave; run last, they ended
  the suite with the cores half idle (2026-11-28: the last 2.6 of 22.7 minutes).
- ``a`` and ``b`` at once: tests that use the cluster as any user would (their own jobs, read-only
  queries). Two 2-node jobs of 2 ranks fit the 2 x 4 CPUs side by side; a third queues.
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
#: Two shareable streams, not alike. The suite is CPU-bound on 2 cores: two even streams beside the
#: unit and integration session loaded the cores past what the timing-sensitive tests tolerate
#: (2026-11-27: stream a 25 min, b 19 min, failures that passed alone). But a few cluster tests
#: only wait, on SLURM's one-minute time limits or on ssh, and use almost no CPU: measured alone
#: with the whole machine's CPU recorded around each test (2026-11-28), the tests below took 8.8 min
#: of stream a's 25.9 and 103 of its 1,247 CPU-seconds. Stream b is those first: beside stream a they
#: cost it nothing but their jobs' slots (two 2-node jobs of 2 ranks fit the 2 x 4 CPUs side by side;
#: a third queues), and then a few that wait for part of their time, to even the streams out.
PARALLEL = ("a", "b")
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
    "test_login_node.py::test_totp_second_factor_then_batch_mode_through_the_master",  # re-runs cluster.sh up
    # a 'high' job over every CPU, as in the module's other tests (its own job's suspend is shareable)
    "test_preemption.py::test_a_real_preemption_requeues_a_rank_api_job_which_resumes_and_completes",
}
#: Tests of the serial modules that touch only their own job, and run in a stream.
SHAREABLE_TESTS = {"test_preemption.py::test_a_suspended_job_is_not_called_stalled_and_completes"}
#: Stream b's tests (``module::test``, every parameter; or a whole module): the rest are stream a's.
#: Wall and CPU as measured in stream a alone. Whatever installs the login user's orchestrator in its
#: home (test_remote_slurm's fixture, bench_remote) runs in one stream: two installs at once collide.
STREAM_B = {
    "test_user_scripts.py::test_a_script_without_a_usr2_handler_runs_to_its_time_limit",  # 141 s, 5 CPU-s
    "test_user_scripts.py::test_snapshotting_script_outlives_its_time_limit_with_requeue_always",  # 86 s, 6
    "test_code_snapshot_slurm.py::test_after_a_timeout_a_longer_time_limit_resumes_the_same_run",  # 85 s, 5
    "test_rank_api_slurm.py::test_a_checkpoint_folder_the_nodes_do_not_share_fails_the_job_naming_the_ranks",  # 79 s, 35
    "test_remote_slurm.py",  # 73 s, 23
    "test_benchmarks_smoke.py::test_bench_remote_runs_one_round_through_the_login_node",  # 60 s, 29
    # Then, to even the two out (2026-11-28's CI rehearsal with only the waiting tests in b: stream a
    # 21.4 min, b 9.4), tests that wait for a good part of their time, about 5.5 min of stream a's:
    "test_rank_api_slurm.py::test_rank_api_script_resumes_bit_exactly_after_its_time_limit",  # 150 s, 103
    "test_stacks_slurm.py",  # 130 s, 90
    "test_tracking_slurm.py",  # 61 s, 37
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
    return "b" if (test in STREAM_B or module in STREAM_B) and "b" in PARALLEL else "a"


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
