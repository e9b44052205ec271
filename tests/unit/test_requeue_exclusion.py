"""The exclusion that follows a restart's requeue survives the requeue's own SIGTERM: SLURM signals
the job's processes as it requeues it, which can kill the agent's next scontrol (exit code -15), and
a requeued job that forgot the exclusion lands on the blamed node again (seen on the test cluster:
the node-check test then failed on node1 twice). A stand-in scontrol killed by SIGTERM the first time."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.backends.slurm.node import slurm_controller


def _stand_in(tmp_path: Path, monkeypatch,  # type: ignore[no-untyped-def]
              answer: str = 'test "$1" = show && echo "JobId=7 ExcNodeList=node9"\nexit 0\n') -> Path:
    """A scontrol killed by SIGTERM the first time it is called, then giving ``answer`` (shell)."""
    calls = tmp_path / "calls"
    script = tmp_path / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n'
                      f'if [ ! -e {tmp_path}/once ]; then touch {tmp_path}/once; kill -TERM $$; fi\n' + answer)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(slurm_controller, "PERSIST_BACKOFF_S", (0.05, 0.05, 0.05, 0.05))
    return calls


def test_the_exclusion_is_asked_again_when_the_requeues_sigterm_kills_scontrol(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    calls = _stand_in(tmp_path, monkeypatch)
    answer = slurm_controller.set_excluded("7", ["node1"], timeout_s=10)
    assert answer.ok, answer
    assert calls.read_text().splitlines() == ["update JobId=7 ExcNodeList=node1"] * 2


def test_the_jobs_own_exclusions_are_read_again_too(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _stand_in(tmp_path, monkeypatch)
    assert slurm_controller.show_job("7", 10, persist=True).get("ExcNodeList") == "node9"


def test_a_requeue_whose_answer_was_lost_is_done_when_the_job_pends(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The requeue's SIGTERM killed the scontrol that asked for it after the controller did it: the
    next try hears 'Job is pending execution'. That is the requeue done, at once (seen in CI: taken
    as a failure, retried to the bound, the agent skipped the exclusion and the job ran on the
    blamed node again)."""
    calls = _stand_in(tmp_path, monkeypatch, 'echo "Job is pending execution for job 7" >&2\nexit 1\n')
    retried = []
    answer = slurm_controller.requeue("7", timeout_s=10, on_retry=retried.append)
    assert answer.ok, answer
    assert calls.read_text().splitlines() == ["requeue 7"] * 2  # the lost try, then one that heard it pends
    assert [a.returncode for a in retried] == [-15]


def test_a_requeue_the_controller_refuses_is_still_a_failure(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "scontrol"
    script.write_text('#!/bin/sh\necho "Requested operation is presently disabled for job 7" >&2\nexit 1\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(slurm_controller, "PERSIST_BACKOFF_S", (0.05, 0.05))
    answer = slurm_controller.requeue("7", timeout_s=10)
    assert not answer.ok and "disabled" in answer.complaint
