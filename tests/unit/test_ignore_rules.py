"""The ignore file's and ``code.exclude``'s patterns mean what the same lines mean in a .gitignore
(``orchestrator.code.snapshot_files.is_ignored``): the last matching line decides, ``!`` takes a
path back in, and a file under an ignored folder stays out whatever a later ``!`` says, as git
never looks inside an ignored folder. The property test compares the matcher with
``git check-ignore --no-index`` itself on generated trees and pattern lists."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.code.snapshot import LEFT_IGNORED, scan
from orchestrator.code.snapshot_files import ignore_patterns, is_ignored

# Folder and file names are disjoint, so any list of paths is a tree (no name is both); a folder
# named like a file ("d.bin") tests a glob that matches folders too.
FOLDERS = ["a", "b", "d.bin"]
FILES = ["keep.bin", "drop.bin", "x.py", "a.txt"]
SEGMENTS = ["a", "b", "*", "*.bin", "keep.bin", "drop.bin", "x.py", "d.bin", "**", "?.py", "[ab]", "[!a]*", "k*",
            "*.py", "a*", "[b-a]*", "[]a-c]*", "[^k]*.bin", "\\x.py", "d.b?n", "a**"]


def _isolated_git_env(home: str) -> dict[str, str]:
    """git with no user or system configuration: no global excludes file to add patterns."""
    return {**os.environ, "HOME": home, "XDG_CONFIG_HOME": home, "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C"}


def git_ignored(paths: list[str], patterns: list[str]) -> set[str]:
    """The paths git itself ignores with ``patterns`` as the root's .gitignore (the files made)."""
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        repo.mkdir()
        env = _isolated_git_env(tmp)
        subprocess.run(["git", "init", "-q", str(repo)], check=True, env=env, timeout=30)
        for rel in paths:
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            (repo / rel).write_text("x")
        (repo / ".gitignore").write_text("".join(p + "\n" for p in patterns))
        out = subprocess.run(["git", "-C", str(repo), "check-ignore", "--no-index", "--stdin", "-z"],
                             input="\0".join(paths).encode(), capture_output=True, env=env, timeout=30)
        assert out.returncode in (0, 1), out.stderr  # 1: nothing ignored
        return {p for p in out.stdout.decode().split("\0") if p}


@st.composite
def trees(draw: st.DrawFn) -> list[str]:
    def path(depth: int, name: str, folders: list[str]) -> str:
        return "/".join([*folders[:depth], name])

    items = draw(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(FILES),
                                    st.lists(st.sampled_from(FOLDERS), min_size=3, max_size=3)),
                          min_size=1, max_size=8))
    return sorted({path(depth, name, folders) for depth, name, folders in items})


@st.composite
def patterns(draw: st.DrawFn) -> str:
    segments = draw(st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=3))
    lead = draw(st.sampled_from(["", "", "/"]))
    trail = draw(st.sampled_from(["", "", "/"]))
    negate = draw(st.sampled_from(["", "!"]))
    return f"{negate}{lead}{'/'.join(segments)}{trail}"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees(), st.lists(patterns(), min_size=1, max_size=5))
def test_the_ignore_rules_agree_with_git_check_ignore(paths: list[str], lines: list[str]) -> None:
    ours = {p for p in paths if is_ignored(p, lines)}
    assert ours == git_ignored(paths, lines), lines


@pytest.mark.parametrize("lines, ignored", [
    # the finding: a '!' takes back only the file it names
    (["*.bin", "!keep.bin"], {"drop.bin", "a/drop.bin", "d.bin/x.py", "d.bin/drop.bin"}),
    # no file is taken back out of an ignored folder (git never looks inside it) ...
    (["a/", "!a/keep.bin"], {"a/keep.bin", "a/drop.bin", "a/x.py"}),
    (["d.bin", "!d.bin/x.py"], {"d.bin/x.py", "d.bin/drop.bin"}),
    # ... but out of a folder whose files alone are ignored, it is
    (["a/*", "!a/keep.bin"], {"a/drop.bin", "a/x.py"}),
    # '**' crosses folders, and matches none too
    (["**/x.py"], {"x.py", "a/x.py", "d.bin/x.py"}),
    (["a/**/keep.bin"], {"a/keep.bin"}),
    (["a/**", "!a/x.py"], {"a/keep.bin", "a/drop.bin"}),
])
def test_negation_and_folders_as_git_reads_them(lines: list[str], ignored: set[str]) -> None:
    paths = ["keep.bin", "drop.bin", "x.py", "a/keep.bin", "a/drop.bin", "a/x.py", "d.bin/x.py", "d.bin/drop.bin"]
    assert {p for p in paths if is_ignored(p, lines)} == ignored
    assert git_ignored(paths, lines) == ignored  # the expectation is git's own


def test_a_negated_line_in_the_ignore_file_freezes_only_the_file_it_names(tmp_path: Path) -> None:
    """End to end: ``*.bin`` then ``!keep.bin`` in .orchignore, with ``code.include: ['*.bin']``
    (a .bin is data, not code, unless included): keep.bin is frozen, drop.bin is not."""
    proj = tmp_path / "proj"
    proj.mkdir()
    for name, text in {"train.py": "", "keep.bin": "k", "drop.bin": "d", "sub/drop.bin": "d",
                       ".orchignore": "*.bin\n!keep.bin\n"}.items():
        (proj / name).parent.mkdir(parents=True, exist_ok=True)
        (proj / name).write_text(text)
    snap = scan(str(proj), "folder", str(tmp_path / "runs" / ".code"), include_patterns=["*.bin"])
    assert sorted(snap.entries) == ["keep.bin", "train.py"]
    assert snap.left_out[LEFT_IGNORED] == ("drop.bin", "sub/drop.bin")


def test_the_ignore_file_drops_comments_blanks_and_trailing_blanks(tmp_path: Path) -> None:
    ignore = tmp_path / ".orchignore"
    ignore.write_text("# a comment\n\n   \n*.bin   \n  !keep.bin\nname\\ \n\\#literal\n")
    assert ignore_patterns(ignore) == ["*.bin", "!keep.bin", "name\\ ", "\\#literal"]
    assert is_ignored("name ", ignore_patterns(ignore)) and not is_ignored("name", ignore_patterns(ignore))
    assert is_ignored("#literal", ignore_patterns(ignore))
