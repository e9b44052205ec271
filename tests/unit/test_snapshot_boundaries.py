"""Where a code snapshot's project begins and ends, against what a user or a stray file puts there:
a ``runs_dir`` that is (or holds) the project is refused naming ``runs_dir`` and the fix, not the
entrypoint "ignored by git"; and a ``.orchestrator-shipped.json`` counts only at the root of a
checkout ``--remote submit`` made (``$ORCHESTRATOR_HOME/remote/projects/<project>/``, a plain file
of this user's): one in some parent folder is named in a warning and changes nothing."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from orchestrator.code.snapshot import SHIPPED_NAME, SnapshotError, project_root, scan_project
from orchestrator.core.records import home
from orchestrator.remote.remote_checkout import update_checkout


@pytest.fixture
def no_outer_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path is not inside any git work tree (the checkout's included), as a folder elsewhere."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    return tmp_path


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


# ---- runs_dir inside the project ---------------------------------------------------------------
@pytest.mark.parametrize("runs_dir", [".", "./", "{proj}", "sub/.."])
def test_a_runs_dir_that_is_the_project_is_refused_naming_runs_dir(no_outer_git: Path, runs_dir: str) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"train.py": "print(1)\n", "helper.py": ""})
    with pytest.raises(SnapshotError) as err:
        scan_project("train.py", str(proj), runs_dir.format(proj=proj))
    text = str(err.value)
    assert text.startswith("runs_dir: ") and "never frozen" in text, text
    assert "give runs_dir a folder the code is not in" in text and "code.snapshot: false" in text, text
    assert "git ignores it" not in text  # the old, wrong reason


def test_a_runs_dir_holding_the_entrypoint_is_refused_naming_runs_dir(tmp_path: Path) -> None:
    """In a git project, runs_dir: src with the script in src/: the script itself is in the runs folder."""
    proj = tmp_path / "proj"
    write(proj, {"src/train.py": "", "README.md": ""})
    subprocess.run(["git", "-C", str(proj), "init", "-q"], check=True, timeout=30)
    subprocess.run(["git", "-C", str(proj), "add", "-A"], check=True, timeout=30)
    with pytest.raises(SnapshotError, match=r"^runs_dir: 'src' .* holds the entrypoint .*src/train\.py.*"
                                            r"runs_dir: 'src/runs'"):
        scan_project("src/train.py", str(proj), "src")


@pytest.mark.parametrize("runs_dir", ["runs", ".."])
def test_a_runs_folder_beside_the_code_or_above_the_project_is_fine(no_outer_git: Path, runs_dir: str) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"train.py": "", "runs/old/x.py": ""})
    snap = scan_project("train.py", str(proj), runs_dir)
    assert snap is not None and "train.py" in snap.entries


# ---- a stray record of a shipment --------------------------------------------------------------
@pytest.mark.parametrize("content", ['{"files": {"other.py": ["' + "0" * 64 + '", 1, "0o644"]}}', "not json"])
def test_a_stray_shipped_record_in_a_parent_folder_refuses_nothing(no_outer_git: Path, content: str) -> None:
    (no_outer_git / SHIPPED_NAME).write_text(content)
    proj = no_outer_git / "work" / "proj"
    write(proj, {"train.py": "", "helper.py": ""})
    assert project_root("train.py", str(proj)) == (str(proj), "folder")
    snap = scan_project("train.py", str(proj), "runs")
    assert snap is not None and snap.how == "folder" and sorted(snap.entries) == ["helper.py", "train.py"]
    assert len(snap.warnings) == 1 and str(no_outer_git / SHIPPED_NAME) in snap.warnings[0], snap.warnings
    assert "is ignored" in snap.warnings[0]


def test_a_record_at_the_root_of_a_folder_not_made_by_remote_submit_does_not_count(no_outer_git: Path) -> None:
    proj = no_outer_git / "proj"
    write(proj, {"train.py": "", SHIPPED_NAME: json.dumps({"files": {}})})
    assert project_root("train.py", str(proj)) == (str(proj), "folder")


def _blob(blobs: Path, data: bytes) -> list:
    sha = hashlib.sha256(data).hexdigest()
    (blobs / sha[:2]).mkdir(parents=True, exist_ok=True)
    (blobs / sha[:2] / sha).write_bytes(data)
    return [sha, len(data), "0o644"]


def test_a_checkout_remote_submit_made_is_still_exactly_the_shipped_files(tmp_path: Path) -> None:
    """The record the tool wrote at a checkout's root counts, even with a stray one above it."""
    checkout = home() / "remote" / "projects" / "proj-0123abcd"
    checkout.mkdir(parents=True)
    blobs = tmp_path / "blobs"
    update_checkout(checkout, {"train.py": _blob(blobs, b"print(1)\n"), "pkg/mod.py": _blob(blobs, b"X = 1\n")},
                    blobs, None, "")
    write(checkout, {"pkg/job_output.py": "written by a job, not shipped"})
    (home() / SHIPPED_NAME).write_text("{}")  # stray, above the checkout: never reached
    (checkout / "pkg" / SHIPPED_NAME).write_text("{}")  # stray, below the checkout's root
    assert project_root("pkg/mod.py", str(checkout)) == (str(checkout.resolve()), "shipped")
    snap = scan_project("train.py", str(checkout), str(tmp_path / "runs"))
    assert snap is not None and snap.how == "shipped" and sorted(snap.entries) == ["pkg/mod.py", "train.py"]
    assert snap.warnings == []  # the walk from train.py stops at the checkout's root
    snap = scan_project("pkg/mod.py", str(checkout), str(tmp_path / "runs"))
    assert snap is not None and snap.how == "shipped"
    assert [str(checkout.resolve() / "pkg" / SHIPPED_NAME) in w for w in snap.warnings] == [True]


def test_a_linked_record_in_a_checkout_does_not_count(tmp_path: Path) -> None:
    """The tool writes its record as a plain file; a link there was put by someone else."""
    checkout = home() / "remote" / "projects" / "proj-0123abcd"
    write(checkout, {"train.py": ""})
    (tmp_path / "elsewhere.json").write_text(json.dumps({"files": {}}))
    (checkout / SHIPPED_NAME).symlink_to(tmp_path / "elsewhere.json")
    assert project_root("train.py", str(checkout))[1] != "shipped"


def test_remote_submit_ships_a_project_below_a_stray_record_and_names_it(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """On the laptop too: a stray record above the project neither replaces the project's files
    with the ones it lists nor refuses the shipment; it is named on stderr."""
    from orchestrator.remote import RemoteSettings, shipment
    from orchestrator.spec.loading import load_spec

    monkeypatch.setenv("ORCHESTRATOR_CONFIG", str(tmp_path / "cfg" / "config.yaml"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    (tmp_path / SHIPPED_NAME).write_text(json.dumps({"files": {"elsewhere.py": ["0" * 64, 1, "0o644"]}}))
    proj = tmp_path / "proj"
    write(proj, {"train.py": "print(1)\n", "spec.yaml": "name: t\nentrypoint: train.py\nruns_dir: /scratch/runs\n"})
    monkeypatch.chdir(proj)
    header, _ = shipment(load_spec("spec.yaml", executor="slurm", home_elsewhere=True), RemoteSettings(host="login"))
    assert sorted(header["files"]) == ["spec.yaml", "train.py"]
    err = capsys.readouterr().err
    assert f"warning: {tmp_path / SHIPPED_NAME} is not the record of a checkout" in err
