"""Small fixes, each with the behaviour it fixes:

- a submission sbatch refuses leaves no run behind (no FAILED run folder, nothing for ``status`` to
  list with another error than the one the CLI printed), and a sweep's chunks sbatch took before it
  refused one are cancelled;
- a pipeline stage whose script is found from the pipeline's folder, not from the current one, says
  where to run the pipeline from; a stage never started because of an earlier one shows CANCELLED
  in ``pipeline --status``;
- an unquoted scientific-notation number (``1e9``) is a number, in spec files and ``--set`` alike,
  as YAML 1.2 reads it.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.backends.slurm.executor import SlurmExecutor
from orchestrator.core.errors import SubmissionError
from orchestrator.plan import plan
from orchestrator.spec.models import JobSpec


# ---- a submission sbatch refuses ---------------------------------------------------------------------
NO_CLUSTER = ("sbatch: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
              "sbatch: error: fetch_config: DNS SRV lookup failed\n"
              "sbatch: fatal: Could not establish a configuration source")
NO_CONTROLLER = "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)"


def _tool(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def slurm_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder on PATH for fake SLURM tools (srun answers: submitit looks for it), with a SLURM_CONF
    that exists and no SLURM_*/SBATCH_* from the surrounding environment."""
    for key in list(os.environ):
        if key.startswith(("SLURM_", "SBATCH_")):
            monkeypatch.delenv(key)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "srun", "exit 0")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ControlMachine=127.0.0.1\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return bin_dir


def _slurm_spec(tmp_path: Path, **kw) -> JobSpec:
    base = dict(name="refused", entrypoint="jobs.train:main", nodes=1, gpus_per_node=1, executor="slurm",
                runs_dir=str(tmp_path / "runs"), code={"snapshot": False})
    return JobSpec(**{**base, **kw})


@pytest.mark.parametrize("stderr,said", [
    (NO_CLUSTER, "sbatch found no SLURM cluster (SLURM_CONF="),
    (NO_CONTROLLER, "sbatch could not reach the SLURM controller named in"),
    ("sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
     "sbatch refused the job: sbatch: error: Batch job submission failed: Invalid account"),
])
def test_a_submission_sbatch_refuses_leaves_the_run_as_it_was(tmp_path: Path, slurm_tools: Path, stderr: str,
                                                              said: str) -> None:
    """The error is said once, by the CLI. A first submission leaves no run (no FAILED run folder
    whose record says something else: sbatch's raw line), as a refused local start leaves no
    half-made run folder; a resubmission leaves the previous attempt as it was."""
    refuse = tmp_path / "refuse"
    refuse.write_text("")
    _tool(slurm_tools, "sbatch", f"[ -e '{refuse}' ] && {{ printf '%s\\n' '{stderr}' >&2; exit 1; }}\n"
                                 "echo 'Submitted batch job 41'")
    launch = plan(_slurm_spec(tmp_path))
    with pytest.raises(SubmissionError) as err:
        SlurmExecutor().submit(launch)
    assert str(err.value).startswith(said), str(err.value)
    assert not os.path.lexists(launch.run_dir), sorted(os.listdir(launch.run_dir))
    assert [r.run_id for r in api.registered()] == []
    refuse.unlink()
    SlurmExecutor().submit(launch).update(state="COMPLETED")
    refuse.write_text("")
    with pytest.raises(SubmissionError, match=re.escape(said)):
        SlurmExecutor().submit(launch)
    kept = api.Run.get(launch.run_dir).record
    assert (kept.state, kept.job_ids, kept.error, kept.attempts) == ("COMPLETED", ["41"], None, 1)


def test_a_sweep_chunk_refused_cancels_the_chunks_sbatch_took(tmp_path: Path, slurm_tools: Path) -> None:
    """MaxArraySize 3: a sweep of 3 points is two arrays; sbatch takes the first and refuses the
    second. The first is cancelled (its run folder goes: it would run without its payloads), and the
    error says so."""
    counter, cancelled = tmp_path / "sbatch-calls", tmp_path / "scancel-args"
    _tool(slurm_tools, "scontrol", "echo 'MaxArraySize            = 3'")
    _tool(slurm_tools, "scancel", f"echo \"$@\" >> '{cancelled}'")
    _tool(slurm_tools, "sbatch", f"echo x >> '{counter}'\n[ $(wc -l < '{counter}') -gt 1 ] && "
                                 "{ echo 'sbatch: error: QOSMaxSubmitJobPerUserLimit' >&2; exit 1; }\n"
                                 "echo 'Submitted batch job 77'")
    launch = plan(_slurm_spec(tmp_path, sweep={"lr": [0.1, 0.2, 0.3]}))
    with pytest.raises(SubmissionError) as err:
        SlurmExecutor().submit(launch)
    assert "QOSMaxSubmitJobPerUserLimit" in str(err.value)
    assert str(err.value).endswith("the job array(s) sbatch had taken for the sweep's first points (77) were "
                                   "cancelled"), str(err.value)
    assert cancelled.read_text().split() == ["77"]
    assert not os.path.lexists(launch.run_dir)


