"""Code snapshots on real local runs, driven through the CLI as a user does: edits made after
``run --detach`` (or between two attempts) never reach the ranks; ``code: {snapshot: false}`` runs
the live files; a module entrypoint reached through PYTHONPATH is imported from the snapshot's
tree; ``plan`` shows the identity and code lines, ``diff`` what changed since; and an operational
change (``--set local.timeout_s=...``) runs again in the same run folder, resuming its checkpoints.

Each project is a git repository of its own in tmp_path (tmp_path itself lies in the checkout's
git-ignored .pytest-tmp/, where a script would be refused as ignored)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import yaml

from orchestrator.api import Run

ROOT = Path(__file__).resolve().parents[2]
RUN_WAIT_S = 60  # the most a run here may take (each takes a few seconds)


def orch(*args: str, cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def shown(out: subprocess.CompletedProcess[str]) -> str:
    return f"rc={out.returncode}\n--- stdout\n{out.stdout[-4000:]}\n--- stderr\n{out.stderr[-4000:]}"


def git(repo: Path, *args: str) -> None:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def project(path: Path, files: dict[str, str], spec: dict[str, Any] | None = None) -> Path:
    """A git repository holding ``files`` (dedented) and spec.yaml, committed."""
    path.mkdir(parents=True)
    git(path, "init", "-q")
    git(path, "config", "user.email", "t@example.com")
    git(path, "config", "user.name", "t")
    git(path, "config", "commit.gpgsign", "false")
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(textwrap.dedent(text))
    if spec is not None:
        (path / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (path / ".gitignore").write_text("runs/\n__pycache__/\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "init")
    return path


def started_id(out: subprocess.CompletedProcess[str]) -> str:
    found = re.search(r"^started (\S+) in the background", out.stdout, re.M)
    assert out.returncode == 0 and found, shown(out)
    return found[1]


def ended_id(out: subprocess.CompletedProcess[str]) -> str:
    found = re.search(r"^(\S+): COMPLETED  \(run folder ", out.stdout, re.M)
    assert out.returncode == 0 and found, shown(out)
    return found[1]


def wait_ended(run_dir: Path, timeout: float = RUN_WAIT_S) -> str:
    return str(Run.get(str(run_dir)).wait(timeout=timeout, attempts=False))


def rank_log(run_dir: Path, rank: int = 0) -> str:
    return (run_dir / "logs" / f"rank-{rank}.log").read_text(errors="replace")


def wait_for(path: Path, timeout: float = RUN_WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


#: A torchrun-style script: waits (bounded) for a "go" file, then imports its sibling module and
#: prints what it got, and which file it runs from.
WAITING_SCRIPT = """\
    import os, sys, time
    MARKER = "script-old"
    go = sys.argv[1]
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.05)
    import helper  # imported after the edit: the snapshot's, or the live one
    said = open(__file__).read().split('MARKER = "')[1].split('"')[0]  # what the file it runs from says now
    print(f"rank={os.environ['RANK']} helper={helper.VALUE} marker={MARKER} file-says={said}", flush=True)
    print(f"file={__file__}", flush=True)
    print(f"helper-file={helper.__file__}", flush=True)
