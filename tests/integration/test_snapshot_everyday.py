"""The code snapshot in folders as people keep them, through the CLI as a user runs it.

- ``orchestrator run spec.yaml > run.log 2>&1`` from the project folder, while another process
  appends to a log there every 20 ms, with a big ``lightning_logs/`` and a ``wandb/`` beside the
  script: the run starts on the first try, three times in a row, and freezes none of the outputs;
  the script still reads ``data/`` beside its ``__file__`` and ``../../Datasets`` above it.
- A damaged blob or tree never runs: a truncated blob is stored again from the project, and a
  script that writes over a file beside its own ``__file__`` (as root: modes do not stop it)
  leaves every blob matching its name; the next run rebuilds the tree and runs the code as frozen.
- ``plan --json`` shows the ``PYTHONPATH`` every rank sees when it names a folder of the project.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

from tests.integration.test_code_snapshot import ROOT, RUN_WAIT_S, ended_id, orch, project, rank_log, shown

#: Reads data beside its own file and two folders above it, as Lightning's examples do.
READER = """\
    import os, sys
    from pathlib import Path
    import helper
    here = Path(__file__).parent
    numbers = (here / "data" / "numbers.npy").read_bytes()
    above = os.path.join(os.path.dirname(__file__), "..", "..", "Datasets", "MNIST", "raw.bin")
    print(f"rank={os.environ['RANK']} helper={helper.VALUE} data={len(numbers)} above={open(above).read()}",
          flush=True)
"""


def _blobs_match(store: Path) -> None:
    blobs = [p for p in (store / "blobs").glob("*/*") if p.is_file()]
    assert blobs
    for blob in blobs:
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name, blob


def _messy(top: Path) -> Path:
    """A project outside git, two folders under ``top``, with outputs and data around its script."""
    proj = top / "a" / "b" / "proj"
    for rel, text in {"train.py": READER, "helper.py": 'VALUE = "h1"\n'}.items():
        (proj / rel).parent.mkdir(parents=True, exist_ok=True)
        (proj / rel).write_text(textwrap.dedent(text))
    (proj / "data").mkdir()
    (proj / "data" / "numbers.npy").write_bytes(b"\x93NUMPY" + bytes(2000))
    (top / "a" / "Datasets" / "MNIST").mkdir(parents=True)
    (top / "a" / "Datasets" / "MNIST" / "raw.bin").write_text("mnist")
    (proj / "lightning_logs" / "version_0").mkdir(parents=True)
    with open(proj / "lightning_logs" / "version_0" / "last.ckpt", "wb") as f:
        f.truncate(40 << 20)  # sparse: 40 MB a scan would have to read
    (proj / "lightning_logs" / "version_0" / "hparams.yaml").write_text("lr: 0.1\n")
    (proj / "wandb" / "run-1" / "files").mkdir(parents=True)
    (proj / "wandb" / "run-1" / "files" / "config.yaml").write_text("a: 1\n")
    (proj / "spec.yaml").write_text(yaml.safe_dump({
        "name": "messy", "entrypoint": "train.py", "nodes": 1, "cpu_ranks_per_node": 2, "runs_dir": "runs",
        "local": {"preload_torch": False, "timeout_s": RUN_WAIT_S}}))
    return proj


def test_a_log_redirected_into_the_project_and_a_busy_folder_never_refuse_a_run(tmp_path: Path) -> None:
    proj = _messy(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GIT_CEILING_DIRECTORIES": str(tmp_path)}
    appender = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""\
        import time, sys
        end = time.monotonic() + 120
        with open(sys.argv[1], "a") as log:
            while time.monotonic() < end:
                log.write(f"{time.time()} step\\n"); log.flush(); time.sleep(0.02)
        """), str(proj / "app.log")])
    try:
        for attempt in range(3):
            out = subprocess.run(f"{sys.executable} -m orchestrator run spec.yaml > run.log 2>&1", shell=True,
                                 cwd=proj, env=env, timeout=120)
            log = (proj / "run.log").read_text(errors="replace")
            assert out.returncode == 0, f"attempt {attempt + 1}: {log[-3000:]}"
            assert "rank=1 helper=h1 data=2006 above=mnist" in log, log[-3000:]
    finally:
        appender.kill()
        appender.wait(timeout=10)
    run_id = re.search(r"^(\S+): COMPLETED", log, re.M)
    assert run_id, log
    code = json.loads((proj / "runs" / run_id[1] / "code.json").read_text())
    manifest = json.loads(Path(code["manifest"]).read_text())
    assert sorted(manifest["files"]) == ["helper.py", "spec.yaml", "train.py"]
    assert code["bytes"] < 10_000
    left = code["left_out"]
    assert any("lightning_logs/" in v["examples"] for v in left.values()), left
    assert not (proj / "runs" / run_id[1]).joinpath("lock").exists() or (proj / "runs" / run_id[1] / "record.json").exists()
    plan = orch("plan", "spec.yaml", cwd=proj, env={"GIT_CEILING_DIRECTORIES": str(tmp_path)})
    assert "left out, found live at the same place:" in plan.stdout and "lightning_logs/" in plan.stdout, shown(plan)
    _blobs_match(proj / "runs" / ".code")


