"""The trackers' defaults (orchestrator.node.tracking), what plan says of them, and sync's listing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings as hsettings
from hypothesis import strategies as st

from orchestrator.front import sync
from orchestrator.node import tracking
from orchestrator.core.errors import OrchestratorError
from orchestrator.spec.loading import spec_from_dict
from orchestrator.plan import plan
from orchestrator.spec.models import TrackingSpec

ROOT = Path(__file__).resolve().parents[2]
USER_VARS = tracking.WANDB_VARS + tracking.TENSORBOARD_VARS + tracking.MLFLOW_VARS


@pytest.fixture(autouse=True)
def _no_user_trackers(monkeypatch: pytest.MonkeyPatch) -> None:
    """plan reads the submitting shell's variables: this one's must not decide the tests."""
    for name in USER_VARS:
        monkeypatch.delenv(name, raising=False)


def _plan(tmp_path: Path, **fields: object):  # -> LaunchPlan
    spec = {"name": "trk", "entrypoint": "jobs.train:main", "runs_dir": str(tmp_path / "runs"), **fields}
    return plan(spec_from_dict(spec), "local")


def test_settings_a_variable_the_user_set_wins_over_the_defaults() -> None:
    on = TrackingSpec()
    assert tracking.settings(on, {}, {}) == tracking.TrackingSettings(True, True, True)
    # any one of a tracker's variables, in the spec's env or the shell, turns off all of that tracker's
    assert tracking.settings(on, {"WANDB_DIR": "/x"}, {}).wandb is False
    assert tracking.settings(on, {}, {"WANDB_RESUME": "never"}).wandb is False
    assert tracking.settings(on, {}, {"ORCH_TENSORBOARD_DIR": "/tb"}) == tracking.TrackingSettings(True, False, True)
    assert tracking.settings(on, {"MLFLOW_TRACKING_URI": "http://x"}, {}).mlflow is False
    # unrelated variables change nothing; the spec turns one off on its own
    assert tracking.settings(on, {"WANDB_MODE": "offline", "WANDB_PROJECT": "p"}, {}).wandb is True
    assert tracking.settings(TrackingSpec(wandb=False), {}, {}) == tracking.TrackingSettings(False, True, True)


def test_a_run_id_that_fits_stays_as_it_is() -> None:
    assert tracking.wandb_run_id("resnet50-2x8-1a2b3c4d") == "resnet50-2x8-1a2b3c4d"
    assert tracking.wandb_run_id("a-1a2b3c4d-point-0003") == "a-1a2b3c4d-point-0003"


@hsettings(max_examples=150, deadline=None)
@given(st.text(min_size=1, max_size=300), st.text(min_size=1, max_size=300))
def test_any_run_id_becomes_a_valid_stable_wandb_id(a: str, b: str) -> None:
    short = tracking.wandb_run_id(a)
    assert 0 < len(short) <= tracking.WANDB_ID_MAX
    assert re.fullmatch(r"[A-Za-z0-9_.-]+", short), short  # none of W&B's forbidden / \ # ? % : and no space
    assert tracking.wandb_run_id(a) == short  # stable: every attempt computes the same
    assert (tracking.wandb_run_id(b) == short) == (a == b)  # two runs never share one W&B run


def test_a_long_or_odd_run_id_is_shortened_with_a_hash() -> None:
    long = "x" * 100 + "-0123abcd"
    short = tracking.wandb_run_id(long)
    assert len(short) == tracking.WANDB_ID_MAX and short.startswith("x" * 20)
    assert tracking.wandb_run_id("a/b:c") != tracking.wandb_run_id("a_b_c")  # cleaning alone would collide


def test_the_rank_environment_from_plan_shows_the_defaults(tmp_path: Path) -> None:
    launch = _plan(tmp_path)
    env, run = launch.ranks[0].env, launch.run_dir
    assert env["ORCH_RUN_ID"] == launch.run_id
    assert (env["WANDB_RUN_ID"], env["WANDB_RESUME"], env["WANDB_DIR"]) == (launch.run_id, "allow", f"{run}/wandb")
    assert env["ORCH_TENSORBOARD_DIR"] == f"{run}/tensorboard"
    assert env["MLFLOW_TRACKING_URI"] == f"file://{run}/mlruns" and env["MLFLOW_EXPERIMENT_NAME"] == "trk"
    assert env["MLFLOW_ALLOW_FILE_STORE"] == "true"  # MLflow 3 refuses a file store without it
    lines = tracking.plan_lines(launch, environ={})
    assert lines[0] == (f"tracking: W&B run {launch.run_id} (WANDB_RESUME=allow) in {run}/wandb; TensorBoard "
                        f"{run}/tensorboard; MLflow file://{run}/mlruns (experiment trk)")
    assert f"orchestrator sync {launch.run_id}" in lines[-1]


def test_the_users_own_variables_are_kept_and_plan_says_why_a_tracker_is_off(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    launch = _plan(tmp_path, env={"WANDB_DIR": "/scratch/wb"}, tracking={"tensorboard": False})
    env = launch.ranks[0].env
    assert env["WANDB_DIR"] == "/scratch/wb" and "WANDB_RUN_ID" not in env and "ORCH_TENSORBOARD_DIR" not in env
    assert "MLFLOW_TRACKING_URI" not in env  # the shell's reaches the ranks as it is (they inherit it)
    lines = tracking.plan_lines(launch)
    assert lines == ["tracking off: W&B (the spec's env sets WANDB_DIR: yours are used); TensorBoard "
                     "(tracking.tensorboard: false); MLflow (your shell sets MLFLOW_TRACKING_URI: yours are used)"]


def test_each_sweep_point_is_its_own_tracker_run(tmp_path: Path) -> None:
    launch = _plan(tmp_path, sweep={"lr": [0.1, 0.2]})
    envs = [tracking.environment(launch.payload_for_point(i)) for i in range(2)]
    assert [e["WANDB_RUN_ID"] for e in envs] == [f"{launch.run_id}-point-0000", f"{launch.run_id}-point-0001"]
    assert [e["WANDB_DIR"] for e in envs] == [f"{launch.run_dir}/points/{i:04d}/wandb" for i in range(2)]
    assert envs[1]["ORCH_TENSORBOARD_DIR"] == f"{launch.run_dir}/points/0001/tensorboard"
    assert envs[1]["MLFLOW_TRACKING_URI"] == f"file://{launch.run_dir}/points/0001/mlruns"
    assert envs == [tracking.environment(launch.payload_for_point(i)) for i in range(2)]  # the same every attempt
    line = tracking.plan_lines(launch, environ={})[0]
    assert f"W&B run {launch.run_id}-point-0000" in line and f"{launch.run_dir}/points/0000/tensorboard" in line
    assert "sweep point 0 of 2" in line


def _offline(root: Path, stamp: str, run_id: str) -> Path:
    folder = root / "wandb" / "wandb" / f"offline-run-{stamp}-{run_id}"
    folder.mkdir(parents=True)
    (folder / f"run-{run_id}.wandb").write_bytes(b"")
    return folder


def _attempts(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A run's offline W&B folders: two attempts (the second synced already) and a sweep point's."""
    run = tmp_path / "job-0123abcd"
    first, second = _offline(run, "20260101_000000", "job-0123abcd"), _offline(run, "20260101_000100", "job-0123abcd")
    point = _offline(run / "points" / "0001", "20260101_000000", "job-0123abcd-point-0001")
    (second / "run-job-0123abcd.wandb.synced").write_text("")
    (run / "wandb" / "wandb" / "run-20260101_000200-online1").mkdir()  # an online run: not for sync
    (run / "tensorboard").mkdir()
    return run, [first, second, point]


