from __future__ import annotations

import os
import shutil
from typing import Iterator
from pathlib import Path

import pytest


def _test_tmp() -> Path:
    """Where the tests' folders (tmp_path) live: never under /tmp, /var/tmp ..., since a SLURM spec
    refuses a node-local runs_dir, as it must on a real cluster. Under the checkout, unless the
    checkout itself is on such a path (a clone in /tmp): then in the user's cache folder."""
    from orchestrator.spec.validators import is_node_local

    checkout = Path(__file__).resolve().parents[1]
    if not is_node_local(str(checkout)):
        return checkout / ".pytest-tmp"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "ddp-orchestrator-tests"


TEST_TMP = _test_tmp()


def pytest_configure(config: pytest.Config) -> None:
    if not config.option.basetemp:
        TEST_TMP.mkdir(parents=True, exist_ok=True)
        config.option.basetemp = str(TEST_TMP / f"session-{os.getpid()}")


def pytest_unconfigure(config: pytest.Config) -> None:
    base = Path(str(config.option.basetemp))
    if base.parent == TEST_TMP:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(autouse=True)
def _private_registry(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test gets its own run registry, never the user's."""
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(tmp_path_factory.mktemp("orch-home")))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        if "integration" in parts:
            item.add_marker(pytest.mark.integration)
        if "cluster" in parts:
            item.add_marker(pytest.mark.cluster)
        if item.nodeid.split("[")[0] in SLOW:
            item.add_marker(pytest.mark.slow)


# -- no test takes over a minute unless it is marked slow ------------------------------------------
# A test's own run (pytest's "call" phase; fixtures shared by a module or the session, such as the
# cluster, are not its own) over SLOW_LIMIT_S fails the session unless the test is marked ``slow``:
# written on the test, or listed here (tests whose wait is the point: SLURM's one-minute time limits,
# its requeue hold, a 60 s timeout of the product; or whole trainings that came near the limit when
# the suites ran side by side on 2 cores). A slow test that is not here is a wait to shorten, or a
# test to mark, on purpose. The test itself is reported FAILED (not only the session), so that
# tests/run_suites.py runs it once more alone, as any test that fails side by side: a cluster test
# whose job queued behind the other streams' jobs for half a minute (2026-11-28: 94 s side by side,
# 33 s alone) is named under contention, and one that is slow alone too fails the run.

