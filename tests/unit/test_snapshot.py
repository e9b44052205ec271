"""orchestrator.code.snapshot: what a run freezes, how the store keeps it, and how the ranks find it.

What is frozen (the *code rule*): in git, every tracked file plus the untracked files git does not
ignore that are code; outside git, only the files that are code. Code: sources by suffix (any
size) and configuration files by suffix up to ``CONFIG_MAX_BYTES``; untracked files under hidden,
output (``OUTPUT_DIRS``) or run folders are never code. ``.orchignore`` and ``code.exclude`` leave
files out (gitignore's forms, ``!`` taking a path back, the last match deciding), ``code.include``
freezes files the rule leaves out. Every file left out is recorded by reason in
``Snapshot.left_out``; a file that changes during each of its reads is left out with a warning
(only the entrypoint is refused). ``scan(stage=True)`` copies each new file into the store while
hashing it, so ``store`` never needs the live file again.

How the store keeps it: content-addressed read-only blobs (verified whenever they are copied, a
damaged one stored again from the project or refused naming the file), a manifest per snapshot,
and a tree of read-only *copies* at ``Snapshot.view`` (``<store>/trees/<id>-<root hash>/``), the
project at ``Snapshot.tree`` below the mirrored names of its two parent folders; a damaged tree is
rebuilt by the next ``store``. Every tree folder, and the mirrored parents, link the live files
and folders the tree lacks (data beside a script, ``../../Datasets``), never the runs folder or
the store. Also: the index that spares re-reading unchanged files, ``Snapshot.pythonpath``, what
changed on disk since (``changes_since``, ``unified_diff``: one line, or one SnapshotError, for a
damaged blob, manifest or code.json), and where the project is for a script or a module entrypoint.

The tests' tmp_path lies inside the checkout's git-ignored .pytest-tmp/, so a folder there is
"outside git" only with GIT_CEILING_DIRECTORIES set (the ``no_outer_git`` fixture); a project of its
own is made with ``git init``. The tests run as root too: a read-only mode does not stop root, so
the tests that damage a blob or a tree file chmod it first, as a careless rank could."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.code import snapshot as snap_mod
from orchestrator.code import snapshot_files, snapshot_scan, snapshot_store
from orchestrator.code.snapshot import (CONFIG_MAX_BYTES, LEFT_BIG_CONFIG, LEFT_CHANGING, LEFT_IGNORED, LEFT_NOT_CODE,
                                   LEFT_OUTPUT, LEFT_RUN, SnapshotError, changes_since, project_root, scan,
                                   scan_project, store, unified_diff)


# ---- helpers -----------------------------------------------------------------------------------
def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout


def git_repo(path: Path, files: dict[str, str | bytes]) -> Path:
    """A git work tree at ``path`` holding ``files``, all committed."""
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q")
    _git(path, "config", "user.email", "t@example.com")
    _git(path, "config", "user.name", "t")
    _git(path, "config", "commit.gpgsign", "false")
    write(path, files)
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "init")
    return path


def write(root: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)


def blob_files(store_dir: Path) -> list[Path]:
    return [p for p in (store_dir / "blobs").glob("*/*") if p.is_file()]


def blob_of(snap: snap_mod.Snapshot, rel: str) -> Path:
    return snap_mod.blob_path(snap.store_dir, snap.entries[rel].sha)


def tree_files(tree: Path) -> dict[str, Path]:
    return {p.relative_to(tree).as_posix(): p for p in tree.rglob("*") if p.is_file() or p.is_symlink()}


def assert_store_sound(store_dir: Path) -> None:
    """Every blob hashes to its name and is read-only; nothing half-written is left anywhere."""
    if not store_dir.exists():
        return
    for blob in blob_files(store_dir):
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name, blob
        assert stat.S_IMODE(blob.stat().st_mode) == 0o444, blob
    assert not list(store_dir.rglob(".tmp-*"))
    assert not list(store_dir.rglob(".trash-*"))


def overwrite(path: Path, data: bytes) -> None:
    """What a careless rank running as root does to a read-only file."""
    os.chmod(path, 0o644)
    path.write_bytes(data)


@pytest.fixture
def no_outer_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path is not inside any git work tree (the checkout's included), as a folder elsewhere."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    return tmp_path


# ---- what a git project freezes ----------------------------------------------------------------
def test_git_project_holds_tracked_and_untracked_code_less_the_ignored_files(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "proj", {
        "train.py": "import helper\n", "helper.py": "X = 1\n", ".gitignore": "secret.txt\n*.log\n",
        "pkg/__init__.py": "", "pkg/mod.py": "Y = 2\n",
    })
    write(repo, {"untracked.py": "Z = 3\n", "secret.txt": "s", "out.log": "l", "pkg/extra.py": "W = 4\n",
                 "runs/old/record.json": "{}", "notes.md": "n"})
    snap = scan_project("train.py", str(repo), "runs")
    assert snap is not None and snap.how == "git" and snap.root == os.path.realpath(repo)
    assert sorted(snap.entries) == [".gitignore", "helper.py", "pkg/__init__.py", "pkg/extra.py", "pkg/mod.py",
                                    "train.py", "untracked.py"]
    assert not any(rel.startswith("runs/") for rel in snap.entries)  # the runs folder, though git sees it
    assert snap.left_out == {LEFT_NOT_CODE: ("notes.md",)}  # git's ignored files are not even listed


def test_the_runs_folder_is_never_frozen_even_when_git_tracks_it(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "proj", {"train.py": "", "runs/tracked.txt": "t", "out/runs2/x": "y"})
    snap = scan_project("train.py", str(repo), "runs")
    assert snap is not None and sorted(snap.entries) == ["out/runs2/x", "train.py"]
    stored = scan_project("train.py", str(repo), "out/runs2")  # a runs folder deeper in the project
    assert stored is not None and sorted(stored.entries) == ["runs/tracked.txt", "train.py"]
    store(stored)  # the store itself (<runs>/.code) lands inside the project...
    again = scan_project("train.py", str(repo), "out/runs2")
    assert again is not None and again.id == stored.id  # ...and is never part of the next snapshot


def test_in_git_tracked_files_of_any_kind_stay_and_untracked_ones_follow_the_code_rule(tmp_path: Path) -> None:
    big = b"[" + b"0," * 1_000_000 + b"0]"  # a 2 MB .json: data by the rule
    repo = git_repo(tmp_path / "proj", {
        "train.py": "", "weights.bin": b"\0\1", "big.json": big, "wandb/tracked.yaml": "a: 1\n",
        ".hidden/tracked.bin": b"\2", "lightning_logs/v0/kept.py": "", "README": "r",
    })
    write(repo, {"helper.py": "", "conf.yaml": "b: 2\n", "notes.md": "n", "extra.bin": b"\3", "big2.json": big,
                 "wandb/run-1/config.yaml": "c: 3\n", "lightning_logs/v1/hparams.py": "", ".hidden/new.py": "",
                 "checkpoints/last.ckpt": b"\4", "sub/outputs/x.json": "{}"})
    snap = scan_project("train.py", str(repo), "runs")
    assert snap is not None and snap.how == "git"
    assert sorted(snap.entries) == [".hidden/tracked.bin", "README", "big.json", "conf.yaml", "helper.py",
                                    "lightning_logs/v0/kept.py", "train.py", "wandb/tracked.yaml", "weights.bin"]
    assert snap.left_out == {
        LEFT_BIG_CONFIG: ("big2.json",),
        LEFT_NOT_CODE: ("extra.bin", "notes.md"),
        LEFT_OUTPUT: (".hidden/new.py", "checkpoints/last.ckpt", "lightning_logs/v1/hparams.py",
                      "sub/outputs/x.json", "wandb/run-1/config.yaml"),
    }


def test_in_git_an_untracked_run_folder_is_never_frozen(tmp_path: Path) -> None:
    """A run folder (record.json beside payload.json) of an earlier runs_dir, untracked and not
    ignored: "never frozen unless tracked", in git as outside it."""
    repo = git_repo(tmp_path / "proj", {"train.py": ""})
    write(repo, {"old_runs/r-1/record.json": "{}", "old_runs/r-1/payload.json": "{}",
                 "old_runs/r-1/config.yaml": "lr: 1\n", "old_runs/r-1/logs/rank-0.txt": "log"})
    snap = scan_project("train.py", str(repo), "runs")
    assert snap is not None
    assert sorted(snap.entries) == ["train.py"], snap.left_out


@pytest.mark.parametrize("pattern, left_out", [
    ("notes.md", ["notes.md", "docs/notes.md"]),                        # a name, at any depth
    ("*.bin", ["weights.bin", "data/raw/blob.bin"]),                    # a glob, at any depth
    ("data/", ["data/raw/blob.bin", "data/table.csv"]),                 # a folder, at any depth
    ("sub/x.py", ["sub/x.py"]),                                         # anchored: not deep/sub/x.py
    ("/notes.md", ["notes.md"]),                                        # anchored by a leading '/'
    ("# a comment\n\n   ", []),                                         # comments and blanks
])
def test_orchignore_patterns_leave_files_out(tmp_path: Path, pattern: str, left_out: list[str]) -> None:
    files = {"train.py": "", "notes.md": "n", "docs/notes.md": "n", "weights.bin": "w", "data/raw/blob.bin": "b",
             "data/table.csv": "c", "sub/x.py": "", "sub/y.py": "", "deep/sub/x.py": "", "mydata/keep.py": ""}
    repo = git_repo(tmp_path / "proj", files)
    write(repo, {".orchignore": pattern + "\n"})
    snap = scan_project("train.py", str(repo), "runs")
    assert snap is not None
    assert sorted(snap.entries) == sorted(set(files) - set(left_out))  # the untracked .orchignore is not code
    assert snap.left_out.get(LEFT_IGNORED, ()) == tuple(sorted(left_out))
    assert snap.left_out[LEFT_NOT_CODE] == (".orchignore",)


def test_an_anchored_glob_does_not_cross_folders(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "proj", {"train.py": "", "sub/t.py": "", "sub/a/b.py": ""})
    write(repo, {".orchignore": "sub/*.py\n"})
    snap = scan_project("train.py", str(repo), "runs")
    assert snap is not None and "sub/t.py" not in snap.entries
    assert "sub/a/b.py" in snap.entries  # as git reads the same line: 'sub/*.py' does not match it
    write(repo, {".gitignore": "sub/*.py\n"})
    assert _git(repo, "check-ignore", "--no-index", "sub/t.py").strip() == "sub/t.py"
    assert subprocess.run(["git", "-C", str(repo), "check-ignore", "--no-index", "sub/a/b.py"]).returncode == 1


@pytest.mark.parametrize("lines, kept, ignored", [
    ("*.yaml\n!keep.yaml", ["keep.yaml", "conf/keep.yaml"], ["a.yaml", "conf/b.yaml"]),   # taken back
    # never out of an ignored folder, as git (which never looks inside it) cannot take it back
    ("conf/\n!conf/b.yaml", ["a.yaml", "keep.yaml"], ["conf/b.yaml", "conf/keep.yaml"]),
    ("conf/*\n!conf/b.yaml", ["a.yaml", "keep.yaml", "conf/b.yaml"], ["conf/keep.yaml"]),  # its files only: it can
    ("!a.yaml\n*.yaml", [], ["a.yaml", "keep.yaml", "conf/b.yaml", "conf/keep.yaml"]),   # the last match wins
    ("*.yaml\n!*.yaml\n*.yaml\n!a.yaml", ["a.yaml"], ["keep.yaml", "conf/b.yaml", "conf/keep.yaml"]),
    ("!keep.yaml", ["a.yaml", "keep.yaml", "conf/b.yaml", "conf/keep.yaml"], []),        # nothing to take back
])
def test_orchignore_negation_takes_a_path_back_and_the_last_match_decides(tmp_path: Path, lines: str,
                                                                          kept: list[str], ignored: list[str]) -> None:
    files = {"train.py": "", "a.yaml": "a: 1\n", "keep.yaml": "k: 1\n", "conf/b.yaml": "b: 1\n",
             "conf/keep.yaml": "k: 2\n"}
    repo = git_repo(tmp_path / "proj", files)
    write(repo, {".orchignore": lines + "\n"})
    snap = scan_project("train.py", str(repo), "runs")
    assert snap is not None
    assert sorted(snap.entries) == sorted(["train.py", *kept])
    assert snap.left_out.get(LEFT_IGNORED, ()) == tuple(sorted(ignored))


def test_code_exclude_and_code_include_patterns(no_outer_git: Path) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"train.py": "", "notes.md": "n", "vocab/words.tsv": "w", "vocab/extra.tsv": "e", "assets/a.bin": "a",
                 "conf/base.yaml": "b: 1\n", "conf/secret.yaml": "s: 1\n", "scratch.py": ""})
    plain = scan_project("train.py", str(proj), "runs")
    assert plain is not None and sorted(plain.entries) == ["conf/base.yaml", "conf/secret.yaml", "scratch.py",
                                                           "train.py"]
    snap = scan_project("train.py", str(proj), "runs", include_patterns=["*.tsv", "!extra.tsv", "assets/", "*.yaml"],
                        exclude_patterns=["conf/secret.yaml", "scratch.py"])
    assert snap is not None
    # code.include freezes what the rule left out ('!' taking a path back there too); code.exclude
    # wins over it and over the rule; both are recorded for changes_since
    assert sorted(snap.entries) == ["assets/a.bin", "conf/base.yaml", "train.py", "vocab/words.tsv"]
    assert snap.left_out == {LEFT_IGNORED: ("conf/secret.yaml", "scratch.py"),
                             LEFT_NOT_CODE: ("notes.md", "vocab/extra.tsv")}
    summary = snap.summary()
    assert summary["include"] == ["*.tsv", "!extra.tsv", "assets/", "*.yaml"]
    assert summary["exclude_patterns"] == ["conf/secret.yaml", "scratch.py"]
    with pytest.raises(SnapshotError, match="not in the code snapshot"):  # the entrypoint excluded: refused
        scan_project("train.py", str(proj), "runs", exclude_patterns=["train.py"])


def test_code_include_in_git_takes_in_untracked_files_the_rule_leaves_out(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "proj", {"train.py": "", ".gitignore": "*.pt\n"})
    write(repo, {"tokenizer.model": "t", "other.model": "o", "weights.pt": "w"})
    snap = scan_project("train.py", str(repo), "runs", include_patterns=["tokenizer.model", "*.pt"])
    assert snap is not None  # what git ignores stays out: code.include only widens the code rule
    assert sorted(snap.entries) == [".gitignore", "tokenizer.model", "train.py"]
    assert snap.left_out == {LEFT_NOT_CODE: ("other.model",)}


def test_a_code_include_pattern_adds_only_the_files_it_matches(no_outer_git: Path) -> None:
    """Setting code.include must not freeze anything else: the hidden, output and run folders it
    does not name stay out."""
    proj = no_outer_git / "proj"
    write(proj, {"train.py": "", "model.bin": "m", "notes.md": "n", ".cache/c.py": "", "wandb/run/config.yaml": "",
                 "old/r-1/record.json": "{}", "old/r-1/payload.json": "{}", "old/r-1/config.yaml": "lr: 1\n"})
    without = scan_project("train.py", str(proj), "runs")
    with_include = scan_project("train.py", str(proj), "runs", include_patterns=["*.bin"])
    assert without is not None and with_include is not None
    assert sorted(without.entries) == ["train.py"]
    assert sorted(set(with_include.entries) - set(without.entries)) == ["model.bin"]


def test_a_git_snapshot_records_the_commit_and_the_uncommitted_diff(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "proj", {"train.py": "print('v1')\n"})
    head = _git(repo, "rev-parse", "HEAD").strip()
    clean = scan_project("train.py", str(repo), "runs")
    assert clean is not None and clean.commit == head and clean.diff == "" and clean.summary()["dirty"] is False
    (repo / "train.py").write_text("print('v2')\n")
    dirty = scan_project("train.py", str(repo), "runs")
    assert dirty is not None and dirty.commit == head
    assert "-print('v1')" in dirty.diff and "+print('v2')" in dirty.diff
    summary = dirty.summary()
    assert summary["dirty"] is True and summary["diff"] == hashlib.sha256(dirty.diff.encode()).hexdigest()
    assert dirty.id != clean.id
    store(dirty)  # the diff is kept in the store, by its hash
    assert (Path(dirty.store_dir) / "blobs" / summary["diff"][:2] / summary["diff"]).read_text() == dirty.diff


def test_plans_code_line_names_the_commit_once(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from orchestrator.front.display import code_line

    repo = git_repo(tmp_path / "proj", {"train.py": "print(1)\n"})
    (repo / "train.py").write_text("print(2)\n")
    snap = scan_project("train.py", str(repo), "runs")
    assert snap is not None and snap.commit is not None
    line = code_line(SimpleNamespace(code=snap.summary(), spec={}, executor="local"))  # type: ignore[arg-type]
    assert f"{snap.commit[:12]} + uncommitted changes)" in line
    assert "(git, git " not in line, line


def test_a_repo_with_no_commit_yet_has_no_commit_and_no_diff(tmp_path: Path) -> None:
    repo = tmp_path / "proj"
    repo.mkdir()
    _git(repo, "init", "-q")
    write(repo, {"train.py": ""})
    snap = scan_project("train.py", str(repo), "runs")
    assert snap is not None and (snap.commit, snap.diff, sorted(snap.entries)) == (None, "", ["train.py"])


def test_git_files_lists_tracked_and_untracked_never_the_runs_folder(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "proj", {"train.py": "x", ".gitignore": "*.log\n"})
    write(repo, {"runs/.code/trees/abc/train.py": "x", "runs/job-1/log.txt": "y", "new.py": "", "out.log": "l"})
    tracked, untracked = snapshot_files.git_files(str(repo.resolve()), ["runs"])
    assert tracked == [".gitignore", "train.py"]
    assert untracked == ["new.py"]


# ---- outside git: the code rule ------------------------------------------------------------------
def test_outside_git_only_code_is_frozen_and_the_rest_is_left_out_by_reason(no_outer_git: Path) -> None:
    proj = no_outer_git / "proj"
    write(proj, {
        "train.py": "", "big_source.py": b"#" * 3_000_000,                 # a source: code at any size
        "conf/model.yaml": "m: 1\n", "edge.json": b" " * CONFIG_MAX_BYTES,  # a config up to the limit: code
        "over.json": b" " * (CONFIG_MAX_BYTES + 1), "conf/huge.json": b"[" + b"0," * 1_000_000 + b"0]",  # data
        "notes.md": "n", "data/x.csv": "1,2\n", "model.ckpt": b"\0", ".hidden_file": "h", "Makefile": "all:\n",
        "lightning_logs/version_0/hparams.yaml": "a: 1\n", "wandb/run-1/config.yaml": "b: 1\n",
        "mlruns/0/meta.yaml": "c: 1\n", ".cache/y.py": "", "sub/tb_logs/t.py": "",
        "old/r1/record.json": "{}", "old/r1/payload.json": "{}", "old/r1/config.yaml": "lr: 1\n",
        "half_run/record.json": "{}",  # only one of the two: not a run folder, a config file
        "__pycache__/train.cpython-311.pyc": b"\0", "lib/o.pyo": b"\0", "myenv/pyvenv.cfg": "home = /usr",
        "myenv/lib/site.py": "",
    })
    snap = scan_project("train.py", str(proj), "runs")
    assert snap is not None and (snap.root, snap.how) == (os.path.realpath(proj), "folder")
    assert sorted(snap.entries) == ["big_source.py", "conf/model.yaml", "edge.json", "half_run/record.json",
                                    "train.py"]
    assert snap.left_out == {
        LEFT_BIG_CONFIG: ("conf/huge.json", "over.json"),
        LEFT_NOT_CODE: (".hidden_file", "Makefile", "data/x.csv", "model.ckpt", "notes.md"),
        LEFT_OUTPUT: (".cache/", "__pycache__/", "lightning_logs/", "mlruns/", "sub/tb_logs/", "wandb/"),
        LEFT_RUN: ("old/r1/",),
    }
    assert snap.warnings == []
    summary = snap.summary()["left_out"]
    assert summary[LEFT_NOT_CODE] == {"count": 5, "examples": [".hidden_file", "Makefile", "data/x.csv",
                                                               "model.ckpt", "notes.md"]}
    assert summary[LEFT_RUN] == {"count": 1, "examples": ["old/r1/"]}
    assert set(summary) == set(snap.left_out)
    write(proj, {f"more/n{i}.md": "" for i in range(4)})
    many = scan_project("train.py", str(proj), "runs")
    assert many is not None and many.summary()["left_out"][LEFT_NOT_CODE]["count"] == 9
    assert len(many.summary()["left_out"][LEFT_NOT_CODE]["examples"]) == 5  # a few examples, not the list
    assert (snap_mod.is_code("a.PY", 10**9), snap_mod.is_code("a.Yaml", CONFIG_MAX_BYTES)) == (None, None)
    assert snap_mod.is_code("a.yaml", CONFIG_MAX_BYTES + 1) == LEFT_BIG_CONFIG


def test_a_script_in_a_subfolder_outside_git_freezes_that_folder_only(no_outer_git: Path) -> None:
    write(no_outer_git / "proj", {"top.py": "", "scripts/train.py": "", "scripts/helper.py": ""})
    snap = scan_project("scripts/train.py", str(no_outer_git / "proj"), "runs")
    assert snap is not None and snap.root == os.path.realpath(no_outer_git / "proj" / "scripts")
    assert sorted(snap.entries) == ["helper.py", "train.py"]


def test_a_package_named_venv_is_kept_when_it_is_not_a_virtual_environment(no_outer_git: Path) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"train.py": "x", "env/__init__.py": "", "venv/real/pyvenv.cfg": "home = /usr", "other/z.py": ""})
    (proj / "venv" / "pyvenv.cfg").write_text("home = /usr\n")
    snap = scan_project("train.py", str(proj), "runs")
    assert snap is not None and sorted(snap.entries) == ["env/__init__.py", "other/z.py", "train.py"]


def test_an_environment_git_does_not_ignore_is_never_frozen(tmp_path: Path) -> None:
    """``python -m venv venv`` (or a conda env) in a git project with no .gitignore entry for it:
    its untracked packages are not the user's code (a venv with torch is ~385 MB of sources, over
    code.max_mb: the run was refused). Named once in left_out, not file by file."""
    repo = git_repo(tmp_path / "proj", {"train.py": "x", "venv/lib/keep.py": ""})  # tracked: kept
    write(repo, {"venv/pyvenv.cfg": "home = /usr\n", "venv/lib/python3.11/site-packages/pkg/a.py": "",
                 "venv/lib/python3.11/site-packages/pkg/b.py": "", "tools/env/conda-meta/history": "",
                 "tools/env/lib/c.py": "", "tools/own.py": "", "notenv/pyvenv.py": ""})
    snap = scan_project("train.py", str(repo), "runs")
    assert snap is not None and snap.how == "git"
    assert sorted(snap.entries) == ["notenv/pyvenv.py", "tools/own.py", "train.py", "venv/lib/keep.py"]
    assert snap.left_out[LEFT_OUTPUT] == ("tools/env/", "venv/")


def test_the_orchestrator_home_inside_the_project_is_never_frozen_nor_linked(no_outer_git: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"train.py": "", "orch_home/runs.json": "{}", "orch_home/x.py": ""})
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(proj / "orch_home"))
    snap = scan_project("train.py", str(proj), str(no_outer_git / "runs"), include_patterns=["*.json"])
    assert snap is not None and sorted(snap.entries) == ["train.py"]
    tree = Path(store(snap))
    assert not os.path.lexists(tree / "orch_home")


def test_outside_git_a_symlink_to_a_package_in_the_project_imports_the_frozen_code(no_outer_git: Path) -> None:
    """``lib -> realpkg``: ``import lib.m`` from the tree must find the frozen m.py, never the live
    one (kept as a link into the tree, or frozen through it; not a live link to the project)."""
    proj = no_outer_git / "proj"
    write(proj, {"train.py": "import lib.m\n", "realpkg/m.py": "X = 1\n"})
    os.symlink("realpkg", proj / "lib")
    snap = scan_project("train.py", str(proj), "runs")
    assert snap is not None
    tree = Path(store(snap))
    (proj / "realpkg" / "m.py").write_text("X = 2  # edited after the submit\n")
    assert (tree / "realpkg" / "m.py").read_text() == "X = 1\n"
    assert (tree / "lib" / "m.py").read_text() == "X = 1\n"


def test_a_file_name_that_is_not_utf8_is_frozen_or_refused_by_name(no_outer_git: Path) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"train.py": ""})
    with open(os.path.join(os.fsencode(proj), b"caf\xe9.txt"), "wb") as f:  # a Latin-1 name from an old archive
        f.write(b"data")
    try:
        snap = scan(str(proj), "folder", str(no_outer_git / "store"))
        tree = store(snap)
    except SnapshotError as exc:
        assert "caf" in str(exc)
        return
    with open(os.path.join(os.fsencode(tree), b"caf\xe9.txt"), "rb") as f:
        assert f.read() == b"data"


def test_a_project_folder_whose_name_is_not_utf8_is_stored(no_outer_git: Path) -> None:
    proj = Path(os.fsdecode(os.fsencode(no_outer_git) + b"/d\xff"))
    write(proj, {"train.py": "print(1)\n"})
    snap = scan_project("train.py", str(proj), "runs")
    assert snap is not None and sorted(snap.entries) == ["train.py"]
    tree = store(snap)
    assert (Path(tree) / "train.py").read_text() == "print(1)\n"


# ---- refusals ----------------------------------------------------------------------------------
def test_an_entrypoint_git_ignores_makes_its_own_folder_the_project(tmp_path: Path) -> None:
    """A script in an ignored scratch folder of a larger repository: its folder is the project."""
    repo = git_repo(tmp_path / "proj", {"keep.py": "", ".gitignore": "scratch/\n"})
    write(repo, {"scratch/train.py": "print(1)\n", "scratch/util.py": ""})
    snap = scan_project("scratch/train.py", str(repo), "runs")
    assert snap is not None and snap.how == "folder" and snap.root == str((repo / "scratch").resolve())
    assert sorted(snap.entries) == ["train.py", "util.py"]


def test_an_entrypoint_the_ignore_file_lists_is_refused_by_name(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "proj", {"keep.py": ""})
    write(repo, {".orchignore": "train.py\n", "train.py": "print(1)\n"})
    with pytest.raises(SnapshotError) as caught:
        scan_project("train.py", str(repo), "runs")
    message = str(caught.value)
    assert str(repo / "train.py") in message and "not in the code snapshot" in message
    assert "code.snapshot: false" in message


@pytest.mark.parametrize("in_git", [False, True])
def test_the_entrypoint_is_frozen_whatever_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    in_git: bool) -> None:
    """A script with no .py suffix (``train``, run through its shebang) is not code by the rule,
    but it is what the ranks run: frozen, never refused as if something listed it."""
    if in_git:
        proj = git_repo(tmp_path / "proj", {"keep.py": ""})
    else:
        monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
        proj = tmp_path / "proj"
    write(proj, {"train": "#!/usr/bin/env python\nprint(1)\n", "notes": "n"})
    snap = scan_project("train", str(proj), "runs")
    assert snap is not None and "train" in snap.entries and "notes" not in snap.entries


def test_a_project_over_max_mb_is_refused_naming_the_largest_files_and_the_fix(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "proj", {"train.py": "x" * 10, "weights.bin": b"\0" * 60_000,
                                        "data/big.npy": b"\1" * 40_000, "small.txt": "s"})  # tracked: frozen
    with pytest.raises(SnapshotError) as caught:
        scan_project("train.py", str(repo), "runs", max_mb=0.05)
    message = str(caught.value)
    assert "weights.bin (60.0 kB)" in message and "data/big.npy (40.0 kB)" in message
    assert message.index("weights.bin") < message.index("data/big.npy")  # largest first
    assert "code.max_mb=0.05" in message and str(repo / ".orchignore") in message
    assert "raise code.max_mb" in message and "code.snapshot: false" in message
    write(repo, {".orchignore": "*.bin\ndata/\n"})  # the fix it names works, on tracked files too
    snap = scan_project("train.py", str(repo), "runs", max_mb=0.05)
    assert snap is not None and sorted(snap.entries) == ["small.txt", "train.py"]
    assert snap.left_out[LEFT_IGNORED] == ("data/big.npy", "weights.bin")


def test_a_project_over_the_limit_is_refused_before_any_file_is_read(no_outer_git: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    proj = no_outer_git / "big"
    write(proj, {"train.py": "x", "weights.bin": b"\0" * 3_000_000})
    calls: list[str] = []
    monkeypatch.setattr(snapshot_scan, "_read_stable", lambda path, blobs: calls.append(path))
    with pytest.raises(SnapshotError, match="over code.max_mb=1"):
        scan_project("train.py", str(proj), "runs", max_mb=1, include_patterns=["*.bin"], stage=True)
    assert calls == []
    assert not (proj / "runs" / ".code" / "blobs").exists()  # nothing staged either


# ---- files that change while they are read -------------------------------------------------------
class Appender:
    """A thread appending a line to ``path`` every few ms (a log a job keeps writing); with
    ``slow_reads`` the scan's read of that file lasts until the thread has appended once more, so
    every read of it is torn (deterministic, whatever the machine's speed)."""

    def __init__(self, path: Path, monkeypatch: pytest.MonkeyPatch, slow_reads: bool = True) -> None:
        self.path, self.appended, self.stop = path, 0, threading.Event()
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, daemon=True)
        if slow_reads:
            real = snapshot_scan._copy_hashing

            def copy_hashing(f, blobs, path_read):  # noqa: ANN001, ANN202 - the wrapped function's
                with self.cond:
                    seen = self.appended
                out = real(f, blobs, path_read)
                if os.path.realpath(path_read) == os.path.realpath(self.path):
                    with self.cond:
                        assert self.cond.wait_for(lambda: self.appended > seen + 1, timeout=10)
                return out

            monkeypatch.setattr(snapshot_scan, "_copy_hashing", copy_hashing)

    def _run(self) -> None:
        while not self.stop.is_set():
            with open(self.path, "a") as f:
                f.write(f"# step {self.appended}\n")
            with self.cond:
                self.appended += 1
                self.cond.notify_all()
            self.stop.wait(0.002)

    def __enter__(self) -> Appender:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


