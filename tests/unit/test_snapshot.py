"""orchestrator.snapshot: what a run freezes (git's view of the project, or the entrypoint's folder
outside git, less the ignore file and the runs folder), how the store keeps it (content-addressed
read-only blobs, a tree of hard links per snapshot, an index that spares re-reading an unchanged
tree), what changed on disk since, and where the project is for a script or a module entrypoint.

The tests' tmp_path lies inside the checkout's git-ignored .pytest-tmp/, so a folder there is
"outside git" only with GIT_CEILING_DIRECTORIES set (the ``no_outer_git`` fixture); a project of its
own is made with ``git init``."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import snapshot as snap_mod
from orchestrator.snapshot import (SnapshotError, changes_since, project_root, scan, scan_project, store,
                                   unified_diff)


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


def tree_files(tree: Path) -> dict[str, Path]:
    return {p.relative_to(tree).as_posix(): p for p in tree.rglob("*") if p.is_file() or p.is_symlink()}


@pytest.fixture
def no_outer_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path is not inside any git work tree (the checkout's included), as a folder elsewhere."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    return tmp_path


# ---- what a git project freezes ----------------------------------------------------------------
def test_git_project_holds_tracked_and_untracked_files_less_the_ignored_ones(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "proj", {
        "train.py": "import helper\n", "helper.py": "X = 1\n", ".gitignore": "secret.txt\n*.log\n",
        "pkg/__init__.py": "", "pkg/mod.py": "Y = 2\n",
    })
    write(repo, {"untracked.py": "Z = 3\n", "secret.txt": "s", "out.log": "l", "pkg/extra.py": "W = 4\n",
                 "runs/old/record.json": "{}"})
    snap = scan_project("train.py", str(repo), "runs")
    assert snap is not None and snap.how == "git" and snap.root == os.path.realpath(repo)
    assert sorted(snap.entries) == [".gitignore", "helper.py", "pkg/__init__.py", "pkg/extra.py", "pkg/mod.py",
                                    "train.py", "untracked.py"]
    assert not any(rel.startswith("runs/") for rel in snap.entries)  # the runs folder, though git sees it


def test_the_runs_folder_is_never_frozen_even_when_git_tracks_it(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "proj", {"train.py": "", "runs/tracked.txt": "t", "out/runs2/x": "y"})
    snap = scan_project("train.py", str(repo), "runs")
    assert snap is not None and sorted(snap.entries) == ["out/runs2/x", "train.py"]
    stored = scan_project("train.py", str(repo), "out/runs2")  # a runs folder deeper in the project
    assert stored is not None and sorted(stored.entries) == ["runs/tracked.txt", "train.py"]
    store(stored)  # the store itself (<runs>/.code) lands inside the project...
    again = scan_project("train.py", str(repo), "out/runs2")
    assert again is not None and again.id == stored.id  # ...and is never part of the next snapshot


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
    expected = sorted(set(files) - set(left_out) | {".orchignore"})
    assert sorted(snap.entries) == expected


def test_an_anchored_glob_does_not_cross_folders(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "proj", {"train.py": "", "sub/t.py": "", "sub/a/b.py": ""})
    write(repo, {".orchignore": "sub/*.py\n"})
    snap = scan_project("train.py", str(repo), "runs")
    assert snap is not None and "sub/t.py" not in snap.entries
    assert "sub/a/b.py" in snap.entries  # as git reads the same line: 'sub/*.py' does not match it
    write(repo, {".gitignore": "sub/*.py\n"})
    assert _git(repo, "check-ignore", "--no-index", "sub/t.py").strip() == "sub/t.py"
    assert subprocess.run(["git", "-C", str(repo), "check-ignore", "--no-index", "sub/a/b.py"]).returncode == 1


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

    from orchestrator.display import code_line

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


# ---- outside git -------------------------------------------------------------------------------
def test_outside_git_the_entrypoints_folder_less_hidden_folders_caches_and_venvs(no_outer_git: Path) -> None:
    proj = no_outer_git / "proj"
    write(proj, {
        "train.py": "", "lib/util.py": "", ".hidden_file": "kept", ".git_like/x.py": "", ".cache/y.py": "",
        "__pycache__/train.cpython-311.pyc": b"\0", "lib/__pycache__/util.cpython-311.pyc": b"\0",
        "old.pyc": b"\0", "lib/o.pyo": b"\0", "myenv/pyvenv.cfg": "home = /usr", "myenv/lib/site.py": "",
        "venv/z.py": "", "node_modules/m.js": "", "runs/r/record.json": "{}",
    })
    snap = scan_project("train.py", str(proj), "runs")
    assert snap is not None and (snap.root, snap.how) == (os.path.realpath(proj), "folder")
    # a folder named venv/ without pyvenv.cfg is code, not a virtual environment
    assert sorted(snap.entries) == [".hidden_file", "lib/util.py", "train.py", "venv/z.py"]
    assert (snap.commit, snap.diff) == (None, "")


def test_a_script_in_a_subfolder_outside_git_freezes_that_folder_only(no_outer_git: Path) -> None:
    write(no_outer_git / "proj", {"top.py": "", "scripts/train.py": "", "scripts/helper.py": ""})
    snap = scan_project("scripts/train.py", str(no_outer_git / "proj"), "runs")
    assert snap is not None and snap.root == os.path.realpath(no_outer_git / "proj" / "scripts")
    assert sorted(snap.entries) == ["helper.py", "train.py"]


def test_outside_git_a_symlink_to_a_folder_is_kept_as_a_symlink(no_outer_git: Path) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"train.py": "import lib.m\n", "realpkg/m.py": "X = 1\n"})
    os.symlink("realpkg", proj / "lib")
    snap = scan_project("train.py", str(proj), "runs")
    assert snap is not None
    assert "lib" in snap.entries and snap.entries["lib"].link == "realpkg"


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


def test_a_project_over_max_mb_is_refused_naming_the_largest_files_and_the_fix(no_outer_git: Path) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"train.py": "x" * 10, "weights.bin": b"\0" * 60_000, "data/big.npy": b"\1" * 40_000,
                 "small.txt": "s"})
    with pytest.raises(SnapshotError) as caught:
        scan_project("train.py", str(proj), "runs", max_mb=0.05)
    message = str(caught.value)
    assert "weights.bin (60.0 kB)" in message and "data/big.npy (40.0 kB)" in message
    assert message.index("weights.bin") < message.index("data/big.npy")  # largest first
    assert "code.max_mb=0.05" in message and str(proj / ".orchignore") in message
    assert "raise code.max_mb" in message and "code.snapshot: false" in message
    write(proj, {".orchignore": "*.bin\ndata/\n"})  # the fix it names works
    assert scan_project("train.py", str(proj), "runs", max_mb=0.05) is not None


# ---- the store -----------------------------------------------------------------------------------
def test_blobs_are_written_once_and_shared_between_snapshots(no_outer_git: Path) -> None:
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
    assert {p.name for p in (store_dir / "trees").iterdir()} == {first.id, second.id}
    a1 = os.stat(Path(first.tree) / "a.py")
    a2 = os.stat(Path(second.tree) / "a.py")
    assert a1.st_ino == a2.st_ino  # both trees link the one blob
    third = scan(str(proj), "folder", str(store_dir))
    assert third.id == second.id and not third.missing and third.summary()["new_files"] == 0


def test_the_tree_holds_the_sources_bytes_as_read_only_links_executables_copied_symlinks_kept(
        no_outer_git: Path) -> None:
    proj, store_dir = no_outer_git / "proj", no_outer_git / "store"
    write(proj, {"train.py": "print('t')\n", "pkg/__init__.py": "", "pkg/data.bin": bytes(range(256)),
                 "run.sh": "#!/bin/sh\necho hi\n"})
    os.chmod(proj / "run.sh", 0o755)
    os.symlink("pkg/data.bin", proj / "data_link")
    os.symlink("/nonexistent/target", proj / "dangling")
    snap = scan(str(proj), "folder", str(store_dir))
    assert snap.entries["run.sh"].mode == 0o755 and snap.entries["train.py"].mode == 0o644
    tree = Path(store(snap))
    assert tree == Path(snap.tree) and tree.parent == store_dir / "trees"
    files = tree_files(tree)
    assert sorted(files) == ["dangling", "data_link", "pkg/__init__.py", "pkg/data.bin", "run.sh", "train.py"]
    for rel in ("train.py", "pkg/__init__.py", "pkg/data.bin"):
        st_ = os.lstat(files[rel])
        assert files[rel].read_bytes() == (proj / rel).read_bytes()
        assert st_.st_nlink > 1, rel  # a hard link to the blob
        assert stat.S_IMODE(st_.st_mode) == 0o444, rel
    exe = os.lstat(files["run.sh"])
    assert files["run.sh"].read_bytes() == (proj / "run.sh").read_bytes()
    assert stat.S_IMODE(exe.st_mode) == 0o555 and exe.st_nlink == 1  # copied: the blob stays 0o444
    assert os.readlink(files["data_link"]) == "pkg/data.bin" and os.readlink(files["dangling"]) == "/nonexistent/target"
    for blob in blob_files(store_dir):
        assert stat.S_IMODE(blob.stat().st_mode) == 0o444
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name
    manifest = snap_mod.load_manifest(snap.manifest_path)
    assert manifest == dict(snap.entries)


def test_storing_the_same_snapshot_twice_is_fine(no_outer_git: Path) -> None:
    proj, store_dir = no_outer_git / "proj", no_outer_git / "store"
    write(proj, {"train.py": "t", "a/b.py": "b"})
    snap = scan(str(proj), "folder", str(store_dir))
    assert store(snap) == store(snap) == snap.tree
    assert len(blob_files(store_dir)) == 2
    assert not list(store_dir.rglob(".tmp-*"))


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
    assert not list(store_dir.rglob(".tmp-*"))  # the loser's half-built tree and blobs are gone
    assert [p.name for p in (store_dir / "trees").iterdir()] == [snap.id]


def test_a_file_edited_between_scan_and_store_is_refused_and_never_stored_under_the_old_hash(
        no_outer_git: Path) -> None:
    proj, store_dir = no_outer_git / "proj", no_outer_git / "store"
    write(proj, {"a.py": "A = 1\n", "train.py": "import a\n"})
    snap = scan(str(proj), "folder", str(store_dir))
    (proj / "a.py").write_text("A = 2  # saved after the scan\n")
    with pytest.raises(SnapshotError, match=r"a\.py changed while it was being frozen"):
        store(snap)
    for blob in blob_files(store_dir):  # whatever was stored is under its own content's hash
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name
    assert snap.entries["a.py"].sha not in {b.name for b in blob_files(store_dir)}
    assert not Path(snap.tree).exists() and not Path(snap.manifest_path).exists()
    assert not list(store_dir.rglob(".tmp-*"))
    again = scan(str(proj), "folder", str(store_dir))  # scanning again freezes the saved file
    tree = Path(store(again))
    assert (tree / "a.py").read_text() == "A = 2  # saved after the scan\n"


# ---- the index -----------------------------------------------------------------------------------
def test_an_unchanged_tree_is_not_read_again(no_outer_git: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proj, store_dir = no_outer_git / "proj", no_outer_git / "store"
    write(proj, {f"f{i}.py": f"x = {i}\n" for i in range(10)})
    calls: list[str] = []
    real = snap_mod._hash_file

    def counting(path: str) -> str:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(snap_mod, "_hash_file", counting)
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
_paths = st.lists(_part, min_size=1, max_size=3).map(lambda parts: "/".join(parts[:-1] + [parts[-1] + ".f"]))
_trees = st.dictionaries(_paths, st.tuples(st.binary(max_size=300), st.booleans()), min_size=1, max_size=12)


def _no_file_is_a_folder(tree: dict) -> bool:
    names = set(tree)
    return not any(other.startswith(rel + "/") for rel in names for other in names)


@settings(max_examples=60, deadline=None)
@given(_trees.filter(_no_file_is_a_folder))
def test_random_trees_round_trip(tmp_path_factory: pytest.TempPathFactory, tree: dict[str, tuple[bytes, bool]]) -> None:
    base = Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()))
    proj, store_dir = base / "proj", base / "store"
    for rel, (data, executable) in tree.items():
        p = proj / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        os.chmod(p, 0o755 if executable else 0o644)
    first = scan(str(proj), "folder", str(store_dir))
    again = scan(str(proj), "folder", str(store_dir))
    assert first.id == again.id
    assert sorted(first.entries) == sorted(tree)
    stored = Path(store(first))
    files = tree_files(stored)
    assert sorted(files) == sorted(tree)
    for rel, (data, executable) in tree.items():
        assert files[rel].read_bytes() == data
        assert stat.S_IMODE(os.stat(files[rel]).st_mode) == (0o555 if executable else 0o444)
    assert scan(str(proj), "folder", str(store_dir)).id == first.id  # from the index now: the same id


# ---- what changed since ------------------------------------------------------------------------
def test_changes_since_lists_added_deleted_and_modified_files_with_their_diffs(no_outer_git: Path) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"train.py": "lr = 0.1\nsteps = 10\n", "gone.py": "old = True\n", "same.py": "s\n",
                 "blob.bin": b"\0\1\2\xff", "runs/.keep": ""})
    snap = scan_project("train.py", str(proj), "runs")
    assert snap is not None
    store(snap)
    code = snap.summary()
    changed, live, frozen = changes_since(code)
    assert changed == []
    (proj / "train.py").write_text("lr = 0.2\nsteps = 10\n")
    (proj / "gone.py").unlink()
    (proj / "new.py").write_text("fresh = 1\n")
    (proj / "blob.bin").write_bytes(b"\0\1\3\xfe")
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
    write(repo, {"runs/r-1/logs/rank-0.log": "x"})
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


@pytest.mark.parametrize("entrypoint", ["json:dumps", "email.message:Message", "hypothesis:given", "pytest:main"])
def test_project_root_of_a_stdlib_or_installed_module_is_none(tmp_path: Path, entrypoint: str) -> None:
    root, why = project_root(entrypoint, str(tmp_path))
    assert root is None and "installed package" in why
    assert scan_project(entrypoint, str(tmp_path), "runs") is None


def test_project_root_of_jobs_in_this_checkout_is_the_checkout() -> None:
    checkout = Path(__file__).resolve().parents[2]
    assert project_root("jobs.train:main", str(checkout)) == (os.path.realpath(checkout), "git")


def test_a_project_over_the_limit_is_refused_before_any_file_is_read(no_outer_git: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    proj = no_outer_git / "big"
    write(proj, {"train.py": "x", "weights.bin": b"\0" * 3_000_000})
    calls: list[str] = []
    monkeypatch.setattr(snap_mod, "_hash_file", lambda path: calls.append(path) or "0" * 64)
    with pytest.raises(SnapshotError, match="over code.max_mb=1"):
        scan_project("train.py", str(proj), "runs", max_mb=1)
    assert calls == []


def test_a_relative_link_leading_out_of_the_project_is_kept_absolute(no_outer_git: Path) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"train.py": "x"})
    (no_outer_git / "datasets").mkdir()
    (proj / "data").symlink_to("../datasets")
    (proj / "inside").symlink_to("train.py")
    snap = scan_project("train.py", str(proj), "runs")
    assert snap is not None
    assert snap.entries["data"].link == str((no_outer_git / "datasets").resolve())
    assert snap.entries["inside"].link == "train.py"
    tree = Path(store(snap))
    assert (tree / "data").resolve() == (no_outer_git / "datasets").resolve()


def test_a_package_named_venv_is_kept_when_it_is_not_a_virtual_environment(no_outer_git: Path) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"train.py": "x", "env/__init__.py": "", "venv/real/pyvenv.cfg": "home = /usr"})
    (proj / "venv" / "pyvenv.cfg").write_text("home = /usr\n")
    snap = scan_project("train.py", str(proj), "runs")
    assert snap is not None and "env/__init__.py" in snap.entries
    assert not any(rel.startswith("venv/") for rel in snap.entries)


def test_git_never_lists_the_runs_folder_when_it_is_not_ignored(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "proj", {"train.py": "x"})
    write(repo, {"runs/.code/trees/abc/train.py": "x", "runs/job-1/log.txt": "y"})
    names = snap_mod._git_files(str(repo.resolve()), ["runs"])
    assert names == ["train.py"]