def test_sync_lists_every_attempts_folder_with_the_sweep_points(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("wandb")  # the tracking extra: the command printed is wandb's own (README's main install lacks it)
    run, (first, second, point) = _attempts(tmp_path)
    runs = sync.offline_runs(run)
    assert [r.path for r in runs] == [first, second, point]
    assert [r.run_id for r in runs] == ["job-0123abcd", "job-0123abcd", "job-0123abcd-point-0001"]
    assert [r.synced for r in runs] == [False, True, False]
    assert sync.sync(run, "job-0123abcd", dry_run=True) == 0
    out = capsys.readouterr().out
    assert "would run: " in out and f"sync {first} {second} {point}" in out and "synced already" in out
    assert f"tensorboard --logdir {run}" in out and "mlflow" not in out  # no mlruns folder: nothing to say


def test_sync_without_wandb_lists_the_folders_and_says_how_to_install_it(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Where wandb is not installed (no tracking extra), sync still lists what it would push, and
    names the install; a real push is refused, naming it too."""
    monkeypatch.setattr(sync, "wandb_command", lambda: None)
    run, folders = _attempts(tmp_path)
    assert sync.sync(run, "job-0123abcd", dry_run=True) == 0
    out = capsys.readouterr().out
    assert all(str(folder) in out for folder in folders) and "would run" not in out
    assert "wandb is not installed here: pip install wandb (or ddp-orchestrator[tracking])" in out
    with pytest.raises(OrchestratorError, match="wandb is not installed here, so nothing was pushed"):
        sync.sync(run, "job-0123abcd")


def test_sync_says_when_a_run_has_nothing_offline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mlruns").mkdir()
    with pytest.raises(OrchestratorError, match="no offline W&B runs .* WANDB_MODE=offline"):
        sync.sync(tmp_path, "quiet", dry_run=True)
    assert f"--backend-store-uri file://{tmp_path}/mlruns" in capsys.readouterr().out


def test_metrics_writer_imports_no_tracker_unless_asked(tmp_path: Path) -> None:
    """Without ORCH_TENSORBOARD_DIR, WANDB_MODE and WANDB_API_KEY, a rank never pays for (or depends on)
    tensorboard or wandb; WANDB_MODE=disabled is off too."""
    code = ("import sys, jobs\n"
            "with jobs.MetricsWriter(sys.argv[1], 0, start_step=0) as m:\n"
            "    m.train(0, 1.0); m.evaluation(1, 1, 0.5, 1.0); m.throughput(0, 8, 1.0)\n"
            "print(sorted(n for n in ('tensorboard', 'wandb', 'torch') if n in sys.modules))\n")
    env = {"PATH": "/usr/bin:/bin", "WANDB_MODE": "disabled", "WANDB_API_KEY": "x" * 40}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
    assert (tmp_path / "metrics" / "rank-0.jsonl").read_text().count("\n") == 4


def test_mlflow_writes_into_the_run_folder_whatever_its_path_holds(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A '#' (a fragment), '?' (a query), '%' (an escape) or a space in the run folder's path is part
    of the path: the URI is percent-encoded, and MLflow itself writes under exactly <run>/mlruns."""
    pytest.importorskip("mlflow")
    cwd = tmp_path / "p%25q"  # '%25' would decode to '%' from an unencoded URI
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    launch = _plan(tmp_path, runs_dir="runs #1 ?x")  # relative: under the folder holding '%'
    run = Path(launch.run_dir)
    assert all(ch in str(run) for ch in "#?% ")
    env = launch.ranks[0].env
    assert env["MLFLOW_TRACKING_URI"] == run.joinpath("mlruns").as_uri() and "%23" in env["MLFLOW_TRACKING_URI"]
    code = "import mlflow; mlflow.log_metric('loss', 0.5); mlflow.end_run()"
    child = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**child, **{k: env[k] for k in tracking.MLFLOW_VARS + ("MLFLOW_ALLOW_FILE_STORE",)}})
    assert out.returncode == 0, out.stderr
    metrics = list((run / "mlruns").glob("*/*/metrics/loss"))
    assert len(metrics) == 1 and metrics[0].read_text().split()[1] == "0.5", sorted(map(str, run.rglob("*")))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p%25q"]  # nothing written beside it
    assert sorted(p.name for p in cwd.iterdir()) == ["runs #1 ?x"]