@pytest.mark.parametrize("stage", [False, True])
def test_a_file_appended_to_during_the_scan_is_left_out_with_a_warning(no_outer_git: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        stage: bool) -> None:
    proj, store_dir = no_outer_git / "proj", no_outer_git / "store"
    write(proj, {"train.py": "print(1)\n", "metrics.txt": "# start\n", "helper.py": "H = 1\n"})
    with Appender(proj / "metrics.txt", monkeypatch) as appender:
        snap = scan(str(proj), "folder", str(store_dir), required=[str(proj / "train.py")], stage=stage)
    assert appender.appended >= 3  # it did write during the scan
    assert sorted(snap.entries) == ["helper.py", "train.py"]
    assert snap.left_out == {LEFT_CHANGING: ("metrics.txt",)}
    assert snap.warnings == ["metrics.txt changed while it was read and is not frozen: the ranks read it live"]
    if stage:  # no blob of a torn read, nothing half-written
        assert {b.name for b in blob_files(store_dir)} == {e.sha for e in snap.entries.values()}
    assert_store_sound(store_dir)
    tree = Path(store(snap))  # the ranks find the live file where it was
    assert (tree / "metrics.txt").is_symlink()
    assert (tree / "metrics.txt").read_text() == (proj / "metrics.txt").read_text()


