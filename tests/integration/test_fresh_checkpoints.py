"""`run --fresh` starts from no checkpoint, wherever checkpoint.dir is: an explicit one outside the
run folder is moved aside with the folder (<dir>.<n>, said in one line on stderr), per-point
checkpoints of a sweep included, and never while a run that is still active uses it. A plain rerun
still resumes from the same checkpoints. The job is a tiny standard-library script that reports
whether it found an earlier attempt's marker in $ORCH_CHECKPOINT_DIR."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.errors import SubmissionError
from orchestrator.core.records import RunRecord

SCRIPT = Path(__file__).parent / "scripts" / "ckpt_marker.py"


def _spec(tmp_path: Path, ckpt: Path | None, name: str = "fresh", **fields: Any) -> dict[str, Any]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    spec = {"name": name, "entrypoint": str(SCRIPT), "nodes": 1, "cpu_ranks_per_node": 1,
            "runs_dir": str(tmp_path / "runs"), "code": {"snapshot": False}, "local": {"preload_torch": False},
            "args": {"out": str(out), "tag": name}, **fields}
    if ckpt is not None:
        spec["checkpoint"] = {"dir": str(ckpt)}
    return spec


def _seen(tmp_path: Path, tag: str) -> list[dict[str, Any]]:
    path = tmp_path / "out" / f"{tag}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_fresh_moves_an_explicit_checkpoint_dir_aside_and_a_plain_rerun_resumes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator import run

    ckpt = tmp_path / "elsewhere" / "ckpt"  # outside the run folder (runs/<name>-<hash>)
    spec = _spec(tmp_path, ckpt)
    first = run(spec)
    assert first.state == "COMPLETED", first.error
    again = run(spec)  # the same spec again resumes: the checkpoint is found
    assert again.state == "COMPLETED", again.error
    assert [s["found"] for s in _seen(tmp_path, "fresh")] == [None, "1"]

    moved: list[Path] = []
    fresh = run(spec, fresh=True, on_moved=moved.append)
    assert fresh.state == "COMPLETED", fresh.error
    seen = _seen(tmp_path, "fresh")
    assert seen[-1] == {"ckpt": str(ckpt), "found": None}, "a fresh run was handed the old checkpoints"
    assert moved == [first.run_dir.with_name(first.run_dir.name + ".1")]  # the run folder, as before
    assert (ckpt.with_name("ckpt.1") / "marker.txt").read_text() == "2"  # nothing is deleted
    assert (ckpt / "marker.txt").read_text() == "1"
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if str(ckpt.with_name("ckpt.1")) in line]
    assert len(lines) == 1 and "checkpoint" in lines[0], err

    resumed = run(spec)  # and the fresh run is resumed by the next plain run
    assert resumed.state == "COMPLETED", resumed.error
    assert _seen(tmp_path, "fresh")[-1]["found"] == "1"
    run(spec, fresh=True)
    assert (ckpt.with_name("ckpt.2") / "marker.txt").read_text() == "2"  # <dir>.<n>: the next free n


def test_fresh_sweep_starts_every_point_from_nothing(tmp_path: Path) -> None:
    from orchestrator import run

    ckpt = tmp_path / "sweep-ckpt"
    spec = _spec(tmp_path, ckpt, name="sw", sweep={"tag": ["a", "b"]}, args={"out": str(tmp_path / "out")})
    assert run(spec).state == "COMPLETED"
    assert run(spec).state == "COMPLETED"
    assert [[s["found"] for s in _seen(tmp_path, t)] for t in "ab"] == [[None, "1"], [None, "1"]]
    assert run(spec, fresh=True).state == "COMPLETED"
    for tag in "ab":
        last = _seen(tmp_path, tag)[-1]
        assert last["found"] is None, f"point {tag} of a fresh sweep resumed: {last}"
        assert Path(last["ckpt"]).parent == ckpt  # its own point-NNNN folder
    assert sorted(p.parent.name for p in (tmp_path / "sweep-ckpt.1").glob("*/marker.txt")) == \
        ["point-0000", "point-0001"]


def test_fresh_with_the_default_checkpoint_dir_still_starts_over(tmp_path: Path) -> None:
    from orchestrator import run

    spec = _spec(tmp_path, None, name="dflt")
    first = run(spec)
    assert first.state == "COMPLETED"
    assert run(spec, fresh=True).state == "COMPLETED"
    assert [s["found"] for s in _seen(tmp_path, "dflt")] == [None, None]
    assert (first.run_dir.with_name(first.run_dir.name + ".1") / "checkpoints" / "marker.txt").exists()


def test_fresh_refuses_a_checkpoint_dir_an_active_run_uses_and_moves_nothing(tmp_path: Path) -> None:
    from orchestrator import Run, run

    ckpt = tmp_path / "shared-ckpt"
    mine = _spec(tmp_path, ckpt, name="mine")
    assert run(mine).state == "COMPLETED"
    busy = run(_spec(tmp_path, ckpt / "sub", name="busy", args={"out": str(tmp_path / "out"), "tag": "busy",
                                                                 "seconds": 120}), wait=False)
    try:
        deadline = time.monotonic() + 60
        while not _seen(tmp_path, "busy") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert busy.state == "RUNNING"
        with pytest.raises(SubmissionError, match="still active") as info:
            run(mine, fresh=True)
        assert busy.id in str(info.value) and str(ckpt) in str(info.value)
        assert (ckpt / "marker.txt").exists() and not ckpt.with_name("shared-ckpt.1").exists()
        assert RunRecord.load(Run.get(busy.id).run_dir).state == "RUNNING"
        assert len(list((tmp_path / "runs").iterdir())) == 2  # neither run folder was moved
    finally:
        busy.cancel()
    assert run(mine, fresh=True).state == "COMPLETED"  # once it has ended
    assert _seen(tmp_path, "mine")[-1]["found"] is None


def test_fresh_refuses_a_checkpoint_dir_that_holds_the_run_folder(tmp_path: Path) -> None:
    from orchestrator import run

    spec = _spec(tmp_path, tmp_path, name="holds")  # checkpoint.dir above runs_dir
    assert run(spec).state == "COMPLETED"
    with pytest.raises(SubmissionError, match="holds the run folder"):
        run(spec, fresh=True)
    assert not tmp_path.with_name(tmp_path.name + ".1").exists()


def test_cli_run_fresh_says_where_the_checkpoints_went(tmp_path: Path) -> None:
    import subprocess
    import sys

    import yaml

    ckpt = tmp_path / "cli-ckpt"
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_spec(tmp_path, ckpt, name="cli")))
    cmd = [sys.executable, "-m", "orchestrator", "run", str(spec)]
    assert subprocess.run(cmd, capture_output=True, text=True, timeout=120).returncode == 0
    out = subprocess.run([*cmd, "--fresh"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    said = [line for line in out.stderr.splitlines() if "checkpoints" in line]
    assert len(said) == 1 and str(ckpt.with_name("cli-ckpt.1")) in said[0], out.stderr
    assert "moved the previous run folder to" in out.stdout
    assert [s["found"] for s in _seen(tmp_path, "cli")] == [None, None]
