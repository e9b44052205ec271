"""A pipeline on the real cluster: stages run in order through --dependency, a failed stage's
``ok`` dependent is cancelled by SLURM (--kill-on-invalid-dep=yes), and a second submission
skips the stages that completed."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from orchestrator.api import Run
from orchestrator.front.pipeline import pipeline_status, run_pipeline
from orchestrator.core.states import State

#: A stage: records when it started and ended (rank 0), then exits with --code.
STAGE = """import json, os, sys, time
out, tag, code = sys.argv[sys.argv.index("--out") + 1], sys.argv[sys.argv.index("--tag") + 1], \\
    int(sys.argv[sys.argv.index("--code") + 1])
start = time.time()
time.sleep(1.0)
with open(os.path.join(out, tag + ".json"), "w") as fh:
    json.dump({"start": start, "end": time.time()}, fh)
sys.exit(code)
"""


def _pipeline(folder: Path, runs_dir: str, name: str, codes: dict[str, int]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "stage.py").write_text(STAGE)
    for tag, code in codes.items():
        (folder / f"{tag}.yaml").write_text(json.dumps({
            "name": f"{name}-{tag}", "entrypoint": str(folder / "stage.py"), "executor": "slurm", "nodes": 1,
            "cpu_ranks_per_node": 1, "runs_dir": runs_dir, "code": {"snapshot": False},
            "slurm": {"time": "00:05:00", "max_requeues": 0},
            "args": {"out": str(folder), "tag": tag, "code": code}}))
    first, second, third = codes
    path = folder / "pipeline.yaml"
    path.write_text(f"stages:\n  {first}: {{spec: {first}.yaml}}\n  {second}: {{spec: {second}.yaml, after: [{first}]}}\n"
                    f"  {third}: {{spec: {third}.yaml, after: [{{stage: {second}, when: ok}}]}}\n")
    return path


def _ended(results: list, timeout: float = 120) -> dict[str, State]:
    deadline = time.monotonic() + timeout
    out = {}
    for r in results:
        out[r.run_id] = Run.get(r.run_id).wait(timeout=max(1.0, deadline - time.monotonic()), attempts=False)
    return out


def test_pipeline_runs_in_order_cancels_after_a_failure_and_skips_completed_stages(
        cluster: dict[str, str], tmp_path: Path) -> None:
    good = _pipeline(tmp_path / "good", cluster["runs_dir"], "pg", {"prep": 0, "train": 0, "eval": 0})
    bad = _pipeline(tmp_path / "bad", cluster["runs_dir"], "pb", {"prep": 0, "train": 3, "eval": 0})
    first, failing = run_pipeline(good), run_pipeline(bad)  # both at once: the cluster runs them side by side
    assert [r.action for r in first + failing] == ["submitted"] * 6, first + failing
    # Each child was submitted waiting for its parent's job, cancelled if that one fails.
    prep_job, train_job = first[0].job_ids[0], first[1].job_ids[0]
    script = "\n".join(p.read_text() for p in (Path(cluster["runs_dir"]) / first[1].run_id / "slurm").glob("*.sh"))
    assert f"#SBATCH --dependency=afterok:{prep_job}" in script and "#SBATCH --kill-on-invalid-dep=yes" in script
    assert f"afterok:{train_job}" in "".join(
        p.read_text() for p in (Path(cluster["runs_dir"]) / first[2].run_id / "slurm").glob("*.sh"))

    states = _ended(first + failing)
    assert [states[r.run_id] for r in first] == ["COMPLETED"] * 3, states
    times = [json.loads((tmp_path / "good" / f"{tag}.json").read_text()) for tag in ("prep", "train", "eval")]
    assert times[0]["end"] <= times[1]["start"] and times[1]["end"] <= times[2]["start"], times
    # The failed middle stage's dependent: cancelled by SLURM, never run, never left pending.
    assert [states[r.run_id] for r in failing] == ["COMPLETED", "FAILED", "CANCELLED"], states
    assert not (tmp_path / "bad" / "eval.json").exists()
    sacct = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "State,NodeList", "-j", failing[2].job_ids[0]],
                           capture_output=True, text=True, check=True).stdout.split("|")
    # SLURM's own cancel, never given a node (its Start is the cancel's time in some releases: not a sign)
    assert sacct[0].startswith("CANCELLED") and sacct[1].strip() == "None assigned", sacct
    shown = {r.name: r for r in pipeline_status(bad)}
    assert shown["eval"].state == State.CANCELLED and shown["train"].state == State.FAILED

    again = run_pipeline(good)  # the same identities, all COMPLETED: nothing is submitted
    assert [(r.action, r.state) for r in again] == [("skipped", "COMPLETED")] * 3, again
    assert [Run.get(r.run_id).job_ids for r in again] == [r.job_ids for r in first]