def test_a_file_appended_to_by_a_thread_during_the_scan_never_raises(no_outer_git: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The same with no help to tear the reads: frozen as one consistent read, or left out."""
    proj, store_dir = no_outer_git / "proj", no_outer_git / "store"
    write(proj, {"train.py": "", "log.txt": "# start\n" * 50_000})
    monkeypatch.setattr(snapshot_scan, "CHUNK", 4096)
    with Appender(proj / "log.txt", monkeypatch, slow_reads=False):
        snaps = [scan(str(proj), "folder", str(store_dir), stage=True) for _ in range(3)]
    for snap in snaps:
        assert "train.py" in snap.entries
        if "log.txt" in snap.entries:
            entry = snap.entries["log.txt"]
            assert blob_of(snap, "log.txt").stat().st_size == entry.size
        else:
            assert snap.left_out[LEFT_CHANGING] == ("log.txt",) and len(snap.warnings) == 1
    assert_store_sound(store_dir)


def test_an_entrypoint_that_keeps_changing_is_refused(no_outer_git: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"train.py": "print(1)\n", "helper.py": ""})
    with Appender(proj / "train.py", monkeypatch):
        with pytest.raises(SnapshotError) as caught:
            scan_project("train.py", str(proj), "runs", stage=True)
    assert str(proj / "train.py") in str(caught.value) and "kept changing" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert_store_sound(proj / "runs" / ".code")


# ---- the store -----------------------------------------------------------------------------------
def test_blobs_are_written_once_and_shared_between_snapshots_each_tree_its_own_copies(no_outer_git: Path) -> None:
    proj, store_dir = no_outer_git / "proj", no_outer_git / "store"
    write(proj, {"a.py": "A\n", "b.py": "B\n", "c.py": "C\n", "copy_of_a.py": "A\n"})
    first = scan(str(proj), "folder", str(store_dir))
    assert len(first.missing) == 3 and first.summary()["new_files"] == 3 and first.new_bytes == 6
    store(first)
    assert len(blob_files(store_dir)) == 3  # same content, one blob
    (proj / "c.py").write_text("C2\n")
    second = scan(str(proj), "folder", str(store_dir))
    assert second.id != first.id and len(second.missing) == 1 and second.new_bytes == 3
    store(second)
    assert len(blob_files(store_dir)) == 4  # only the edited file's new content
    assert {p.name for p in (store_dir / "trees").iterdir()} == {Path(first.view).name, Path(second.view).name}
    assert Path(first.view).name.startswith(first.id + "-")
    a1 = os.stat(Path(first.tree) / "a.py")
    a2 = os.stat(Path(second.tree) / "a.py")
    assert a1.st_ino != a2.st_ino and a1.st_nlink == a2.st_nlink == 1  # copies, never links to the blob
    assert all(blob.stat().st_nlink == 1 for blob in blob_files(store_dir))
    third = scan(str(proj), "folder", str(store_dir))
    assert third.id == second.id and not third.missing and third.summary()["new_files"] == 0
    assert_store_sound(store_dir)


def test_the_tree_holds_read_only_copies_at_the_mirrored_path_symlinks_kept(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "group" / "proj", {"train.py": "print('t')\n", "pkg/__init__.py": "",
                                                  "pkg/data.bin": bytes(range(256)), "run.sh": "#!/bin/sh\necho hi\n"})
    os.chmod(repo / "run.sh", 0o755)
    os.symlink("pkg/data.bin", repo / "data_link")
    os.symlink("/nonexistent/target", repo / "dangling")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "links")
    store_dir = tmp_path / "store"
    snap = scan(str(repo), "git", str(store_dir))
    assert snap.entries["run.sh"].mode == 0o755 and snap.entries["train.py"].mode == 0o644
    tree = Path(store(snap))
    # <store>/trees/<id>-<root hash>/<grandparent>/<parent>/<project>
    assert tree == Path(snap.tree) == Path(snap.view) / tmp_path.name / "group" / "proj"
    assert Path(snap.view).parent == store_dir / "trees"
    assert snap.in_tree(str(repo.resolve() / "pkg")) == str(tree / "pkg")
    files = {rel: p for rel, p in tree_files(tree).items() if not rel.startswith(".git")}
    assert sorted(files) == ["dangling", "data_link", "pkg/__init__.py", "pkg/data.bin", "run.sh", "train.py"]
    for rel in ("train.py", "pkg/__init__.py", "pkg/data.bin"):
        st_ = os.lstat(files[rel])
        assert files[rel].read_bytes() == (repo / rel).read_bytes()
        assert stat.S_ISREG(st_.st_mode) and st_.st_nlink == 1, rel  # a copy of the blob
        assert stat.S_IMODE(st_.st_mode) == 0o444, rel
    exe = os.lstat(files["run.sh"])
    assert files["run.sh"].read_bytes() == (repo / "run.sh").read_bytes()
    assert stat.S_IMODE(exe.st_mode) == 0o555 and exe.st_nlink == 1
    assert os.readlink(files["data_link"]) == "pkg/data.bin" and os.readlink(files["dangling"]) == "/nonexistent/target"
    assert_store_sound(store_dir)
    manifest = snap_mod.load_manifest(snap.manifest_path)
    assert manifest == dict(snap.entries)


def test_writing_into_the_tree_never_reaches_a_blob(no_outer_git: Path) -> None:
    proj, store_dir = no_outer_git / "proj", no_outer_git / "store"
    write(proj, {"train.py": "print('t')\n", "pkg/m.py": "M = 1\n", "run.sh": "echo\n"})
    os.chmod(proj / "run.sh", 0o755)
    snap = scan(str(proj), "folder", str(store_dir))
    tree = Path(store(snap))
    for rel in snap.entries:  # a rank running as root: chmod, then write
        overwrite(tree / rel, b"garbage written by a rank\n")
        with open(tree / rel, "ab") as f:
            f.write(b"more")
    assert_store_sound(store_dir)
    assert {b.name for b in blob_files(store_dir)} == {e.sha for e in snap.entries.values()}


def test_storing_the_same_snapshot_twice_is_fine(no_outer_git: Path) -> None:
    proj, store_dir = no_outer_git / "proj", no_outer_git / "store"
    write(proj, {"train.py": "t", "a/b.py": "b"})
    snap = scan(str(proj), "folder", str(store_dir))
    tree = Path(snap.tree)
    assert store(snap) == str(tree)
    inode = os.stat(tree / "train.py").st_ino
    assert store(snap) == str(tree)
    assert os.stat(tree / "train.py").st_ino == inode  # a sound tree is used as it is
    assert len(blob_files(store_dir)) == 2
    assert_store_sound(store_dir)


def test_two_threads_storing_one_snapshot_at_once_both_succeed(no_outer_git: Path) -> None:
    proj, store_dir = no_outer_git / "proj", no_outer_git / "store"
    write(proj, {f"m{i:03d}/f{j}.py": f"# {i} {j}\n" * (i + 1) for i in range(40) for j in range(3)})
    snap = scan(str(proj), "folder", str(store_dir))
    barrier = threading.Barrier(2)
    results: list[str] = []
    errors: list[BaseException] = []

    def go() -> None:
        try:
            barrier.wait(timeout=10)
            results.append(store(snap))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=go) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert results == [snap.tree, snap.tree]
    files = tree_files(Path(snap.tree))
    assert len(files) == 120 and all(files[rel].read_bytes() == (proj / rel).read_bytes() for rel in files)
    assert_store_sound(store_dir)  # the loser's half-built tree and blobs are gone
    assert [p.name for p in (store_dir / "trees").iterdir()] == [Path(snap.view).name]


def test_a_start_never_replaces_a_sound_tree_another_start_built_meanwhile(no_outer_git: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Start B finds no tree and builds one; start A builds it first and its ranks start in it.
    B must not then swap A's sound tree away (for a moment there is no tree, and the ranks' working
    folder is deleted under them)."""
    proj, store_dir = no_outer_git / "proj", no_outer_git / "store"
    write(proj, {"train.py": "t\n", "a.py": "a\n"})
    snap = scan(str(proj), "folder", str(store_dir), stage=True)
    copying, release = threading.Event(), threading.Event()
    real = snapshot_store._copy_verified

    def copy_verified(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - the wrapped function's
        if threading.current_thread().name == "late-start":
            copying.set()
            release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(snapshot_store, "_copy_verified", copy_verified)
    errors: list[BaseException] = []

    def late() -> None:
        try:
            store(snap)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=late, name="late-start")
    thread.start()
    try:
        assert copying.wait(10)
        tree = Path(store(snap))  # start A, while B is still copying
        before = os.stat(tree).st_ino, os.stat(tree / "a.py").st_ino
    finally:
        release.set()
        thread.join(30)
    assert not errors, errors
    assert (os.stat(tree).st_ino, os.stat(tree / "a.py").st_ino) == before
    assert (tree / "a.py").read_text() == "a\n"
    assert_store_sound(store_dir)


def test_a_file_edited_between_scan_and_store_is_refused_and_never_stored_under_the_old_hash(
        no_outer_git: Path) -> None:
    proj, store_dir = no_outer_git / "proj", no_outer_git / "store"
    write(proj, {"a.py": "A = 1\n", "train.py": "import a\n"})
    snap = scan(str(proj), "folder", str(store_dir))  # not staged: store reads the live files
    (proj / "a.py").write_text("A = 2  # saved after the scan\n")
    with pytest.raises(SnapshotError, match=r"a\.py changed while it was being frozen"):
        store(snap)
    assert_store_sound(store_dir)  # whatever was stored is under its own content's hash
    assert snap.entries["a.py"].sha not in {b.name for b in blob_files(store_dir)}
    assert not Path(snap.view).exists() and not Path(snap.manifest_path).exists()
    again = scan(str(proj), "folder", str(store_dir))  # scanning again freezes the saved file
    tree = Path(store(again))
    assert (tree / "a.py").read_text() == "A = 2  # saved after the scan\n"


def test_a_staged_scan_never_needs_the_live_files_again(no_outer_git: Path) -> None:
    proj, store_dir = no_outer_git / "proj", no_outer_git / "store"
    write(proj, {"a.py": "A = 1\n", "train.py": "import a\n", "gone.py": "G = 1\n", "conf/c.yaml": "c: 1\n",
                 "same.py": "A = 1\n"})
    snap = scan(str(proj), "folder", str(store_dir), stage=True)
    assert not snap.missing
    for rel, entry in snap.entries.items():  # every entry's blob is there, and is what was hashed
        blob = blob_of(snap, rel)
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == entry.sha == blob.name
        assert blob.stat().st_size == entry.size and stat.S_IMODE(blob.stat().st_mode) == 0o444
    assert_store_sound(store_dir)
    (proj / "a.py").write_text("A = 2  # saved after the scan\n")
    (proj / "gone.py").unlink()
    tree = Path(store(snap))
    assert (tree / "a.py").read_text() == "A = 1\n" and (tree / "gone.py").read_text() == "G = 1\n"
    assert (tree / "conf" / "c.yaml").read_text() == "c: 1\n"
    assert_store_sound(store_dir)


def test_a_staged_scan_copies_only_what_the_store_lacks(no_outer_git: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proj, store_dir = no_outer_git / "proj", no_outer_git / "store"
    write(proj, {f"f{i}.py": f"x = {i}\n" for i in range(5)})
    store(scan(str(proj), "folder", str(store_dir), stage=True))
    reads: list[tuple[str, object]] = []
    real = snapshot_scan._read_stable
    monkeypatch.setattr(snapshot_scan, "_read_stable", lambda path, blobs: reads.append((path, blobs)) or real(path, blobs))
    (proj / "f1.py").write_text("x = 11\n")
    snap = scan(str(proj), "folder", str(store_dir), stage=True)
    assert reads == [(str(proj / "f1.py"), store_dir / "blobs")]
    assert blob_of(snap, "f1.py").read_text() == "x = 11\n"
    store(snap)
    blob_of(snap, "f2.py").unlink()  # in the index, but its blob is gone: read and staged again
    reads.clear()
    again = scan(str(proj), "folder", str(store_dir), stage=True)
    assert reads == [(str(proj / "f2.py"), store_dir / "blobs")] and not again.missing
    assert_store_sound(store_dir)


# ---- damaged blobs and trees ---------------------------------------------------------------------
@pytest.mark.parametrize("damage", [b"A = ", b"A = 9\n", b""], ids=["truncated", "garbled", "emptied"])
def test_a_damaged_blob_is_stored_again_from_the_project(no_outer_git: Path, damage: bytes) -> None:
    proj, store_dir = no_outer_git / "proj", no_outer_git / "store"
    write(proj, {"a.py": "A = 1\n", "train.py": "import a\n"})
    snap = scan(str(proj), "folder", str(store_dir), stage=True)
    overwrite(blob_of(snap, "a.py"), damage)
    tree = Path(store(snap))
    assert (tree / "a.py").read_text() == "A = 1\n"
    assert_store_sound(store_dir)
    assert blob_of(snap, "a.py").read_text() == "A = 1\n"


def test_a_damaged_blob_shared_with_an_older_tree_is_verified_when_a_new_tree_copies_it(no_outer_git: Path) -> None:
    proj, store_dir = no_outer_git / "proj", no_outer_git / "store"
    write(proj, {"a.py": "A = 1\n", "train.py": "v = 1\n"})
    first = scan(str(proj), "folder", str(store_dir))
    store(first)
    overwrite(blob_of(first, "a.py"), b"A = 666\n")
    (proj / "train.py").write_text("v = 2\n")
    second = scan(str(proj), "folder", str(store_dir))
    assert second.id != first.id and second.entries["a.py"] == first.entries["a.py"]
    tree = Path(store(second))
    assert (tree / "a.py").read_text() == "A = 1\n"
    assert_store_sound(store_dir)


def test_a_damaged_blob_whose_content_the_project_no_longer_holds_is_refused_naming_the_file(
        no_outer_git: Path) -> None:
    proj, store_dir = no_outer_git / "proj", no_outer_git / "store"
    write(proj, {"pkg/a.py": "A = 1\n", "train.py": "import pkg.a\n"})
    snap = scan(str(proj), "folder", str(store_dir), stage=True)
    overwrite(blob_of(snap, "pkg/a.py"), b"A = 1")  # truncated
    (proj / "pkg" / "a.py").write_text("A = 2\n")  # and the project moved on
    with pytest.raises(SnapshotError) as caught:
        store(snap)
    message = str(caught.value)
    assert "\n" not in message and "pkg/a.py" in message and "damaged" in message
    assert "run or submit again" in message
    assert not Path(snap.view).exists()  # no tree holding the damaged copy
    assert_store_sound(store_dir)  # the damaged blob is not kept under a name it does not hash to
    assert not list((store_dir / "trees").iterdir())
    tree = Path(store(scan(str(proj), "folder", str(store_dir), stage=True)))  # what the message says works
    assert (tree / "pkg" / "a.py").read_text() == "A = 2\n"


@pytest.mark.parametrize("how", ["overwritten", "removed", "replaced by a link"])
def test_a_damaged_tree_is_rebuilt_by_the_next_store(no_outer_git: Path, how: str) -> None:
    proj, store_dir = no_outer_git / "proj", no_outer_git / "store"
    write(proj, {"train.py": "print(1)\n", "pkg/m.py": "M = 1\n", "data/x.csv": "1,2\n"})
    snap = scan(str(proj), "folder", str(store_dir))
    tree = Path(store(snap))
    target = tree / "pkg" / "m.py"
    if how == "overwritten":
        overwrite(target, b"M = 2  # a rank wrote here\n")
    elif how == "removed":
        target.unlink()
    else:
        target.unlink()
        target.symlink_to(proj / "pkg" / "m.py")
    assert_store_sound(store_dir)  # the blobs never saw it
    assert store(snap) == str(tree)
    assert (tree / "pkg" / "m.py").read_text() == "M = 1\n" and not (tree / "pkg" / "m.py").is_symlink()
    assert stat.S_IMODE(os.lstat(tree / "pkg" / "m.py").st_mode) == 0o444
    assert (tree / "data" / "x.csv").read_text() == "1,2\n"  # the live link is back...
    assert (proj / "data" / "x.csv").read_text() == "1,2\n"  # ...and removing the old tree kept the live data
    assert_store_sound(store_dir)
    assert [p.name for p in (store_dir / "trees").iterdir()] == [Path(snap.view).name]


# ---- live links: what the tree lacks is found where it was ---------------------------------------
def test_a_left_out_data_folder_beside_the_script_is_reachable_from_the_tree(no_outer_git: Path) -> None:
    proj = no_outer_git / "ws" / "group" / "proj"
    write(proj, {"train.py": "", "data/train.csv": "1,2\n", "weights.bin": b"\0\1", "conf/c.yaml": "c: 1\n",
                 "conf/lookup.tsv": "k\tv\n"})
    snap = scan_project("train.py", str(proj), "runs")
    assert snap is not None and sorted(snap.entries) == ["conf/c.yaml", "train.py"]
    tree = Path(store(snap))
    assert (tree / "data").is_symlink() and (tree / "data" / "train.csv").read_text() == "1,2\n"
    assert (tree / "weights.bin").read_bytes() == b"\0\1"
    assert (tree / "conf" / "lookup.tsv").read_text() == "k\tv\n"  # in a frozen folder too
    assert not (tree / "train.py").is_symlink()  # what was frozen is the copy
    (proj / "data" / "more.csv").write_text("3\n")  # the live folder: what jobs write there later is seen
    assert (tree / "data" / "more.csv").read_text() == "3\n"
    write(proj, {"made_since/x.bin": b"x"})  # made after the store: linked at the next one
    assert store(snap) == str(tree) and (tree / "made_since" / "x.bin").read_bytes() == b"x"


def test_a_left_out_folder_beside_a_nested_package_is_reachable_from_the_tree(no_outer_git: Path) -> None:
    """Every folder of the tree links what it lacks, those holding only folders too: a module at
    src/pkg/model.py reading ``Path(__file__).parents[1] / "assets"``."""
    proj = no_outer_git / "proj"
    write(proj, {"train.py": "", "src/pkg/model.py": "", "src/assets/vocab.bin": b"v"})
    snap = scan_project("train.py", str(proj), "runs")
    assert snap is not None and "src/assets/vocab.bin" not in snap.entries
    tree = Path(store(snap))
    assert (tree / "src" / "assets" / "vocab.bin").read_bytes() == b"v"


def test_a_datasets_folder_two_levels_above_the_project_is_reachable_from_the_tree(no_outer_git: Path) -> None:
    ws = no_outer_git / "ws"
    proj = ws / "group" / "proj"
    write(proj, {"train.py": ""})
    write(ws, {"Datasets/mnist/train.csv": "0,1\n", "group/shared.yaml": "s: 1\n"})
    snap = scan_project("train.py", str(proj), str(no_outer_git / "runs"))
    assert snap is not None
    tree = Path(store(snap))
    assert tree.parts[-3:] == ("ws", "group", "proj")
    assert (tree / ".." / ".." / "Datasets" / "mnist" / "train.csv").read_text() == "0,1\n"
    assert (tree / ".." / "shared.yaml").read_text() == "s: 1\n"


def test_the_runs_folder_and_the_store_are_never_linked_into_the_tree(no_outer_git: Path) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"train.py": "", "data/x.csv": "x"})
    snap = scan_project("train.py", str(proj), "runs")  # the runs folder inside the project
    assert snap is not None
    tree = Path(store(snap))
    assert (tree / "data").is_symlink()
    assert not os.path.lexists(tree / "runs")
    assert not os.path.lexists(tree / ".code")