SLOW_LIMIT_S = 60.0
SLOW = {
    # a SLURM job that trains for 45 s through a rank's kill and its rejoin: the training is the point
    "tests/cluster/test_benchmarks_smoke.py::test_bench_goodput_slurm_runs_its_smoke_round",
    # four epochs at 0.15 s a step, so that the standbys are warm before the kill, then a hang found by
    # stall_s (20 s) and stacks, and the reference run's weights
    "tests/cluster/test_survivors_slurm.py::test_a_killed_or_hung_rank_is_forked_from_its_nodes_standby_and_rejoins_the_survivors",
    # 800 steps at 0.1 s, so that the standbys are warm (their torch import beside the training) before
    # two kills, each restart forked from them
    "tests/cluster/test_warm_restart_slurm.py::test_a_killed_ranks_restart_is_forked_from_the_nodes_standbys_and_resumes_from_its_snapshot",
    # a local job slowed by chaos, named, judged over a 10 s window, then every rank restarted: 40 s
    # alone, 76 s in the fresh-clone CI of 2026-12-05 beside the other suites
    "tests/integration/test_top.py::test_a_rank_made_four_times_slower_is_named_the_straggler_and_its_peer_is_not",
    # a job slowed by chaos, judged over a 10 s window, then restarted on the spare: 50 s alone, 90 s beside
    # the other streams
    "tests/cluster/test_straggler_slurm.py::test_a_persistent_straggler_moves_the_ranks_to_the_spare_inside_the_job",
    # a real time limit (3 min, USR2 120 s before it) and the requeued attempt
    "tests/cluster/test_rank_api_slurm.py::test_rank_api_script_resumes_bit_exactly_after_its_time_limit",
    # the health gate's 60 s wait for the other node's token is the product's bound being proved
    "tests/cluster/test_rank_api_slurm.py::test_a_checkpoint_folder_the_nodes_do_not_share_fails_the_job_naming_the_ranks",
    # SLURM's one-minute minimum time limit, then KillWait (30 s)
    "tests/cluster/test_user_scripts.py::test_a_script_without_a_usr2_handler_runs_to_its_time_limit",
    "tests/cluster/test_user_scripts.py::test_snapshotting_script_outlives_its_time_limit_with_requeue_always",
    "tests/cluster/test_code_snapshot_slurm.py::test_after_a_timeout_a_longer_time_limit_resumes_the_same_run",
    "tests/cluster/test_stacks_slurm.py::test_time_limit_without_requeue_saves_the_stacks_first",
    # a preemption's GraceTime (30 s) and the resumed attempt; a suspension longer than stall_s
    "tests/cluster/test_preemption.py::test_a_real_preemption_requeues_a_rank_api_job_which_resumes_and_completes",
    "tests/cluster/test_preemption.py::test_a_suspended_job_is_not_called_stalled_and_completes",
    # the site's PreemptMode=CANCEL with its 30 s GraceTime, as the login user: 60.1 and 61.3 s side
    # by side in two fresh-clone runs of 2026-12-06 (passed alone)
    "tests/cluster/test_as_user.py::test_under_preempt_mode_cancel_the_site_ends_the_users_job_and_nothing_requeues_it",
    # the requeued attempt after a wandb/tensorboard run, and the requeues of test_slurm
    "tests/cluster/test_tracking_slurm.py::test_a_requeued_offline_job_is_one_wandb_run_and_tensorboard_holds_every_step_once",
    "tests/cluster/test_slurm.py::test_requeue_resumes_to_the_same_weights",
    # a node lost: SLURM's own detection of the dead slurmd, then the node brought back
    "tests/cluster/test_slurm.py::test_lost_node_ends_the_job",
    # the suspension itself (35 s) past stall_s, then the rest of the work
    "tests/cluster/test_preemption.py::test_a_suspended_job_is_not_called_stalled_and_completes",
    # a crash, a restart (inside the job, or a requeue) and the resumed attempt; a chaos kill, the same
    "tests/cluster/test_recovery_slurm.py::test_a_crash_restarts_and_resumes_from_its_snapshot",
    "tests/cluster/test_recovery_slurm.py::test_chaos_kills_a_rank_on_its_node_and_the_job_restarts_inside_itself",
    # the benchmarks' smoke rounds on the cluster: jobs through the login node (90 s in the fresh-clone CI
    # of 04:05 under load), a crash and its recovery inside the job
    "tests/cluster/test_benchmarks_smoke.py::test_bench_remote_runs_one_round_through_the_login_node",
    "tests/cluster/test_benchmarks_smoke.py::test_bench_recovery_inside_runs_one_round",
    # two ranks in fresh interpreters (spawn), each importing torch: 60 s at load 13
    "tests/integration/test_checkpoint_read_once.py::test_a_resume_reads_the_checkpoint_once_and_every_rank_gets_it_exactly",
    "tests/cluster/test_recovery_slurm.py::test_a_failure_without_progress_stops_with_no_progress",
    # 4-rank jobs of torch, Lightning, Fabric or Accelerate that wait for the other cluster session's
    # jobs to free CPUs or GPUs (tests/cluster/streams.py): 45 to 120 s side by side under load
    "tests/cluster/test_frameworks_slurm.py::test_framework_scripts_train_as_one_world_on_slurm",
    "tests/cluster/test_lightning_cancel.py::test_cancel_of_an_unmodified_lightning_job_ends_every_rank_within_seconds",
    "tests/cluster/test_gpu_types.py::test_exclude_keeps_the_job_off_a_node_and_untyped_gpus_still_bind",
    "tests/cluster/test_gpu_types.py::test_typed_gpus_on_a_bracketed_nodelist",
    "tests/cluster/test_slurm.py::test_two_nodes_file_init",
    "tests/cluster/test_slurm.py::test_two_nodes_tcp_training_completes",
    "tests/cluster/test_stacks_slurm.py::test_stall_on_slurm_names_the_straggler_with_every_stack",
    "tests/cluster/test_stacks_slurm.py::test_init_deadline_on_slurm_names_the_rank",  # 33 s alone, 94 in 3 streams
    # a requeue round trip (the old attempt ended on its node, the new one trains again), then a cancel
    "tests/cluster/test_old_layout_slurm.py::test_a_job_of_the_old_layout_runs_is_requeued_and_cancelled",  # 20 s alone, 89 in 3 streams
    # a hang past stall_s, stacks from both nodes, a restart without the straggler's node
    "tests/cluster/test_recovery_slurm.py::test_a_hang_restarts_without_the_stragglers_node",  # 21 s alone, 60.3 in 3 streams
    # a 2-node job of 4 ranks that queues behind the other streams' jobs (74.7 s in 3 streams)
    "tests/cluster/test_slurm.py::test_fake_gpus_follow_the_torchrun_contract",
    "tests/cluster/test_remote_slurm.py::test_a_second_submit_ships_only_what_changed_and_resumes_the_same_run",
    # two submissions through the login node (ssh, the login user's install): 43 s alone, 72 s in three streams
    "tests/cluster/test_remote_slurm.py::test_tilde_is_the_login_users_home_plan_is_the_clusters_and_a_new_host_name_resumes",
    # a 4-rank Lightning job (its imports alone take seconds a rank on 2 cores), 61 s under load
    "tests/integration/test_cancel_stuck_handlers.py::test_an_unmodified_lightning_job_ends_within_seconds",
    # stop_grace_s (30 s) waited out is the point; a detached run followed by status, logs, report
    "tests/integration/test_cli_local.py::test_cancel_waits_stop_grace_s_for_slow_steps_to_checkpoint",
    "tests/integration/test_cli_local.py::test_detached_run_then_status_logs_report",
    # 84 to 98 s in the fresh-clone CI of 21:13 under load (4-rank framework jobs, a cancel after start)
    "tests/integration/test_benchmarks_smoke.py::test_benchmark_runs_one_short_round",
    "tests/integration/test_frameworks.py::test_framework_scripts_train_as_one_world_through_the_cli",
    "tests/cluster/test_slurm.py::test_cancel_gives_cancelled_quickly",
    # whole trainings, twice or more, CPU-bound (40 to 50 s side by side on 2 cores)
    "tests/integration/test_ownership.py::test_generated_sequences_keep_one_owner_per_run",
    "tests/integration/test_rank_api.py::test_user_script_on_the_rank_api_resumes_bit_exactly_after_usr2",
    "tests/integration/test_local_runs.py::test_interrupt_and_resume_is_bit_identical",
}
_TOOK: dict[str, float] = {}  # node id -> seconds its call phase took, for tests not marked slow


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "call" and report.passed and "slow" not in report.keywords and report.duration > SLOW_LIMIT_S:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} took {report.duration:.1f}s, over {SLOW_LIMIT_S:.0f}s, and is not marked "
                           "slow: shorten the wait, or mark it slow in tests/conftest.py's SLOW if the wait is what "
                           "it proves")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "cluster" in report.keywords:
        _CLUSTER.setdefault(report.nodeid, {})[report.when] = report.outcome
    if report.when == "call" and "slow" not in report.keywords and report.duration > SLOW_LIMIT_S:
        _TOOK[report.nodeid] = report.duration


