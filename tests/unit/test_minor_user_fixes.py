"""Four small things a user met (the tester's "minor" list): a script given where its spec belongs is
named as such; argparse's refusal is in a failed rank's summary; the zygote says it stopped
leftovers it could not list only when it did; and plan shows a sweep point's tracker values as the
rule, not as a mangled id or a percent-encoded folder."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.core.errors import SpecError
from orchestrator.node import tracking
from orchestrator.node.launcher import exit_message
from orchestrator.plan import plan
from orchestrator.spec.loading import load_spec, read_spec_file, spec_from_dict

ROOT = Path(__file__).resolve().parents[2]


# ---- 1. `orchestrator run train.py`: the script, not its spec


def test_a_python_script_given_as_the_spec_is_named_before_it_is_parsed(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text('import os\nx = 1\nprint(f"rank {os.environ[\'RANK\']}: {x}")\n')  # YAML cannot parse this
    assert main(["validate", str(script)]) == 2
    err = capsys.readouterr().err
    assert f"{script}: is a Python script, not a job spec" in err
    assert f"`entrypoint: {script}`" in err and "docs/manual/specs.md" in err
    assert "cannot parse" not in err


@pytest.mark.parametrize("name", ["train.py", "TRAIN.PY", "gui.pyw"])
def test_every_way_a_spec_is_loaded_says_so(tmp_path: Path, name: str) -> None:
    script = tmp_path / name
    script.write_text("x: 1\n")  # even one that YAML would read: the suffix decides, as for YAML and JSON
    for load in (read_spec_file, load_spec):  # load_spec: validate, plan, run, submit and pipeline stages
        with pytest.raises(SpecError, match="is a Python script, not a job spec") as caught:
            load(script)
        assert caught.value.source == str(script)
    for name in ("spec.yaml", "spec.YML", "spec.json", "spec"):  # a spec by its suffix, or with none, still loads
        path = tmp_path / name
        path.write_text('{"x": 1}')  # JSON, which YAML reads too
        assert read_spec_file(path) == {"x": 1}


def test_a_notebook_is_named_and_told_how_to_become_a_script(tmp_path: Path) -> None:
    notebook = tmp_path / "explore.ipynb"
    notebook.write_text(json.dumps({"cells": [], "nbformat": 4}))  # JSON: it would load, as unknown fields
    with pytest.raises(SpecError, match="is a Jupyter notebook, not a job spec") as caught:
        load_spec(notebook)
    assert "nbconvert --to script" in str(caught.value)


# ---- 2. argparse's refusal in the failure summary


def _refused(parser: argparse.ArgumentParser, argv: list[str]) -> SystemExit:
    with pytest.raises(SystemExit) as caught:
        parser.parse_args(argv)
    return caught.value


def test_argparse_s_line_is_in_the_recorded_message(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="train_args.py")
    parser.add_argument("--lr", type=float)
    unknown = _refused(parser, ["--learning-rate", "0.1"])
    assert exit_message(unknown, "2") == "2 (train_args.py: error: unrecognized arguments: --learning-rate 0.1)"
    bad = _refused(parser, ["--lr", "x"])
    assert exit_message(bad, "2") == "2 (train_args.py: error: argument --lr: invalid float value: 'x')"
    assert "train_args.py: error:" in capsys.readouterr().err  # argparse printed it, as ever


def test_a_parser_whose_exit_is_its_own_is_read_from_argparse_s_error() -> None:
    class Quiet(argparse.ArgumentParser):
        def exit(self, status: int = 0, message: str | None = None):  # type: ignore[override]
            sys.exit(status)

    refused = _refused(Quiet(prog="q.py"), ["--nope"])
    assert exit_message(refused, "2") == "2 (q.py: error: unrecognized arguments: --nope)"


def test_without_argparse_s_line_the_summary_says_where_to_look() -> None:
    class Own(argparse.ArgumentParser):
        def error(self, message: str):  # type: ignore[override]
            sys.exit(2)

    for exc in (_refused(Own(), ["--nope"]), SystemExit(2)):
        assert exit_message(exc, "2") == ("2 (the code argparse exits with when it refuses the arguments: see the "
                                          "rank's output above)")
    for other in (SystemExit(1), SystemExit("2"), ValueError("2"), KeyboardInterrupt()):  # keep their message
        assert exit_message(other, "the message") == "the message"


def test_a_parser_that_misbehaves_never_breaks_the_rank_s_way_out() -> None:
    class NoProg:
        @property
        def prog(self) -> str:
            raise RuntimeError("no prog")

    namespace: dict[str, object] = {}  # frames that read as argparse's, holding what no parser would
    exec(compile("def error(self, message):\n    raise SystemExit(2)\n", "/elsewhere/argparse.py", "exec"), namespace)
    for parser, message in ((NoProg(), "bad"), (None, 42)):
        with pytest.raises(SystemExit) as caught:
            namespace["error"](parser, message)  # type: ignore[operator]
        assert exit_message(caught.value, "2").startswith("2 (the code argparse exits with")


def test_a_rank_refused_by_argparse_records_argparse_s_line(tmp_path: Path) -> None:
    """End to end, through the launcher's run_rank (the debug executor's rank, in a fresh process)."""
    (tmp_path / "train_args.py").write_text(textwrap.dedent("""\
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--lr", type=float, default=0.1)
        parser.parse_args()
        """))
    (tmp_path / "spec.yaml").write_text("name: argsjob\nentrypoint: train_args.py\nruns_dir: runs\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "orchestrator", "run", "spec.yaml", "--executor", "debug",
                           "--set", "args.learning-rate=0.1"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    [record] = (tmp_path / "runs").glob("argsjob-*/errors/rank-0.json")
    said = json.loads(record.read_text())
    assert (said["type"], said["message"]) == ("SystemExit",
                                               "2 (train_args.py: error: unrecognized arguments: --learning-rate 0.1)")


# ---- 3. the zygote's "cannot list those processes" only when it stopped something it could not list

_ZYGOTE_PROBE = """\
import os, subprocess, sys, time
from orchestrator.core import platform_caps
listable, live = sys.argv[1] == "listable", sys.argv[2] == "live"
if not listable:  # before the process table is first chosen: this system "cannot list processes"
    platform_caps.process_table = lambda: None