@pytest.mark.parametrize("runs_at", ["group/runs", "runs"], ids=["beside the project", "two levels up"])
def test_a_runs_folder_above_the_project_is_never_linked_into_the_mirror(no_outer_git: Path, runs_at: str) -> None:
    """The tree lives inside the runs folder: linking it would also make a loop."""
    ws = no_outer_git / "ws"
    proj = ws / "group" / "proj"
    write(proj, {"train.py": ""})
    write(ws, {"group/notes.txt": "n"})
    snap = scan_project("train.py", str(proj), str(ws / runs_at))
    assert snap is not None
    tree = Path(store(snap))
    assert (tree / ".." / "notes.txt").read_text() == "n"
    mirrored = tree.parent if runs_at == "group/runs" else tree.parent.parent
    assert not os.path.lexists(mirrored / "runs"), sorted(os.listdir(mirrored))


# ---- PYTHONPATH ----------------------------------------------------------------------------------
def test_pythonpath_puts_the_tree_before_each_entry_inside_the_project(no_outer_git: Path) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"train.py": "", "src/pkg/__init__.py": ""})
    (no_outer_git / "alias").symlink_to(proj)
    snap = scan_project("train.py", str(proj), "runs")
    assert snap is not None
    tree, root, sep = snap.tree, snap.root, os.pathsep
    value = sep.join([root, "/usr/lib/other", f"{root}/src", "relative/dir", "", str(no_outer_git / "alias/src")])
    assert snap.pythonpath(value).split(sep) == [
        tree, root, "/usr/lib/other", f"{tree}/src", f"{root}/src", "relative/dir", "",
        str(no_outer_git / "alias/src")]  # the tree's src once, before the first entry naming it
    assert snap.pythonpath("") == ""
    assert snap.pythonpath("/usr/lib") == "/usr/lib"
    assert snap.pythonpath(root) == sep.join([tree, root])