def test_sync_never_follows_a_symlink_out_of_the_run_folder(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A link inside the run folder that leads elsewhere (another run's offline folder, a whole
    foreign wandb/ or points/ folder, a foreign store) is neither synced nor pointed at; each is
    said in one line. A link that stays inside the run folder is followed."""
    run, foreign = tmp_path / "job-0123abcd", tmp_path / "other-run"
    own = _offline(run, "20260101_000000", "job-0123abcd")
    theirs = _offline(foreign, "20250101_000000", "other")
    (run / "wandb" / "wandb" / "offline-run-20260101_000100-stolen").symlink_to(theirs)  # one folder
    inner = _offline(run / "attic", "20260101_000200", "job-0123abcd")  # a link that stays inside
    (run / "wandb" / "wandb" / inner.name).symlink_to(inner)
    (run / "points").mkdir()
    (run / "points" / "0000").symlink_to(foreign)  # a whole point: its wandb/ is the foreign run's
    _offline(run / "points" / "0001", "20260101_000000", "job-0123abcd-point-0001")
    (run / "points" / "0001" / "wandb" / "wandb" / "offline-run-20260101_000300-log").mkdir()
    (run / "points" / "0001" / "wandb" / "wandb" / "offline-run-20260101_000300-log" / "run-log.wandb").symlink_to(
        theirs / "run-other.wandb")  # the log wandb sync would upload
    (foreign / "mlruns").mkdir()
    (foreign / "tensorboard").mkdir()
    (run / "mlruns").symlink_to(foreign / "mlruns")
    (run / "tensorboard").symlink_to(foreign / "tensorboard")

    assert [r.path for r in sync.offline_runs(run)] == [own, run / "wandb" / "wandb" / inner.name,
                                                        run / "points" / "0001" / "wandb" / "wandb" /
                                                        "offline-run-20260101_000000-job-0123abcd-point-0001"]
    assert sync.viewer_lines(run) == []  # neither the store nor the events lie in the run folder
    assert sync.sync(run, "job-0123abcd", dry_run=True) == 0
    out, err = capsys.readouterr()
    assert str(foreign) not in out and "other" not in out and "stolen" not in out, out
    skipped = err.splitlines()
    assert sorted(line.split(":")[0] for line in skipped) == ["warning"] * 5, err
    for path in ["wandb/wandb/offline-run-20260101_000100-stolen", "points/0000", "mlruns", "tensorboard",
                 "points/0001/wandb/wandb/offline-run-20260101_000300-log/run-log.wandb"]:
        assert sum(line.startswith(f"warning: skipped {run / path}: a symbolic link leads it out of the run folder")
                   for line in skipped) == 1, (path, err)


def test_sync_follows_a_run_folder_reached_through_a_link(tmp_path: Path) -> None:
    """The runs folder itself may be a link (to scratch): what lies in the run folder is its own."""
    real = tmp_path / "scratch" / "job-0123abcd"
    first = _offline(real, "20260101_000000", "job-0123abcd")
    (tmp_path / "runs").symlink_to(tmp_path / "scratch")
    runs = sync.offline_runs(tmp_path / "runs" / "job-0123abcd")
    assert [r.path.name for r in runs] == [first.name]