# ---- a pipeline run from another folder than its specs are written for --------------------------------
PIPELINE = """stages:
  prep:  {spec: prep.yaml}
  train: {spec: train.yaml, after: [prep]}
  eval:  {spec: eval.yaml, after: [{stage: train, when: ok}]}
  notify: {spec: eval.yaml, after: [{stage: train, when: notok}], set: ["args.tag=notify"]}
"""


def _pipeline_folder(root: Path) -> Path:
    """``root/my pipe/``: a pipeline file and its stages' specs, whose scripts are beside them."""
    folder = root / "my pipe"
    folder.mkdir()
    (folder / "pipeline.yaml").write_text(PIPELINE)
    for stage in ("prep", "train", "eval"):
        (folder / f"{stage}.py").write_text("print('hello')\n")
        (folder / f"{stage}.yaml").write_text(f"name: {stage}\nentrypoint: {stage}.py\nruns_dir: runs\n"
                                              "code: {snapshot: false}\n")
    return folder


def test_a_stage_script_found_only_from_the_pipelines_folder_says_where_to_run_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule stays (a stage's spec paths are from the current directory, as any spec's); the
    error says which folder the script is found from and the two fixes, quoted for a shell."""
    from orchestrator.core.errors import SpecError
    from orchestrator.front.pipeline import load_pipeline, load_stages

    folder = _pipeline_folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as err:
        load_stages(load_pipeline("my pipe/pipeline.yaml"))
    assert ("stage prep: entrypoint: script 'prep.py' does not exist (relative paths in a stage's spec are from the "
            "current directory, as for any spec: run the pipeline from "
            f"'{folder}', or write prep.py relative to here: 'my pipe/prep.py')") in str(err.value), str(err.value)
    (folder / "prep.py").unlink()  # found from nowhere: the plain message
    with pytest.raises(SpecError) as err:
        load_stages(load_pipeline("my pipe/pipeline.yaml"))
    assert "'prep.py' does not exist (relative paths are from the current directory)" in str(err.value)
    monkeypatch.chdir(folder)
    (folder / "prep.py").write_text("print('hello')\n")
    assert [s.name for s in load_stages(load_pipeline("pipeline.yaml"))] == ["prep", "train", "eval", "notify"]


def test_a_stage_its_failed_parent_kept_from_running_shows_cancelled(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Locally such a stage is never started (the pipeline reports it CANCELLED) and no run records
    it; ``pipeline --status`` showed '-' for it, as for a stage not run yet. Its notok sibling ran."""
    from orchestrator.core.records import RunRecord
    from orchestrator.core.states import State
    from orchestrator.front.pipeline import load_pipeline, load_stages, pipeline_status, table_lines

    folder = _pipeline_folder(tmp_path)
    monkeypatch.chdir(folder)
    assert {r.name: r.state for r in pipeline_status("pipeline.yaml")} == dict.fromkeys(
        ["prep", "train", "eval", "notify"])  # nothing ran yet: no state
    ended = {"prep": State.COMPLETED, "train": State.FAILED, "notify": State.COMPLETED}
    for stage in load_stages(load_pipeline("pipeline.yaml")):
        if stage.name in ended:
            Path(stage.run_dir).mkdir(parents=True)
            RunRecord(run_id=stage.run_id, run_dir=stage.run_dir, executor="local", world_size=1,
                      state=ended[stage.name]).save()
    results = pipeline_status("pipeline.yaml")
    assert {r.name: r.state for r in results} == {**ended, "eval": State.CANCELLED}
    row = next(line for line in table_lines(results, "pipeline.yaml") if line.split()[0] == "eval")
    assert row.split()[2] == "CANCELLED", row
    assert next(r for r in results if r.name == "eval").action == "submit"  # the next run starts it (train reruns)


# ---- a number with an exponent, written as YAML 1.1 reads it as text ----------------------------------
def test_an_exponent_number_read_as_text_says_how_to_write_it(tmp_path: Path) -> None:
    """The loader reads numbers as YAML 1.1 does (``1e9`` is text; reading it as a number would turn
    ``env: {LR: 1e-4}``, valid text today, into a refused number, and change the run identity and
    the argv of ``args: {lr: 1e-4}``). A number field that gets such text says what to write."""
    from orchestrator.core.errors import SpecError
    from orchestrator.spec.loading import load_spec

    base = {"name": "a", "entrypoint": "jobs.train:main"}
    with pytest.raises(SpecError) as err:
        load_spec(base, overrides=["local.timeout_s=1e5", "stop_grace_s=-2E+4"])
    assert ("local.timeout_s: Input should be a valid number, got text '1e5'; YAML reads a number with an exponent "
            "as a number only with a dot and a signed exponent: write 1.0e+5 or 100000") in str(err.value), str(err.value)
    assert "got text '-2E+4'; YAML reads" in str(err.value) and "write -2.0E+4 or -20000" in str(err.value)
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: a\nentrypoint: jobs.train:main\nnodes: 2e0\n")
    with pytest.raises(SpecError, match=re.escape("nodes: Input should be a valid integer, got text '2e0'; write it "
                                                  "in full: 2")):
        load_spec(spec)
    assert load_spec(base, overrides=["local.timeout_s=1.0e+5"]).local.timeout_s == 100000.0  # as the hint says
    assert load_spec(base, overrides=["args.lr=1e-4", "env.LR=1e-4"]).args["lr"] == "1e-4"  # text stays text