# ---- the index -----------------------------------------------------------------------------------
def test_an_unchanged_tree_is_not_read_again(no_outer_git: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proj, store_dir = no_outer_git / "proj", no_outer_git / "store"
    write(proj, {f"f{i}.py": f"x = {i}\n" for i in range(10)})
    calls: list[str] = []
    real = snapshot_scan._read_stable

    def counting(path: str, blobs: object) -> object:
        calls.append(path)
        return real(path, blobs)  # type: ignore[arg-type]

    monkeypatch.setattr(snapshot_scan, "_read_stable", counting)
    first = scan(str(proj), "folder", str(store_dir))
    assert len(calls) == 10
    second = scan(str(proj), "folder", str(store_dir))
    assert len(calls) == 20  # no index until a store
    assert second.id == first.id
    store(first)
    calls.clear()
    third = scan(str(proj), "folder", str(store_dir))
    assert calls == [] and third.id == first.id and not third.missing
    (proj / "f3.py").write_text("x = 33\n")  # a changed size and mtime: read again, alone
    fourth = scan(str(proj), "folder", str(store_dir))
    assert calls == [str(proj / "f3.py")] and fourth.id != first.id
    # same size, other mtime: read again too
    calls.clear()
    st_ = os.stat(proj / "f4.py")
    os.utime(proj / "f4.py", ns=(st_.st_atime_ns, st_.st_mtime_ns + 5_000_000_000))
    scan(str(proj), "folder", str(store_dir))
    assert str(proj / "f4.py") in calls


# ---- the round trip, generated -----------------------------------------------------------------
_part = st.text(alphabet="abcd0123_", min_size=1, max_size=6)
_paths = st.lists(_part, min_size=1, max_size=3).map(lambda parts: "/".join(parts[:-1] + [parts[-1] + ".py"]))
_trees = st.dictionaries(_paths, st.tuples(st.binary(max_size=300), st.booleans()), min_size=1, max_size=12)


def _no_file_is_a_folder(tree: dict) -> bool:
    names = set(tree)
    return not any(other.startswith(rel + "/") for rel in names for other in names)


@settings(max_examples=40, deadline=None)
@given(_trees.filter(_no_file_is_a_folder), st.booleans())
def test_random_trees_round_trip(tmp_path_factory: pytest.TempPathFactory, tree: dict[str, tuple[bytes, bool]],
                                 stage: bool) -> None:
    base = Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()))
    proj, store_dir = base / "ws" / "group" / "proj", base / "store"  # a small mirror: not the session's folder
    for rel, (data, executable) in tree.items():
        p = proj / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        os.chmod(p, 0o755 if executable else 0o644)
    first = scan(str(proj), "folder", str(store_dir), stage=stage)
    again = scan(str(proj), "folder", str(store_dir))
    assert first.id == again.id
    assert sorted(first.entries) == sorted(tree) and not first.left_out
    stored = Path(store(first))
    files = tree_files(stored)
    assert sorted(files) == sorted(tree)
    for rel, (data, executable) in tree.items():
        assert files[rel].read_bytes() == data and not files[rel].is_symlink()
        assert stat.S_IMODE(os.stat(files[rel]).st_mode) == (0o555 if executable else 0o444)
    assert scan(str(proj), "folder", str(store_dir)).id == first.id  # from the index now: the same id
    assert_store_sound(store_dir)