"""
HELPER = 'VALUE = "helper-old"\n'


def _edit(proj: Path) -> None:
    (proj / "helper.py").write_text('VALUE = "helper-new"\n')
    script = proj / "train.py"
    script.write_text(script.read_text().replace('MARKER = "script-old"', 'MARKER = "script-new"'))


def _waiting_project(tmp_path: Path, **spec: Any) -> tuple[Path, Path]:
    go = tmp_path / "signals" / "go"
    go.parent.mkdir()
    proj = project(tmp_path / "proj", {"train.py": WAITING_SCRIPT, "helper.py": HELPER}, {
        "name": "snap", "entrypoint": "train.py", "extra_args": [str(go)], "nodes": 1, "cpu_ranks_per_node": 2,
        "runs_dir": "runs", "local": {"preload_torch": False, "timeout_s": RUN_WAIT_S}, **spec})
    return proj, go


# ---- edits after run --detach ------------------------------------------------------------------
def test_edits_after_a_detached_run_never_reach_its_ranks(tmp_path: Path) -> None:
    proj, go = _waiting_project(tmp_path)
    run_id = started_id(orch("run", "--detach", "spec.yaml", cwd=proj))
    _edit(proj)
    go.touch()
    run_dir = proj / "runs" / run_id
    assert wait_ended(run_dir) == "COMPLETED", rank_log(run_dir)
    code = json.loads((run_dir / "code.json").read_text())
    tree = Path(code["tree"])  # <store>/trees/<id>-<root hash>/ mirrors the project's last folders
    view = tree.relative_to(proj / "runs" / ".code" / "trees").parts
    assert view[0].startswith(code["id"] + "-") and view[1:] == proj.parts[-3:], tree
    assert code["root"] == str(proj) and code["how"] == "git"
    for rank in (0, 1):
        log = rank_log(run_dir, rank)
        assert f"rank={rank} helper=helper-old marker=script-old file-says=script-old" in log, log
        assert f"file={tree / 'train.py'}" in log and f"helper-file={tree / 'helper.py'}" in log, log
        assert "helper-new" not in log and "script-new" not in log, log
    assert (tree / "helper.py").read_text() == HELPER  # the tree is as it was submitted
    assert "helper-new" in (proj / "helper.py").read_text()


def test_code_snapshot_false_runs_the_live_files(tmp_path: Path) -> None:
    proj, go = _waiting_project(tmp_path, code={"snapshot": False})
    plan = orch("plan", "spec.yaml", cwd=proj)
    assert "code: the ranks import the live files (code.snapshot: false)" in plan.stdout, shown(plan)
    run_id = started_id(orch("run", "--detach", "spec.yaml", cwd=proj))
    _edit(proj)
    go.touch()
    run_dir = proj / "runs" / run_id
    assert wait_ended(run_dir) == "COMPLETED", rank_log(run_dir)
    log = rank_log(run_dir)
    # what it reads and imports after the edit is live (when it compiled the script itself depends on
    # when the rank started, which may be before or after the edit)
    assert "rank=0 helper=helper-new marker=script-" in log and "file-says=script-new" in log, log
    assert f"file={proj / 'train.py'}" in log and f"helper-file={proj / 'helper.py'}" in log, log
    assert not (run_dir / "code.json").exists() and not (proj / "runs" / ".code").exists()


# ---- a restart after a crash runs the submitted code again ---------------------------------------
CRASH_ONCE = """\
    import os, sys, time
    MARKER = "script-old"
    import helper
    signals = sys.argv[1]
    attempt = os.environ["ORCH_ATTEMPT"]
    with open(os.path.join(signals, f"attempt-{attempt}.txt"), "w") as f:
        f.write(f"helper={helper.VALUE} marker={MARKER} file={__file__}\\n")
    if not os.path.exists(os.path.join(signals, "crashed")):
        open(os.path.join(signals, "crashed"), "w").close()
        deadline = time.monotonic() + 60  # the test edits the code now, then says go
        while not os.path.exists(os.path.join(signals, "go")) and time.monotonic() < deadline:
            time.sleep(0.05)
        raise RuntimeError("injected crash on the first attempt")
    print("second attempt done", flush=True)