def test_in_git_a_redirected_log_and_untracked_outputs_are_left_out(tmp_path: Path) -> None:
    proj = project(tmp_path / "proj", {"train.py": "import helper\nprint('ok', helper.VALUE, flush=True)\n",
                                       "helper.py": 'VALUE = "g1"\n'}, {
        "name": "gitlog", "entrypoint": "train.py", "nodes": 1, "cpu_ranks_per_node": 2, "runs_dir": "runs",
        "local": {"preload_torch": False, "timeout_s": RUN_WAIT_S}})
    (proj / "outputs").mkdir()
    (proj / "outputs" / "result.json").write_text("{}")
    (proj / "notes.py").write_text("NOTE = 1\n")  # untracked code: frozen
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(f"{sys.executable} -m orchestrator run spec.yaml > run.log 2>&1", shell=True, cwd=proj,
                         env=env, timeout=120)
    log = (proj / "run.log").read_text(errors="replace")
    assert out.returncode == 0 and "ok g1" in log, log[-3000:]
    run_id = re.search(r"^(\S+): COMPLETED", log, re.M)
    code = json.loads((proj / "runs" / run_id[1] / "code.json").read_text())  # type: ignore[index]
    files = sorted(json.loads(Path(code["manifest"]).read_text())["files"])
    assert files == [".gitignore", "helper.py", "notes.py", "spec.yaml", "train.py"], files


def test_a_damaged_blob_or_tree_never_runs(tmp_path: Path) -> None:
    writer = """\
        import os
        from pathlib import Path
        import helper
        print(f"helper={helper.VALUE} tag={os.environ['TAG']}", flush=True)
        if os.environ["RANK"] == "0" and os.environ.get("SPOIL"):
            target = Path(__file__).parent / "helper.py"
            os.chmod(target, 0o644)
            target.write_text('VALUE = "spoiled"\\n')  # as root: the tree's modes do not stop it
    """
    proj = project(tmp_path / "proj", {"train.py": writer, "helper.py": 'VALUE = "good"\n'}, {
        "name": "damage", "entrypoint": "train.py", "nodes": 1, "cpu_ranks_per_node": 1, "runs_dir": "runs",
        "env": {"SPOIL": "1", "TAG": "1"}, "local": {"preload_torch": False, "timeout_s": RUN_WAIT_S}})
    store = proj / "runs" / ".code"
    run_id = ended_id(orch("run", "spec.yaml", cwd=proj))
    assert "helper=good tag=1" in rank_log(proj / "runs" / run_id)
    _blobs_match(store)  # the rank wrote into its tree, never into a blob
    helper_sha = hashlib.sha256(b'VALUE = "good"\n').hexdigest()
    blob = store / "blobs" / helper_sha[:2] / helper_sha
    os.chmod(blob, 0o644)
    blob.write_bytes(b"")  # truncated: an empty helper would run and "succeed"
    os.utime(proj / "train.py")  # the tree is checked at the next start whatever the index says
    again = orch("run", "spec.yaml", "--set", "env.SPOIL=", "--set", "env.TAG=two", cwd=proj)
    assert ended_id(again) == run_id, shown(again)
    log = rank_log(proj / "runs" / run_id)
    assert "helper=good tag=two" in log and "spoiled" not in log, log
    _blobs_match(store)


def test_plan_shows_the_pythonpath_every_rank_sees(tmp_path: Path) -> None:
    proj = project(tmp_path / "proj", {
        "src/mypkg/__init__.py": 'WHO = "pkg"\n',
        "train.py": "import os, mypkg\nprint('PYTHONPATH=' + os.environ['PYTHONPATH'], flush=True)\n",
    }, {"name": "pp", "entrypoint": "train.py", "nodes": 1, "cpu_ranks_per_node": 2, "runs_dir": "runs",
        "local": {"timeout_s": RUN_WAIT_S}})
    env = {"PYTHONPATH": f"{proj / 'src'}{os.pathsep}{ROOT}"}
    plan = orch("plan", "spec.yaml", "--json", cwd=proj, env=env)
    assert plan.returncode == 0, shown(plan)
    rows = json.loads(plan.stdout)["ranks"]
    planned = {row["env"]["PYTHONPATH"] for row in rows}
    assert len(planned) == 1 and "/.code/trees/" in next(iter(planned)), planned
    run_id = ended_id(orch("run", "spec.yaml", cwd=proj, env=env))
    for rank in (0, 1):
        seen = re.search(r"^PYTHONPATH=(.*)$", rank_log(proj / "runs" / run_id, rank), re.M)
        assert seen and seen[1] == next(iter(planned)), (seen, planned)


def test_a_refused_start_leaves_no_half_made_run_folder(tmp_path: Path) -> None:
    proj = project(tmp_path / "proj", {"train.py": "print('never')\n"}, {
        "name": "refused", "entrypoint": "train.py", "nodes": 1, "cpu_ranks_per_node": 1, "runs_dir": "runs",
        "local": {"preload_torch": False, "timeout_s": RUN_WAIT_S}})
    (proj / "runs" / ".code").mkdir(parents=True)
    (proj / "runs" / ".code" / "trees").write_text("in the way")  # the snapshot's tree cannot be built
    out = orch("run", "spec.yaml", cwd=proj)
    assert out.returncode != 0 and "cannot store the code snapshot" in out.stderr, shown(out)
    assert "Traceback" not in out.stderr, shown(out)
    assert sorted(p.name for p in (proj / "runs").iterdir()) == [".code"], list((proj / "runs").iterdir())
    (proj / "runs" / ".code" / "trees").unlink()
    assert ended_id(orch("run", "spec.yaml", cwd=proj)).startswith("refused-")