# ---- what changed since ------------------------------------------------------------------------
def test_changes_since_lists_added_deleted_and_modified_files_with_their_diffs(no_outer_git: Path) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"train.py": "lr = 0.1\nsteps = 10\n", "gone.py": "old = True\n", "same.py": "s\n",
                 "blob.bin": b"\0\1\2\xff", "runs/.keep": "", "notes.md": "n"})
    snap = scan_project("train.py", str(proj), "runs", include_patterns=["*.bin"])
    assert snap is not None and "blob.bin" in snap.entries
    store(snap)
    code = snap.summary()
    changed, live, frozen = changes_since(code)
    assert changed == []
    (proj / "train.py").write_text("lr = 0.2\nsteps = 10\n")
    (proj / "gone.py").unlink()
    (proj / "new.py").write_text("fresh = 1\n")
    (proj / "blob.bin").write_bytes(b"\0\1\3\xfe")  # frozen by code.include, which changes_since follows
    (proj / "notes.md").write_text("edited, but never frozen\n")
    (proj / "runs" / "some-run").mkdir()
    (proj / "runs" / "some-run" / "record.json").write_text("{}")  # a run's output: never a change
    changed, live, frozen = changes_since(code)
    assert changed == [("modified", "blob.bin"), ("deleted", "gone.py"), ("added", "new.py"),
                       ("modified", "train.py")]
    diff = unified_diff(snap.store_dir, snap.root, "modified", "train.py", frozen["train.py"])
    assert "--- snapshot/train.py" in diff and "+++ disk/train.py" in diff
    assert "-lr = 0.1\n" in diff and "+lr = 0.2\n" in diff and " steps = 10\n" in diff
    gone = unified_diff(snap.store_dir, snap.root, "deleted", "gone.py", frozen["gone.py"])
    assert "-old = True" in gone
    added = unified_diff(snap.store_dir, snap.root, "added", "new.py", None)
    assert "+fresh = 1" in added
    assert unified_diff(snap.store_dir, snap.root, "modified", "blob.bin", frozen["blob.bin"]) == \
        "Binary file blob.bin modified\n"