"""


def test_a_restart_after_a_crash_still_runs_the_submitted_code(tmp_path: Path) -> None:
    signals = tmp_path / "signals"
    signals.mkdir()
    proj = project(tmp_path / "proj", {"train.py": CRASH_ONCE, "helper.py": HELPER}, {
        "name": "crashy", "entrypoint": "train.py", "extra_args": [str(signals)], "nodes": 1,
        "cpu_ranks_per_node": 1, "runs_dir": "runs", "recovery": {"max_restarts": 1},
        "local": {"preload_torch": False, "timeout_s": RUN_WAIT_S}})
    run_id = started_id(orch("run", "--detach", "spec.yaml", cwd=proj))
    wait_for(signals / "crashed")
    _edit(proj)
    (proj / "newmodule.py").write_text("X = 1\n")
    (signals / "go").touch()
    run_dir = proj / "runs" / run_id
    assert wait_ended(run_dir) == "COMPLETED", rank_log(run_dir)
    record = Run.get(run_id).record
    assert record.attempts == 2
    seen = sorted(signals.glob("attempt-*.txt"))  # one per attempt, named by ORCH_ATTEMPT
    assert len(seen) == 2, seen
    tree = json.loads((run_dir / "code.json").read_text())["tree"]
    assert [p.read_text() for p in seen] == [f"helper=helper-old marker=script-old file={tree}/train.py\n"] * 2
    assert not (Path(tree) / "newmodule.py").exists()


# ---- a module entrypoint ---------------------------------------------------------------------------
def test_a_module_entrypoint_reached_through_pythonpath_is_imported_from_the_tree(tmp_path: Path) -> None:
    proj = project(tmp_path / "proj", {
        "mypkg/__init__.py": "",
        "mypkg/util.py": 'WHO = "util-old"\n',
        "mypkg/train.py": """\
            import os
            import mypkg.util
            def main(argv):
                print(f"train-file={__file__}", flush=True)
                print(f"util-file={mypkg.util.__file__} who={mypkg.util.WHO}", flush=True)
                return {"who": mypkg.util.WHO}
        """,
    })
    work = tmp_path / "work"  # the CLI runs elsewhere: only PYTHONPATH leads to the live package
    work.mkdir()
    runs = tmp_path / "runs"
    (work / "spec.yaml").write_text(yaml.safe_dump({
        "name": "mod", "entrypoint": "mypkg.train:main", "nodes": 1, "cpu_ranks_per_node": 1,
        "runs_dir": str(runs), "local": {"preload_torch": False, "timeout_s": RUN_WAIT_S}}))
    env = {"PYTHONPATH": f"{proj}{os.pathsep}{ROOT}"}
    plan = orch("plan", "spec.yaml", cwd=work, env=env)
    assert "code: snapshot " in plan.stdout and f" of {proj} (git " in plan.stdout, shown(plan)
    out = orch("run", "spec.yaml", cwd=work, env=env)
    run_id = ended_id(out)
    log = rank_log(runs / run_id)
    trees = runs / ".code" / "trees"
    found = re.search(r"^train-file=(\S+)$", log, re.M)
    assert found and Path(found[1]).is_relative_to(trees), log
    assert Path(found[1]).relative_to(trees).parts[-2:] == ("mypkg", "train.py"), log
    util = re.search(r"^util-file=(\S+) who=(\S+)$", log, re.M)
    assert util and Path(util[1]).is_relative_to(trees) and util[2] == "util-old", log
    assert "imported from the live project" not in log, log


# ---- plan and diff -----------------------------------------------------------------------------
SIMPLE = """\
    import os, sys
    import helper
    print(f"rank={os.environ['RANK']} helper={helper.VALUE}", flush=True)
