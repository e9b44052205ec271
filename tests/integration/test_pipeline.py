"""A real local pipeline (tiny standard-library stages): stages run in order, a failing stage
stops its ok dependents (never reported COMPLETED) while its any/notok ones run, and a second
run skips the stages that completed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.core.errors import SubmissionError

STAGE = """import json, os, sys, time
out, tag, code = sys.argv[sys.argv.index("--out") + 1], sys.argv[sys.argv.index("--tag") + 1], \\
    int(sys.argv[sys.argv.index("--code") + 1])
start = time.time()
time.sleep(0.2)
with open(os.path.join(out, tag + ".json"), "w") as fh:
    json.dump({"start": start, "end": time.time(), "pid": os.getpid()}, fh)
sys.exit(code)
"""


def _project(tmp_path: Path) -> Path:
    (tmp_path / "out").mkdir()
    (tmp_path / "stage.py").write_text(STAGE)
    for tag in ("prep", "train", "eval", "notify", "always"):
        (tmp_path / f"{tag}.yaml").write_text(json.dumps({
            "name": tag, "entrypoint": str(tmp_path / "stage.py"), "runs_dir": str(tmp_path / "runs"),
            "code": {"snapshot": False}, "local": {"preload_torch": False},
            "args": {"out": str(tmp_path / "out"), "tag": tag, "code": 0}}))
    return tmp_path


def _pipeline(folder: Path, name: str, train_code: int) -> str:
    path = folder / name
    path.write_text(f"""stages:
  prep: {{spec: prep.yaml}}
  train: {{spec: train.yaml, after: [prep], set: ["args.code={train_code}"]}}
  eval: {{spec: eval.yaml, after: [{{stage: train, when: ok}}]}}
  notify: {{spec: notify.yaml, after: [{{stage: train, when: notok}}]}}
  always: {{spec: always.yaml, after: [{{stage: train, when: any}}]}}
""")
    return str(path)


def _stages(out: str) -> dict[str, str]:
    """stage -> what the pipeline said of it ('ran ... COMPLETED', 'cancelled ...')."""
    return {line.split(":")[0]: line.split(":", 1)[1].strip() for line in out.splitlines()
            if line.split(":")[0] in ("prep", "train", "eval", "notify", "always")}


def _times(folder: Path, tag: str) -> dict:
    return json.loads((folder / "out" / f"{tag}.json").read_text())


def test_a_local_pipeline_runs_in_order_stops_ok_dependents_and_skips_completed_stages(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _project(tmp_path)
    failing = _pipeline(folder, "failing.yaml", 3)
    assert main(["pipeline", failing]) == 1
    said = _stages(capsys.readouterr().out)
    assert said["prep"].startswith("ran prep-") and said["prep"].split(": ")[1].startswith("COMPLETED")
    assert said["train"].split(": ")[1].startswith("FAILED")
    assert said["eval"].startswith("cancelled eval-") and "CANCELLED (train ended FAILED, and when: ok" in said["eval"]
    assert said["notify"].split(": ")[1].startswith("COMPLETED") and said["always"].split(": ")[1].startswith("COMPLETED")
    assert not (folder / "out" / "eval.json").exists()  # never started
    assert _times(folder, "prep")["end"] <= _times(folder, "train")["start"] <= _times(folder, "always")["start"]

    # A spec whose own after: names the failed run is refused by a plain run, naming why.
    failed_id = said["train"].split(" ")[1].rstrip(":")
    (folder / "late.yaml").write_text(json.dumps({**json.loads((folder / "eval.yaml").read_text()), "name": "late",
                                                  "after": [{"run": failed_id, "when": "ok"}]}))
    with pytest.raises(SubmissionError, match=f"after: {failed_id} ended FAILED, and when: ok needs it"):
        from orchestrator.api import run

        run(str(folder / "late.yaml"))

    fixed = _pipeline(folder, "fixed.yaml", 0)  # train's args change: a new run; prep is the same run
    prep_run = _times(folder, "prep")
    assert main(["pipeline", fixed, "--plan"]) == 0
    plan = capsys.readouterr().out
    assert "next run: skipped (COMPLETED earlier" in plan and "next run: not started (CANCELLED) (train ended" not in plan
    assert main(["pipeline", fixed]) == 0
    said = _stages(capsys.readouterr().out)
    assert said["prep"].startswith("skipped prep-") and _times(folder, "prep") == prep_run
    assert [said[s].split(": ")[1][:9] for s in ("train", "eval")] == ["COMPLETED"] * 2
    # notify and always: the same runs as in the failing pipeline, where they COMPLETED
    assert said["notify"].startswith("skipped") and said["always"].startswith("skipped")
    assert _times(folder, "train")["end"] <= _times(folder, "eval")["start"]

    assert main(["pipeline", fixed]) == 0  # everything needed has completed: nothing runs
    said = _stages(capsys.readouterr().out)
    assert [v.split(" ")[0] for v in said.values()] == ["skipped"] * 5
    assert main(["pipeline", fixed, "--status"]) == 0
    status = capsys.readouterr().out.splitlines()
    assert status[0] == f"pipeline {fixed}: 5 stage(s), in order"
    rows = {line.split()[0]: line.split() for line in status[1::2]}
    assert [rows[s][2] for s in ("prep", "train", "eval", "notify", "always")] == \
        ["COMPLETED"] * 5
    assert "after: train (notok)" in " ".join(rows["notify"])