def test_changes_since_sees_a_mode_change(no_outer_git: Path) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"train.py": "", "tool.sh": "echo\n"})
    snap = scan_project("train.py", str(proj), "runs")
    assert snap is not None
    store(snap)
    os.chmod(proj / "tool.sh", 0o755)
    assert changes_since(snap.summary())[0] == [("modified", "tool.sh")]


def test_changes_since_a_git_snapshot_ignores_the_runs_folder_in_the_project(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "proj", {"train.py": "a = 1\n"})
    snap = scan_project("train.py", str(repo), "runs")
    assert snap is not None
    store(snap)  # <repo>/runs/.code now exists, untracked and not ignored
    write(repo, {"runs/r-1/logs/rank-0.log": "x", "runs/r-1/config.yaml": "a: 1\n"})
    assert changes_since(snap.summary())[0] == []
    (repo / "train.py").write_text("a = 2\n")
    assert changes_since(snap.summary())[0] == [("modified", "train.py")]


def test_changes_since_a_project_that_is_gone_says_where_the_snapshot_is(no_outer_git: Path) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"train.py": ""})
    snap = scan_project("train.py", str(proj), str(no_outer_git / "runs"))
    assert snap is not None
    store(snap)
    (proj / "train.py").unlink()
    proj.rmdir()
    with pytest.raises(SnapshotError, match="no longer there"):
        changes_since(snap.summary())