"""


def test_plan_shows_identity_and_code_lines_and_diff_lists_what_changed_since(tmp_path: Path) -> None:
    proj = project(tmp_path / "proj", {"train.py": SIMPLE, "helper.py": HELPER}, {
        "name": "diffy", "entrypoint": "train.py", "nodes": 1, "cpu_ranks_per_node": 1, "runs_dir": "runs",
        "local": {"preload_torch": False, "timeout_s": RUN_WAIT_S}})
    plan = orch("plan", "spec.yaml", cwd=proj)
    assert plan.returncode == 0, shown(plan)
    identity = re.search(r"^identity: new run (diffy-[0-9a-f]{8})$", plan.stdout, re.M)
    assert identity, shown(plan)
    code = re.search(r"^code: snapshot ([0-9a-f]{20}) of (\S+) \(git ([0-9a-f]{12})\): (\d+) files, .*; "
                     r"(\d+) new file\(s\), .* to store; the ranks import it from (\S+)$", plan.stdout, re.M)
    assert code, shown(plan)
    assert code[2] == str(proj) and int(code[4]) == 4  # .gitignore, helper.py, spec.yaml, train.py
    assert code[6].startswith(str(proj / "runs" / ".code" / "trees" / code[1]) + "-") and code[6].endswith("/proj")
    assert not (proj / "runs").exists()  # plan stores nothing
    run_id = ended_id(orch("run", "spec.yaml", cwd=proj))
    assert run_id == identity[1]
    again = orch("plan", "spec.yaml", cwd=proj)
    assert f"snapshot {code[1]} " in again.stdout and "; already stored;" in again.stdout, shown(again)
    assert f"identity: run {run_id} exists with no checkpoint in checkpoint.dir (" in again.stdout, shown(again)

    same = orch("diff", run_id, cwd=proj)
    assert same.returncode == 0, shown(same)
    assert f"{proj}: no change since snapshot {code[1]}, git {code[3]}" in same.stdout, shown(same)

    (proj / "helper.py").write_text('VALUE = "helper-new"\n')
    (proj / "extra.py").write_text("E = 1\n")
    changed = orch("diff", run_id, cwd=proj)
    assert changed.returncode == 0, shown(changed)
    out = changed.stdout
    assert f"2 file(s) changed since snapshot {code[1]}" in out, shown(changed)
    assert re.search(r"^  added\s+extra\.py$", out, re.M) and re.search(r"^  modified\s+helper\.py$", out, re.M), out
    assert "--- snapshot/helper.py" in out and "+++ disk/helper.py" in out
    assert '-VALUE = "helper-old"' in out and '+VALUE = "helper-new"' in out and "+E = 1" in out
    stat = orch("diff", run_id, "--stat", cwd=proj)
    assert "modified  helper.py" in stat.stdout and "---" not in stat.stdout, shown(stat)
    (proj / "helper.py").write_text(HELPER)  # undone: no change again (the untracked file aside)
    (proj / "extra.py").unlink()
    assert "no change since snapshot" in orch("diff", run_id, cwd=proj).stdout


def test_diff_of_a_run_without_snapshot_says_why(tmp_path: Path) -> None:
    proj = project(tmp_path / "proj", {"train.py": SIMPLE, "helper.py": HELPER}, {
        "name": "live", "entrypoint": "train.py", "nodes": 1, "cpu_ranks_per_node": 1, "runs_dir": "runs",
        "code": {"snapshot": False}, "local": {"preload_torch": False, "timeout_s": RUN_WAIT_S}})
    run_id = ended_id(orch("run", "spec.yaml", cwd=proj))
    out = orch("diff", run_id, cwd=proj)
    assert out.returncode != 0 and "has no code snapshot" in out.stderr and "Traceback" not in out.stderr, shown(out)


# ---- an operational change resumes the same run ------------------------------------------------
CHECKPOINTING = """\
    import os, sys
    folder = os.environ["ORCH_CHECKPOINT_DIR"]
    os.makedirs(folder, exist_ok=True)
    steps = sorted(int(n[5:15]) for n in os.listdir(folder) if n.startswith("ckpt-"))
    start = steps[-1] if steps else 0
    print(f"start={start} argv={sys.argv[1:]}", flush=True)
    with open(os.path.join(folder, f"ckpt-{start + 5:010d}.pt"), "wb") as f:
        f.write(b"weights")
"""


def test_an_operational_change_reuses_the_run_folder_and_resumes(tmp_path: Path) -> None:
    proj = project(tmp_path / "proj", {"train.py": CHECKPOINTING}, {
        "name": "ident", "entrypoint": "train.py", "args": {"lr": 0.1}, "nodes": 1, "cpu_ranks_per_node": 1,
        "runs_dir": "runs", "local": {"preload_torch": False, "timeout_s": RUN_WAIT_S}})
    first = orch("run", "spec.yaml", cwd=proj)
    run_id = ended_id(first)
    run_dir = proj / "runs" / run_id
    assert "start=0" in rank_log(run_dir)
    assert (run_dir / "checkpoints" / "ckpt-0000000005.pt").is_file()

    plan = orch("plan", "spec.yaml", "--set", "local.timeout_s=600", cwd=proj)
    assert plan.returncode == 0, shown(plan)
    assert (f"identity: resumes run {run_id} at step 5 ({run_dir / 'checkpoints' / 'ckpt-0000000005.pt'})"
            in plan.stdout), shown(plan)
    assert "warning:" not in plan.stdout + plan.stderr

    again = orch("run", "spec.yaml", "--set", "env.FOO='1'", "--set", "local.timeout_s=600", cwd=proj)
    assert ended_id(again) == run_id
    assert f"identity: resumes run {run_id} at step 5" in again.stdout + again.stderr, shown(again)
    assert "start=5" in rank_log(run_dir)
    assert sorted(p.name for p in (proj / "runs").iterdir() if not p.name.startswith(".")) == [run_id]

    # a training change starts another run, and plan names the field that made it miss these checkpoints
    other = orch("plan", "spec.yaml", "--set", "args.lr=0.2", cwd=proj)
    assert other.returncode == 0, shown(other)
    new = re.search(r"^identity: new run (ident-[0-9a-f]{8})$", other.stdout, re.M)
    assert new and new[1] != run_id, shown(other)
    warning = f"warning: run {run_id} holds checkpoints (step 10) of this job name; this spec differs in args.lr,"
    assert warning in other.stdout + other.stderr, shown(other)