from orchestrator.backends.local import zygote
zygote._KERNEL_GUARD = listable  # a subreaper where processes can be listed (Linux)
# an ended rank's process group: a worker still in it (live), or one that ended by itself
worker = subprocess.Popen(["sleep", "60"] if live else ["true"], start_new_session=True)
if not live:
    worker.wait()
zygote._GROUPS.append(worker.pid)
zygote._end_of_set()
print("worker", "gone" if worker.poll() is not None else "running")
"""


def _end_of_set(listable: bool, live: bool) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _ZYGOTE_PROBE, "listable" if listable else "unlisted",
                           "live" if live else "ended"], cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(sys.platform != "linux", reason="the subreaper's path is Linux's")
def test_a_group_that_emptied_by_itself_is_not_reported_where_processes_can_be_listed() -> None:
    done = _end_of_set(listable=True, live=False)
    assert done.returncode == 0, done.stderr
    assert "cannot list" not in done.stderr
    assert '{"leftovers": []}' in done.stdout


def test_without_a_process_table_only_a_group_really_stopped_is_reported() -> None:
    emptied = _end_of_set(listable=False, live=False)
    assert emptied.returncode == 0, emptied.stderr
    assert "cannot list" not in emptied.stderr and '{"leftovers": []}' in emptied.stdout
    stopped = _end_of_set(listable=False, live=True)
    assert stopped.returncode == 0, stopped.stderr
    assert ("[orchestrator] stopped what 1 rank(s) left running in their process groups (this system cannot list "
            "those processes)") in stopped.stderr
    assert "worker gone" in stopped.stdout


# ---- 4. plan shows a sweep point's tracker values as the rule


def test_plan_shows_a_sweep_point_s_tracker_values_as_the_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in tracking.WANDB_VARS + tracking.TENSORBOARD_VARS + tracking.MLFLOW_VARS:
        monkeypatch.delenv(name, raising=False)
    runs = tmp_path / "a b#"  # a folder the URI must still encode
    launch = plan(spec_from_dict({"name": "wbsweep", "entrypoint": "jobs.train:main", "runs_dir": str(runs),
                                  "sweep": {"lr": [0.1, 0.2]}}), "local")
    rule = tracking.POINT_RULE
    env = launch.ranks[0].env
    assert env["ORCH_RUN_ID"] == f"{launch.run_id}-point-{rule}"
    assert env["WANDB_RUN_ID"] == f"{launch.run_id}-point-{rule}"  # not cleaned up and hashed into a false id
    assert env["WANDB_DIR"] == f"{launch.run_dir}/points/{rule}/wandb"
    encoded = launch.run_dir.replace("a b#", "a%20b%23")
    assert env["MLFLOW_TRACKING_URI"] == f"file://{encoded}/points/{rule}/mlruns"
    ranks = [tracking.environment(launch.payload_for_point(i)) for i in range(2)]  # what the ranks really get
    assert [e["WANDB_RUN_ID"] for e in ranks] == [f"{launch.run_id}-point-{i:04d}" for i in range(2)]
    assert ranks[1]["MLFLOW_TRACKING_URI"] == f"file://{encoded}/points/0001/mlruns"


def test_a_rule_whose_ids_would_be_shortened_says_so() -> None:
    long = "x" * 60 + "-point-" + tracking.POINT_RULE
    shown = tracking.wandb_run_id(long)
    first = tracking.wandb_run_id("x" * 60 + "-point-0000")
    assert shown == f"<each point's own, shortened with a hash: {first} for point 0000>"
