"""Users' own scripts on SLURM get what they would get under plain srun: their signal handlers
and finally blocks run, cancel returns only when every rank is gone, and a script that snapshots
itself outlives a real time limit through slurm.requeue: always."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from orchestrator.backends.slurm.executor import SlurmExecutor
from orchestrator.core.records import RunRecord

from tests.integration.helpers import SCRIPTS as USER_SCRIPTS

from .test_slurm import no_job_processes, rank_processes, release_requeued, run, run_wait, slurm_plan

SCRIPTS = Path(__file__).parent / "scripts"


def _wait_for(paths: list[Path], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"missing: {[str(p) for p in paths if not p.exists()]}"
        time.sleep(0.2)


def test_user_handlers_see_usr2_and_cancel_waits_for_their_cleanup(cluster: dict[str, str]) -> None:
    out = Path(cluster["runs_dir"]) / "signals-out"
    out.mkdir(exist_ok=True)
    launch = slurm_plan(cluster, name="signals", entrypoint=str(SCRIPTS / "user_signals.py"), extra_args=[str(out)],
                        slurm={"time": "00:10:00", "signal_margin_s": 30, "requeue": "never"})
    ex = SlurmExecutor()
    record = ex.submit(launch)
    _wait_for([out / f"started-{r}" for r in range(4)], 120)
    # What SLURM sends signal_margin_s before the time limit: the script's own handler sees it.
    subprocess.run(["scancel", "--signal=USR2", record.job_ids[0]], check=True)
    _wait_for([out / f"usr2-{r}" for r in range(4)], 15)
    assert RunRecord.load(launch.run_dir).state in ("PENDING", "RUNNING")  # USR2 did not end the job
    t0 = time.monotonic()
    record = ex.cancel(record)
    took = time.monotonic() - t0
    print(f"cancel -> every rank gone: {took:.2f}s")
    assert record.state == "CANCELLED", record
    # cancel returned only after every rank ran its SIGTERM handler and its finally block
    assert all((out / f"sigterm-{r}").exists() and (out / f"finally-{r}").exists() for r in range(4)), \
        sorted(p.name for p in out.iterdir())
    assert not rank_processes(), rank_processes()
    assert took < 30


def test_work_a_script_does_as_it_exits_is_kept(cluster: dict[str, str]) -> None:
    """A thread still writing after the script's last line, an atexit hook, a file never closed, a C stream:
    all kept, as under plain srun (the local executor's forked ranks: test_local_runs)."""
    out = Path(cluster["runs_dir"]) / "exit-work-out"
    out.mkdir(exist_ok=True)
    record = run(slurm_plan(cluster, name="exitwork", entrypoint=str(USER_SCRIPTS / "exit_work.py"), extra_args=[str(out)]))
    assert record.state == "COMPLETED", record.error
    assert {p.name: p.read_text() for p in out.iterdir()} == \
        {f"{what}-{r}": "done" for what in ("thread", "atexit", "unclosed", "cstdio") for r in range(4)}


def test_snapshotting_script_outlives_its_time_limit_with_requeue_always(cluster: dict[str, str]) -> None:
    out = Path(cluster["runs_dir"]) / "snapshot-out"
    out.mkdir(exist_ok=True)
    # A real 2-minute limit: USR2 comes 60 s before it, mid-way through 8 epochs of 10 s.
    launch = slurm_plan(cluster, name="snapshots", entrypoint=str(SCRIPTS / "snapshotting.py"),
                        extra_args=[str(out), "8", "10"],
                        slurm={"time": "2", "signal_margin_s": 60, "requeue": "always", "max_requeues": 2})
    ex = SlurmExecutor()
    record = ex.submit(launch)
    deadline = time.monotonic() + 180
    while "Restarts=1" not in subprocess.run(["scontrol", "show", "job", record.job_ids[0]], capture_output=True,
                                             text=True).stdout:
        assert time.monotonic() < deadline, "the job was not requeued at its time-limit signal"
        time.sleep(0.5)
    release_requeued(record.job_ids[0])
    final = run_wait(ex, record, 300)
    assert final.state == "COMPLETED", final.error
    attempts = (out / "attempts-0.log").read_text().splitlines()
    # Requeued at least once; on a loaded machine an attempt may meet the time limit again (bounded
    # by max_requeues). Every later attempt resumed from the previous one's snapshot, moving on.
    assert attempts[0] == "attempt 0 starts at epoch 0" and len(attempts) >= 2, attempts
    starts = [int(line.split()[-1]) for line in attempts]
    assert [line.split()[1] for line in attempts] == [str(i) for i in range(len(attempts))], attempts
    assert all(0 < b and a < b for a, b in zip(starts, starts[1:])), attempts
    assert all('"epoch": 8' in (out / f"snapshot-{r}.json").read_text() for r in range(4))
    log = "".join(p.read_text() for p in (Path(launch.run_dir) / "slurm").glob("*_0_log.out"))
    assert "requeueing" in log
    assert no_job_processes()


def test_a_script_without_a_usr2_handler_runs_to_its_time_limit(cluster: dict[str, str]) -> None:
    """Under the default requeue: auto the time limit's notice (USR2, signal_margin_s before the
    limit) reaches the ranks, but a script with no handler for it is not killed by it: it runs on
    to its real time limit and ends TIMEOUT, as under plain sbatch (it used to die at the notice,
    FAILED with exit 140, a minute of a 2-minute job lost)."""
    launch = slurm_plan(cluster, name="nohandler", entrypoint=str(SCRIPTS / "until_killed.py"), nodes=1,
                        cpu_ranks_per_node=2, slurm={"time": "2", "signal_margin_s": 60})
    record = run(launch, timeout=330)
    log = "".join(p.read_text() for p in sorted((Path(launch.run_dir) / "slurm").glob("*_0_log.out")))
    assert record.state == "TIMEOUT", (record, log[-2000:])
    notice = log.find("the time limit's notice (SIGUSR2) came")
    assert notice >= 0, log[-2000:]
    after = [int(s.split()[1][:-1]) for s in log[notice:].splitlines() if s.startswith("alive ")]
    assert after and max(after) >= 100, log[-2000:]  # it kept working to its 2-minute limit
