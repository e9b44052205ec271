"""The Python API's surface: lazy exports, spec building, handles on runs, errors with the fix.
No process is started here (tests/integration/test_api_local.py runs real ranks)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import orchestrator
from orchestrator.core.errors import (JobFailedError, OrchestratorError, RunNotFinishedError, RunNotFoundError, SpecError,
                                 UsageError, WaitTimeoutError)
from orchestrator.core.records import RunRecord, register

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "pydantic", "submitit", "yaml", "rich")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"import sys\n{code}\nprint(' '.join(sys.modules))"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_import_orchestrator_imports_nothing_heavy() -> None:
    mods = _modules_after("import orchestrator")
    assert not [m for m in HEAVY if m in mods]


def test_the_api_functions_stay_free_of_torch() -> None:
    """Taking run/submit/Run brings in neither torch nor pydantic; JobSpec brings pydantic only."""
    mods = _modules_after("from orchestrator import run, submit, Run, load_spec, WaitTimeoutError")
    assert not [m for m in HEAVY if m in mods]
    mods = _modules_after("from orchestrator import JobSpec")
    assert "pydantic" in mods and "torch" not in mods and "submitit" not in mods


def test_lazy_exports_are_the_real_objects() -> None:
    from orchestrator import api, spec
    from orchestrator.core import errors

    assert orchestrator.JobSpec is spec.JobSpec
    assert orchestrator.run is api.run and orchestrator.submit is api.submit and orchestrator.Run is api.Run
    assert orchestrator.load_spec is api.load_spec and orchestrator.SpecError is errors.SpecError
    assert set(orchestrator.__all__) <= set(dir(orchestrator))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        orchestrator.nope  # noqa: B018


def test_errors_stay_in_the_hierarchy() -> None:
    assert issubclass(WaitTimeoutError, OrchestratorError) and issubclass(WaitTimeoutError, TimeoutError)
    for cls in (UsageError, RunNotFinishedError, JobFailedError):
        assert issubclass(cls, OrchestratorError)
    assert UsageError.exit_code == 2


# ---- load_spec ----------------------------------------------------------------------------------
def test_load_spec_merges_files_mappings_and_overrides_in_order(tmp_path: Path) -> None:
    base = tmp_path / "base.yaml"
    base.write_text("name: a\nentrypoint: jobs.train:main\nnodes: 2\ndistributed: {port: 20000}\n")
    spec = orchestrator.load_spec(base, {"distributed": {"init_timeout_s": 60}, "runs_dir": tmp_path / "runs"},
                                  overrides=["nodes=3"], executor="debug")
    assert (spec.nodes, spec.distributed.port, spec.distributed.init_timeout_s) == (3, 20000, 60)
    assert spec.runs_dir == str(tmp_path / "runs") and spec.executor == "debug"
    again = orchestrator.load_spec(spec, overrides=["cpu_ranks_per_node=2"])
    assert again.nodes == 3 and again.cpu_ranks_per_node == 2


def test_load_spec_errors_name_the_field_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="did you mean 'nodes'"):
        orchestrator.load_spec({"name": "a", "entrypoint": "jobs.train:main", "node": 2})
    with pytest.raises(UsageError, match=r"overrides=\['nodes=2'\]"):
        orchestrator.load_spec({"name": "a", "entrypoint": "m:f"}, overrides="nodes=2")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="object"):
        orchestrator.load_spec({"name": "a", "entrypoint": "m:f", "args": {"x": object()}})
    with pytest.raises(UsageError, match="not int"):
        orchestrator.load_spec(3)


def test_run_refuses_a_slurm_spec_and_names_submit(tmp_path: Path) -> None:
    spec = {"name": "s", "entrypoint": "jobs.train:main", "executor": "slurm", "runs_dir": str(tmp_path)}
    with pytest.raises(UsageError, match=r"submit\(spec\)"):
        orchestrator.run(spec)
    assert not list(tmp_path.iterdir())  # nothing was written


# ---- handles on runs that exist only as folders -------------------------------------------------------
def _fake_run(tmp_path: Path, state: str, **fields: object) -> RunRecord:
    run_dir = tmp_path / "runs" / "fake-0123abcd"
    (run_dir / "logs").mkdir(parents=True)
    rec = RunRecord(run_id="fake-0123abcd", run_dir=str(run_dir), executor="local", state=state, world_size=4,
                    **fields)  # type: ignore[arg-type]
    rec.save()
    register(rec)
    return rec


def test_get_result_and_logs_of_a_finished_run(tmp_path: Path) -> None:
    rec = _fake_run(tmp_path, "COMPLETED")
    (Path(rec.run_dir) / "result.json").write_text(json.dumps({"finished": 1.0, "result": {"acc": 0.9}}))
    (Path(rec.run_dir) / "logs" / "rank-3.log").write_text("hello from 3\n")
    run = orchestrator.Run.get("fake-01")
    assert (run.id, run.run_dir, run.state, run.executor) == ("fake-0123abcd", Path(rec.run_dir), "COMPLETED", "local")
    assert run.result() == {"acc": 0.9}
    assert run.logs(rank=3) == "hello from 3\n"
    assert run.status() == "COMPLETED" and run.wait(timeout=0) == "COMPLETED" and run.cancel() == "COMPLETED"
    with pytest.raises(RunNotFoundError, match="no log for rank 1 yet"):
        run.logs(rank=1)
    with pytest.raises(RunNotFoundError, match=r"ranks 0-3"):
        run.logs(rank=4)
    with pytest.raises(RunNotFoundError, match="not a sweep"):
        run.logs(point=1)
    assert "fake-0123abcd" in repr(run)


def test_result_of_a_failed_run_names_the_rank_and_where_to_look(tmp_path: Path) -> None:
    _fake_run(tmp_path, "FAILED", failed_rank=2, error="rank 2 raised ValueError: boom\nTraceback ...")
    with pytest.raises(JobFailedError, match=r"ended FAILED.*rank 2 raised ValueError: boom; see \.logs\(rank=2\)"):
        orchestrator.Run.get("fake-0123abcd").result()


def test_wait_is_bounded_and_result_waits_for_nothing(tmp_path: Path) -> None:
    """A run whose supervisor (this test process) is alive stays RUNNING: wait(timeout) raises a
    TimeoutError in about the time given, and result() says to wait."""
    import os

    from orchestrator.core import procs

    _fake_run(tmp_path, "RUNNING", supervisor_pid=os.getpid(), supervisor_start=procs.start_time(os.getpid()))
    run = orchestrator.Run.get("fake-0123abcd")
    t0 = time.monotonic()
    with pytest.raises(WaitTimeoutError, match="still RUNNING after 0.5s; it goes on"):
        run.wait(timeout=0.5)
    assert 0.4 < time.monotonic() - t0 < 3
    with pytest.raises(RunNotFinishedError, match=r"call \.wait\(\) first"):
        run.result()


def test_sweep_results_are_one_per_point(tmp_path: Path) -> None:
    from orchestrator.core.records import point_dir

    rec = _fake_run(tmp_path, "COMPLETED", sweep_size=2)
    for i in range(2):
        point_dir(rec.run_dir, i).mkdir(parents=True)
        (point_dir(rec.run_dir, i) / "result.json").write_text(json.dumps({"result": i * 10}))
    assert orchestrator.Run.get(rec.run_dir).result() == [0, 10]


def test_unknown_run_is_a_clear_error() -> None:
    with pytest.raises(RunNotFoundError, match="no run 'nothing-here'"):
        orchestrator.Run.get("nothing-here")