def _too_slow_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _TOOK:
        terminalreporter.write_sep("!", f"{len(_TOOK)} test(s) not marked slow took over {SLOW_LIMIT_S:.0f}s: "
                                   "each FAILS (shorten the wait, or mark the test slow in "
                                   "tests/conftest.py's SLOW if the wait is what it proves)", red=True, bold=True)
        for nodeid, took in sorted(_TOOK.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"{took:7.1f}s {nodeid}")


# -- cluster tests are never skipped quietly ------------------------------------------------------
# The SLURM tests need root and apt-get (deploy/cluster.sh installs Debian's packages). Where they
# cannot run they skip, and the end of the session says so in one loud line; where they could run
# (root and apt-get present) but were skipped anyway, the session fails.

_CLUSTER: dict[str, dict[str, str]] = {}  # test id -> {phase: outcome}


def can_run_cluster_tests() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get") is not None


def cluster_counts() -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for phases in _CLUSTER.values():
        outcomes = set(phases.values())
        if "failed" in outcomes:
            counts["failed"] += 1
        elif "skipped" in outcomes:
            counts["skipped"] += 1
        elif phases.get("call") == "passed":
            counts["passed"] += 1
    return counts


def _skipped_but_runnable() -> bool:
    return cluster_counts()["skipped"] > 0 and can_run_cluster_tests()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if (_skipped_but_runnable() or _TOOK) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    _too_slow_summary(terminalreporter)
    if not _CLUSTER:
        return  # no cluster test was selected (e.g. pytest tests/unit)
    c = cluster_counts()
    ran = c["passed"] + c["failed"]
    line = (f"cluster tests (real SLURM): {ran} ran ({c['passed']} passed, {c['failed']} failed), "
            f"{c['skipped']} skipped")
    if not c["skipped"]:
        terminalreporter.write_sep("=", line, green=not c["failed"], red=bool(c["failed"]))
    elif can_run_cluster_tests():
        terminalreporter.write_sep("!", line + ": this machine has root and apt-get, so skipping them "
                                   "FAILS the session", red=True, bold=True)
    else:
        terminalreporter.write_sep("!", line + ": SLURM was NOT tested (they need root and apt-get)",
                                   yellow=True, bold=True)