@pytest.mark.parametrize("damage", ["missing", "truncated", "garbled", "a folder"])
def test_unified_diff_of_a_missing_or_damaged_blob_is_one_line(no_outer_git: Path, damage: str) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"train.py": "lr = 0.1\nsteps = 10\n"})
    snap = scan_project("train.py", str(proj), "runs")
    assert snap is not None
    store(snap)
    blob = blob_of(snap, "train.py")
    if damage == "missing":
        blob.unlink()
    elif damage == "truncated":
        overwrite(blob, b"lr = 0.")
    elif damage == "garbled":
        overwrite(blob, b"lr = 0.9\nsteps = 10\n")
    else:
        blob.unlink()
        blob.mkdir()
    (proj / "train.py").write_text("lr = 0.2\nsteps = 10\n")
    changed, _, frozen = changes_since(snap.summary())
    assert changed == [("modified", "train.py")]
    for status in ("modified", "deleted"):
        text = unified_diff(snap.store_dir, snap.root, status, "train.py", frozen["train.py"])
        assert text.count("\n") == 1 and text.endswith("\n") and text.startswith("train.py: "), text
        assert status in text and ("damaged" in text or "cannot be read" in text)


@pytest.mark.parametrize("content", ["", "{", "null", "[]", '{"files": 3}', '{"files": {"a.py": 5}}',
                                     '{"files": {"a.py": []}}', '{"files": {"a.py": ["ab", "x", "0o644"]}}',
                                     '{"files": {"a.py": ["ab", 1, 420]}}', b"\xff\xfe"])
def test_a_damaged_manifest_is_one_snapshot_error(no_outer_git: Path, content: str | bytes) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"train.py": ""})
    snap = scan_project("train.py", str(proj), "runs")
    assert snap is not None
    store(snap)
    manifest = Path(snap.manifest_path)
    overwrite(manifest, content if isinstance(content, bytes) else content.encode())
    with pytest.raises(SnapshotError, match="cannot read the snapshot's manifest"):
        snap_mod.load_manifest(manifest)
    with pytest.raises(SnapshotError) as caught:
        changes_since(snap.summary())
    assert str(manifest) in str(caught.value)


@settings(max_examples=40, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=10))
def test_load_manifest_of_any_json_returns_entries_or_one_snapshot_error(tmp_path_factory: pytest.TempPathFactory,
                                                                          data: object) -> None:
    path = Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp())) / "m.json"
    for doc in (data, {"files": data}, {"files": {"a.py": data}}):
        path.write_text(json.dumps(doc))
        try:
            entries = snap_mod.load_manifest(path)
        except SnapshotError:
            continue
        assert all(isinstance(e, snap_mod.Entry) for e in entries.values())


@pytest.mark.parametrize("code", [{}, None, [], {"root": "/x"}, {"manifest": "/nonexistent/m.json", "root": "/"}])
def test_changes_since_of_a_damaged_code_json_is_one_snapshot_error(code: object) -> None:
    with pytest.raises(SnapshotError):
        changes_since(code)  # type: ignore[arg-type]


@pytest.mark.parametrize("content", ["", "{", "[]", "null", '{"id": "x", "root": "/p"}',
                                     '{"id": "x", "root": 5, "manifest": "/m.json"}', b"\xff"])
def test_read_code_record_of_a_damaged_code_json_is_one_line(tmp_path: Path, content: str | bytes) -> None:
    path = tmp_path / "code.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(SnapshotError) as caught:
        snap_mod.read_code_record(path)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)
    with pytest.raises(SnapshotError):
        snap_mod.read_code_record(tmp_path / "absent.json")


def test_read_code_record_reads_what_summary_wrote(no_outer_git: Path) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"train.py": ""})
    snap = scan_project("train.py", str(proj), "runs")
    assert snap is not None
    (no_outer_git / "code.json").write_text(json.dumps(snap.summary()))
    assert snap_mod.read_code_record(no_outer_git / "code.json") == snap.summary()


@pytest.mark.parametrize("field, value", [("exclude", None), ("include", 5), ("ignore_file", None),
                                          ("exclude_patterns", None)])
def test_changes_since_of_a_code_json_with_a_garbled_field_never_raises_a_traceback(no_outer_git: Path, field: str,
                                                                                    value: object) -> None:
    """Read as absent, or one SnapshotError: anything else is a traceback for ``orchestrator diff``
    (``read_code_record`` checks only id, root and manifest)."""
    proj = no_outer_git / "proj"
    write(proj, {"train.py": ""})
    snap = scan_project("train.py", str(proj), "runs")
    assert snap is not None
    store(snap)
    try:
        changes_since({**snap.summary(), field: value})
    except SnapshotError as exc:
        assert "\n" not in str(exc)


# ---- where the project is ----------------------------------------------------------------------
def test_project_root_of_a_script_in_git_is_the_toplevel(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "proj", {"scripts/train.py": "", "README": ""})
    assert project_root("scripts/train.py", str(repo)) == (os.path.realpath(repo), "git")
    assert project_root(str(repo / "scripts" / "train.py"), "/") == (os.path.realpath(repo), "git")


def test_project_root_of_a_script_outside_git_is_its_folder(no_outer_git: Path) -> None:
    write(no_outer_git / "proj", {"sub/train.py": ""})
    assert project_root("sub/train.py", str(no_outer_git / "proj")) == \
        (str(no_outer_git / "proj" / "sub"), "folder")


def test_project_root_of_a_module_under_the_cwd(no_outer_git: Path) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"snaptest_pkg_a/__init__.py": "", "snaptest_pkg_a/train.py": "def main(a): pass\n",
                 "snaptest_single.py": "def main(a): pass\n"})
    assert project_root("snaptest_pkg_a.train:main", str(proj)) == (str(proj), "folder")
    assert project_root("snaptest_single:main", str(proj)) == (str(proj), "folder")
    repo = git_repo(no_outer_git / "repo", {"snaptest_pkg_b/__init__.py": "", "snaptest_pkg_b/m.py": ""})
    assert project_root("snaptest_pkg_b.m:main", str(repo)) == (os.path.realpath(repo), "git")


def test_project_root_of_a_module_found_on_sys_path(no_outer_git: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"snaptest_pkg_c/__init__.py": "", "snaptest_pkg_c/train.py": ""})
    (no_outer_git / "elsewhere").mkdir()
    monkeypatch.syspath_prepend(str(proj))
    assert project_root("snaptest_pkg_c.train:main", str(no_outer_git / "elsewhere")) == (str(proj), "folder")


def test_a_package_linked_into_site_packages_from_the_project_is_the_projects(
        no_outer_git: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ln -s ~/proj/pkg .venv/lib/.../site-packages/pkg``: the real path decides, so the snapshot
    freezes the project (a queued job must not import the live files) and the run's identity names
    the same project (they once disagreed: the snapshot asked "installed?" of the link's path)."""
    from orchestrator.spec.identity import project_key

    proj = no_outer_git / "proj"
    write(proj, {"snaptest_pkg_linked/__init__.py": "", "snaptest_pkg_linked/train.py": ""})
    site = no_outer_git / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (site / "snaptest_pkg_linked").symlink_to(proj / "snaptest_pkg_linked")
    (no_outer_git / "elsewhere").mkdir()
    monkeypatch.syspath_prepend(str(site))
    cwd = str(no_outer_git / "elsewhere")
    assert project_root("snaptest_pkg_linked.train:main", cwd) == (os.path.realpath(proj), "folder")
    assert project_key("snaptest_pkg_linked.train:main", cwd) == os.path.realpath(proj)
    snap = scan_project("snaptest_pkg_linked.train:main", cwd, "runs")
    assert snap is not None and snap.root == os.path.realpath(proj) and "snaptest_pkg_linked/train.py" in snap.entries


@pytest.mark.parametrize("entrypoint", ["json:dumps", "email.message:Message", "hypothesis:given", "pytest:main"])
def test_project_root_of_a_stdlib_or_installed_module_is_none(tmp_path: Path, entrypoint: str) -> None:
    root, why = project_root(entrypoint, str(tmp_path))
    assert root is None and "installed package" in why
    assert scan_project(entrypoint, str(tmp_path), "runs") is None


def test_project_root_of_jobs_in_this_checkout_is_the_checkout() -> None:
    checkout = Path(__file__).resolve().parents[2]
    assert project_root("jobs.train:main", str(checkout)) == (os.path.realpath(checkout), "git")


def test_a_relative_link_leading_out_of_the_project_is_kept_absolute(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "proj", {"train.py": "x"})
    (tmp_path / "datasets").mkdir()
    (repo / "data").symlink_to("../datasets")
    (repo / "inside").symlink_to("train.py")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "links")  # tracked links: frozen as links
    snap = scan_project("train.py", str(repo), "runs")
    assert snap is not None
    assert snap.entries["data"].link == str((tmp_path / "datasets").resolve())
    assert snap.entries["inside"].link == "train.py"
    tree = Path(store(snap))
    assert (tree / "data").resolve() == (tmp_path / "datasets").resolve()
    assert (tree / "inside").resolve() == (tree / "train.py").resolve()
