"""The login node's receiver (``orchestrator remote-receive``) is a trust boundary: whatever a
client sends (a damaged or older client, a tampered stream, another program speaking the
protocol), nothing is written outside the receiver's checkout and blob store, nothing runs, and
the refusal is one line back to the client.

Each case feeds ``serve()`` a header and a blob stream, with ``ORCHESTRATOR_HOME`` in a folder of
its own (an *arena*: the home, a victim folder beside it, an honest checkout and blob), and
compares the arena before and after, outside the one checkout the header may name and the blob
store. ``orchestrator.api.submit`` is replaced by a recorder: no case may reach it but the
honest one."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator, Optional
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import orchestrator.api
from orchestrator.core.errors import UsageError
from orchestrator.remote.remote_protocol import _header
from orchestrator.remote.remote_receive import INTERNAL_ERROR, MAX_FILE_BYTES, MAX_NAME_BYTES, NO_PROJECT, serve
from orchestrator.code.snapshot import SHIPPED_NAME

HONEST = "honest-00000000"
PROJECT = "fuzz-0123abcd"
SPEC = {"name": "fuzz", "entrypoint": "train.py", "executor": "slurm"}
_PROJECT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,119}")


# ---- the arena -----------------------------------------------------------------------------------
def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_entry(data: bytes, mode: str = "0o644") -> list:
    return [sha(data), len(data), mode]


def link_entry(target: str) -> list:
    return [sha(os.fsencode(target)), 0, "0o777", target]


@dataclass
class Arena:
    """A login node's account in a folder: its orchestrator home, a folder of someone's files
    beside it, an honest checkout and one blob that checkout uses."""

    root: Path
    home: Path = field(init=False)
    victim: Path = field(init=False)
    honest_blob: Path = field(init=False)

    def __post_init__(self) -> None:
        self.home = self.root / "home"
        self.victim = self.root / "victim"
        (self.victim / "sub").mkdir(parents=True)
        (self.victim / "secret.txt").write_text("precious")
        data = b"honest content\n"
        self.honest_blob = self.blobs / sha(data)[:2] / sha(data)
        self.honest_blob.parent.mkdir(parents=True)
        self.honest_blob.write_bytes(data)
        self.honest_blob.chmod(0o444)
        checkout = self.projects / HONEST
        checkout.mkdir(parents=True)
        os.link(self.honest_blob, checkout / "train.py")

    @property
    def blobs(self) -> Path:
        return self.home / "remote" / "blobs"

    @property
    def projects(self) -> Path:
        return self.home / "remote" / "projects"

    def checkout(self, project: str = PROJECT) -> Path:
        return self.projects / project

    def allowed(self, header: Any) -> set[Path]:
        """What the receiver may write: its blob store, and the checkout (and its lock) of the
        project the header names when that is a plain name."""
        roots = {self.blobs}
        project = header.get("project") if isinstance(header, dict) else None
        if isinstance(project, str) and _PROJECT_NAME.fullmatch(project) and project not in (HONEST, NO_PROJECT):
            roots |= {self.projects / project, self.projects / f".{project}.lock"}
        return roots

    def state(self, skip: set[Path]) -> dict[str, tuple]:
        """Every entry under the arena but ``skip``: kind, mode, inode, size, mtime, content or target."""
        seen: dict[str, tuple] = {}
        for folder, dirs, files in os.walk(self.root):
            dirs[:] = [d for d in dirs if Path(folder, d) not in skip]
            for name in [*dirs, *files]:
                path = Path(folder, name)
                if path in skip:
                    continue
                st_ = os.lstat(path)
                if stat.S_ISLNK(st_.st_mode):
                    info: tuple = ("link", os.readlink(path))
                elif stat.S_ISDIR(st_.st_mode):
                    info = ("dir", st_.st_mode)
                else:
                    info = ("file", st_.st_mode, st_.st_ino, st_.st_size, st_.st_mtime_ns, sha(path.read_bytes()))
                seen[str(path.relative_to(self.root))] = info
        return seen

    def blob_store_is_sound(self, honest: tuple) -> None:
        """The honest blob untouched; every other file a whole blob named by its hash (nothing partial)."""
        st_ = os.lstat(self.honest_blob)
        assert (st_.st_ino, st_.st_mode, self.honest_blob.read_bytes()) == honest
        for folder, _dirs, files in os.walk(self.blobs):
            for name in files:
                path = Path(folder, name)
                assert not os.path.islink(path), path
                assert re.fullmatch(r"[0-9a-f]{64}", name) and Path(folder).name == name[:2], path
                assert sha(path.read_bytes()) == name, path


@contextlib.contextmanager
def receiver(home: Path, user_home: Optional[Path] = None, also: Optional[Callable[[], None]] = None,
             ) -> Iterator[list]:
    """ORCHESTRATOR_HOME at ``home``, the login user's HOME at ``user_home`` (default: a folder
    beside it, so a relative runs_dir is not in the home unless a case says so), the working
    folder restored after, and ``submit`` recorded instead of run (the list it yields; ``also``
    is called in its place too, in the folder it was called from)."""
    calls: list = []

    def recorded_submit(spec: Any, *, executor: str = "slurm", on_plan: Any = None) -> Any:
        calls.append((spec, executor, os.getcwd()))
        if also is not None:
            also()
        return SimpleNamespace(id="run-1", job_ids=["101"], run_dir=Path(os.getcwd()) / "runs" / "run-1")

    saved = {name: os.environ.get(name) for name in ("ORCHESTRATOR_HOME", "HOME")}
    cwd = os.getcwd()
    os.environ["ORCHESTRATOR_HOME"] = str(home)
    os.environ["HOME"] = str(user_home or home.parent / "login-user-home")
    try:
        with mock.patch.object(orchestrator.api, "submit", recorded_submit):
            yield calls
    finally:
        os.chdir(cwd)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def encode(header: Any) -> bytes:
    return header if isinstance(header, bytes) else json.dumps(header).encode() + b"\n"


def feed(arena: Arena, header: Any, stream: bytes = b"END\n", user_home: Optional[Path] = None,
         also: Optional[Callable[[], None]] = None) -> tuple[int, list[dict], list]:
    """Run the receiver on ``header`` and ``stream``: its exit status, its messages, the submissions."""
    out = io.BytesIO()
    with receiver(arena.home, user_home, also) as calls:
        code = serve(io.BytesIO(encode(header) + stream), out)
    return code, [json.loads(line) for line in out.getvalue().splitlines()], calls


def blob_stream(*contents: bytes) -> bytes:
    return b"".join(f"{sha(c)} {len(c)}\n".encode() + c for c in dict.fromkeys(contents)) + b"END\n"


def assert_refused(arena: Arena, header: Any, stream: bytes = b"END\n", match: str = "",
                   plant: Optional[Callable[[], None]] = None, user_home: Optional[Path] = None) -> str:
    """Feed it; it must be refused with one line, nothing outside the allowed roots changed,
    nothing submitted. Returns the error."""
    if plant is not None:
        plant()
    skip = arena.allowed(header)
    before = arena.state(skip)
    st_ = os.lstat(arena.honest_blob)
    honest = (st_.st_ino, st_.st_mode, arena.honest_blob.read_bytes())
    code, messages, calls = feed(arena, header, stream, user_home)
    assert calls == [], "a hostile submission reached submit"
    assert code != 0 and messages and "error" in messages[-1], messages
    assert all(set(m) == {"missing"} and isinstance(m["missing"], list) for m in messages[:-1]), messages
    error = messages[-1]["error"]
    assert "\n" not in error and not error.startswith(INTERNAL_ERROR) and "Traceback" not in error, error
    assert re.search(match, error), error
    assert arena.state(skip) == before
    arena.blob_store_is_sound(honest)
    assert (arena.victim / "secret.txt").read_text() == "precious"
    return error


@pytest.fixture
def arena(tmp_path: Path) -> Arena:
    return Arena(tmp_path / "arena")


TRAIN, MOD, SCRIPT = b"print('train')\n", b"X = 1\n", b"#!/bin/sh\necho hi\n"


def honest_header(**changes: Any) -> dict:
    files = {"train.py": file_entry(TRAIN), "pkg/mod.py": file_entry(MOD), "run.sh": file_entry(SCRIPT, "0o755"),
             "lnk": link_entry("pkg"), "pkg/up": link_entry("../train.py")}
    header = {"protocol": 1, "version": "x", "spec": dict(SPEC, entrypoint="mod.py"), "project": PROJECT,
              "cwd": "pkg", "files": files, "commit": "0" * 40, "diff": ""}
    header.update(changes)
    return header


HONEST_STREAM = blob_stream(TRAIN, MOD, SCRIPT)


# ---- (a) the problems, one by one ----------------------------------------------------------------
def test_an_honest_submission_still_goes_through(arena: Arena, tmp_path: Path) -> None:
    code, messages, calls = feed(arena, honest_header(), HONEST_STREAM)
    assert code == 0 and messages[-1]["submitted"]["run"] == "run-1", messages
    assert sorted(messages[0]["missing"]) == sorted({sha(TRAIN), sha(MOD), sha(SCRIPT)})
    checkout = arena.checkout()
    (spec, executor, cwd), = calls
    assert executor == "slurm" and spec.executor == "slurm" and cwd == str(checkout / "pkg")
    assert (checkout / "train.py").read_bytes() == TRAIN and (checkout / "pkg" / "mod.py").read_bytes() == MOD
    assert os.access(checkout / "run.sh", os.X_OK) and os.readlink(checkout / "lnk") == "pkg"
    assert (checkout / "pkg" / "up").read_bytes() == TRAIN
    assert sorted(json.loads((checkout / SHIPPED_NAME).read_text())["files"]) == sorted(honest_header()["files"])
    again = feed(arena, honest_header(), b"END\n")  # nothing new to send; the same checkout
    assert again[0] == 0 and again[1][0] == {"missing": []}


@pytest.mark.parametrize("project", ["..", ".", "../../evil", "a/b", "/abs", ".hidden", "-opt", NO_PROJECT, "",
                                     "x" * 121, "a\0b", 7, None, ["p"]])
def test_a_project_outside_the_checkout_root_is_refused(arena: Arena, project: Any) -> None:
    """project '..' made remote/ the checkout: blobs/<sha> in it replaced the stored blobs."""
    honest = arena.honest_blob.relative_to(arena.home / "remote")
    header = honest_header(project=project, cwd=".")
    header["files"][str(honest)] = file_entry(b"evil")
    assert_refused(arena, header, blob_stream(TRAIN, MOD, SCRIPT, b"evil"), "no valid project")


@pytest.mark.parametrize("target", ["/", "ABS", "..", "../..", "../../../../victim", "pkg/../..", "x/../../y"])
def test_a_shipped_link_leading_out_is_refused(arena: Arena, target: str) -> None:
    target = str(arena.victim) if target == "ABS" else target
    header = honest_header(cwd=".")
    header["files"]["out"] = link_entry(target)
    assert_refused(arena, header, HONEST_STREAM, r"refusing the shipped link 'out' -> .*leads out of the project")


def test_a_link_climbing_through_another_shipped_link_is_refused(arena: Arena) -> None:
    """deep/b -> a/../.. reads as 'deep' to os.path.normpath, and as the checkout's parent to the
    kernel (deep/a is a link to '..', so a/.. is the checkout's parent)."""
    header = honest_header(cwd=".")
    header["files"].update({"deep/a": link_entry(".."), "deep/b": link_entry("a/../..")})
    assert_refused(arena, header, HONEST_STREAM, r"shipped link 'deep/b'")


@pytest.mark.parametrize("link,cwd", [("ABS", "out/a/b"), ("../../../../victim", "out/sub"), ("pkg", "out/sub"),
                                      ("pkg", "out")])
def test_a_working_folder_beneath_a_shipped_link_is_refused(arena: Arena, link: str, cwd: str) -> None:
    """A link and a cwd beneath it: the receiver made the folders through the link, outside."""
    header = honest_header(cwd=cwd)
    header["files"]["out"] = link_entry(str(arena.victim) if link == "ABS" else link)
    assert_refused(arena, header, HONEST_STREAM, r"shipped link 'out'|passes through 'out', a shipped link")
    assert not (arena.victim / "a").exists() and sorted(p.name for p in arena.victim.iterdir()) == ["secret.txt", "sub"]


def test_a_working_folder_beneath_a_link_left_in_the_checkout_is_refused(arena: Arena) -> None:
    """The link was not shipped (a job made it): the folder is still never made through it."""
    def plant() -> None:
        arena.checkout().mkdir(parents=True)
        (arena.checkout() / "work").symlink_to(arena.victim)

    assert_refused(arena, honest_header(cwd="work/new"), HONEST_STREAM, "work in the login node's checkout .* is a "
                   "link, and nothing is written through one", plant=plant)
    assert not (arena.victim / "new").exists()


def test_nothing_is_written_through_a_link_left_in_the_checkout(arena: Arena) -> None:
    def plant() -> None:
        arena.checkout().mkdir(parents=True)
        (arena.checkout() / "pkg").symlink_to(arena.victim)

    assert_refused(arena, honest_header(cwd="."), HONEST_STREAM, "refusing to write pkg/mod.py: pkg .* is a link",
                   plant=plant)
    assert not (arena.victim / "mod.py").exists()


def test_a_checkout_that_is_a_link_is_not_written_through(arena: Arena) -> None:
    assert_refused(arena, honest_header(cwd="."), HONEST_STREAM, "checkout .* is a link",
                   plant=lambda: arena.checkout().symlink_to(arena.victim))
    assert sorted(p.name for p in arena.victim.iterdir()) == ["secret.txt", "sub"]


def test_a_tampered_record_of_the_last_shipment_removes_nothing_outside(arena: Arena) -> None:
    """The record lies where jobs write: the paths it lists are checked before anything is removed."""
    checkout = arena.checkout()
    checkout.mkdir(parents=True)
    (checkout / "data").symlink_to(arena.victim)
    stale = ["../../../../victim/secret.txt", str(arena.victim / "secret.txt"), "data/secret.txt", "data/sub"]
    (checkout / SHIPPED_NAME).write_text(json.dumps({"files": {rel: ["0" * 64, 1, "0o644"] for rel in stale}}))
    code, messages, calls = feed(arena, honest_header(), HONEST_STREAM)
    assert code == 0 and len(calls) == 1, messages
    assert (arena.victim / "secret.txt").read_text() == "precious" and (arena.victim / "sub").is_dir()


def test_a_link_shipped_before_is_not_written_through_when_files_are_shipped_beneath_it(arena: Arena) -> None:
    """data was a shipped link to raw/ and is now a folder on the laptop: its files would land in
    raw/ through the link, so the submission is refused, naming the link to remove."""
    first = honest_header(cwd=".", spec=dict(SPEC))
    first["files"].update({"data": link_entry("raw"), "raw/x.py": file_entry(MOD)})
    assert feed(arena, first, HONEST_STREAM)[0] == 0
    second = honest_header(cwd=".")
    second["files"].update({"data/y.py": file_entry(MOD), "raw/x.py": file_entry(MOD)})
    assert_refused(arena, second, b"END\n", "refusing to write data/y.py: data in the login node's checkout .* is "
                   "a link, and nothing is written through one")
    assert sorted(p.name for p in (arena.checkout() / "raw").iterdir()) == ["x.py"]


@pytest.mark.parametrize("executor", ["local", "debug", None, "SLURM", " slurm", 1, ["slurm"]])
def test_only_a_slurm_spec_is_accepted(arena: Arena, executor: Any) -> None:
    """executor local or debug ran the user's code on the (shared) login node and said 'submitted'."""
    spec = dict(SPEC, executor=executor) if executor is not None else {k: v for k, v in SPEC.items() if k != "executor"}
    error = assert_refused(arena, honest_header(spec=spec), HONEST_STREAM,
                           "refusing to run this spec on the login node")
    assert "executor: slurm" in error


def test_the_client_refuses_a_remote_submit_that_would_run_on_the_login_node(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator import remote

    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "spec.yaml").write_text("name: t\nentrypoint: train.py\n")
    monkeypatch.chdir(tmp_path)
    ssh = mock.Mock(spec=remote.Ssh)
    for executor in ("local", "debug"):
        args = SimpleNamespace(spec=["spec.yaml"], overrides=[], executor=executor, follow=False, wait=False)
        with pytest.raises(UsageError, match=f"--executor {executor} would run it on the login node"):
            remote.submit(ssh, args)
    assert ssh.mock_calls == []  # refused before any connection


BAD_ENTRIES = [
    pytest.param(["0" * 64, -1, "0o644"], "size -1", id="negative-size"),
    pytest.param(["0" * 64, MAX_FILE_BYTES + 1, "0o644"], "size", id="oversized"),
    pytest.param(["0" * 64, 1.5, "0o644"], "size", id="float-size"),
    pytest.param(["0" * 64, True, "0o644"], "size", id="bool-size"),
    pytest.param(["0" * 64, "1", "0o644"], "size", id="text-size"),
    pytest.param(["0" * 64, 1, "0o4755"], "mode '0o4755'", id="setuid-mode"),
    pytest.param(["0" * 64, 1, 420], "mode 420", id="int-mode"),
    pytest.param(["0" * 64, 1, "0o777"], "mode", id="file-with-link-mode"),
    pytest.param(["0" * 64, 1, None], "mode", id="no-mode"),
    pytest.param(["0" * 64, 1, ["0o644"]], "mode", id="list-mode"),
    pytest.param(["A" * 64, 1, "0o644"], "hash", id="upper-sha"),
    pytest.param(["0" * 63, 1, "0o644"], "hash", id="short-sha"),
    pytest.param([None, 1, "0o644"], "hash", id="no-sha"),
    pytest.param([sha(b"/etc"), 0, "0o777", "/etc", "x"], "expected", id="five-fields"),
    pytest.param(["0" * 64, 1], "expected", id="two-fields"),
    pytest.param({"sha": "0" * 64}, "expected", id="a-mapping"),
    pytest.param("0" * 64, "expected", id="a-string"),
    pytest.param([sha(b"x"), 0, "0o777", ""], "link target", id="empty-target"),
    pytest.param([sha(b"a\0b"), 0, "0o777", "a\0b"], "link target", id="nul-target"),
    pytest.param([sha(b"x"), 0, "0o777", 5], "link target", id="int-target"),
    pytest.param([sha(b"x"), 0, "0o777", "\ud800"], "link target", id="unencodable-target"),
    pytest.param([sha(b"other"), 0, "0o777", "pkg"], "not what its hash says", id="target-hash"),
    pytest.param([sha(b"pkg"), 3, "0o777", "pkg"], "size 0", id="link-with-size"),
    pytest.param([sha(b"pkg"), 0, "0o644", "pkg"], "mode 0o777", id="link-with-file-mode"),
]


@pytest.mark.parametrize("entry,match", BAD_ENTRIES)
def test_a_malformed_entry_is_one_line(arena: Arena, entry: Any, match: str) -> None:
    header = honest_header()
    header["files"]["bad.py"] = entry
    assert_refused(arena, header, HONEST_STREAM, r"the shipped entry for 'bad.py' is malformed.*" + re.escape(match))


@pytest.mark.parametrize("path", ["../x.py", "/abs/x.py", "a/../../b", "a//b", "./a", "a/.", "a/", "", "a\0b",
                                  "\ud800.py", "n" * (MAX_NAME_BYTES + 1), "x/" * 2100 + "x"])
def test_a_path_outside_the_project_is_one_line(arena: Arena, path: str) -> None:
    header = honest_header()
    header["files"][path] = file_entry(TRAIN)
    assert_refused(arena, header, HONEST_STREAM, "refusing the shipped path")


@pytest.mark.parametrize("files,match", [
    ({"train.py/x.py": file_entry(MOD)}, "'train.py' is shipped as a file"),
    ({"lnk/evil.py": file_entry(MOD)}, "'lnk' is shipped as a link"),
    ({SHIPPED_NAME: file_entry(MOD)}, "keeps its own record"),
    ({f"pkg/{SHIPPED_NAME}": file_entry(MOD)}, "keeps its own record"),
    ({"same.py": [sha(MOD), len(MOD) + 1, "0o644"]}, "another size"),
])
def test_entries_that_contradict_each_other_are_refused(arena: Arena, files: dict, match: str) -> None:
    header = honest_header()
    header["files"].update(files)
    assert_refused(arena, header, HONEST_STREAM, match)


@pytest.mark.parametrize("cwd,match", [("..", "'..' part"), ("../x", "'..' part"), ("/abs", "absolute"),
                                       ("a//b", "empty"), ("", "empty"), ("a\0", "NUL"), (3, "not text"),
                                       ("train.py", "a shipped file"), ("lnk/x", "a shipped link"),
                                       ("pkg/up/z", "'pkg/up', a shipped link")])
def test_a_working_folder_outside_the_project_is_refused(arena: Arena, cwd: Any, match: str) -> None:
    assert_refused(arena, honest_header(cwd=cwd), HONEST_STREAM, "refusing the folder you submitted from.*" + match)


def _line(text: bytes) -> bytes:
    return text + b"\n"


@pytest.mark.parametrize("header,match", [
    (b"not json\n", "not JSON"),
    (b"[" * 100_000 + b"\n", "not JSON"),
    (b'{"protocol": 1, "spec": {}, "files": {"a": ["' + b"0" * 64 + b'", NaN, "0o644"]}}\n', "not JSON"),
    (b"\xff\xfe\n", "not JSON"),
    (_line(json.dumps(dict(honest_header(), protocol=True)).encode()), "protocol"),
    (_line(json.dumps(dict(honest_header(), protocol="1")).encode()), "protocol"),
    (b"[1]\n", "protocol"),
    (_line(json.dumps(dict(honest_header(), extra=1)).encode()), "unknown field"),
    (_line(json.dumps(dict(honest_header(), files=[])).encode()), "lacks its files"),
    (_line(json.dumps(dict(honest_header(), spec=[])).encode()), "lacks its spec"),
    (_line(json.dumps(dict(honest_header(), commit="$(id)")).encode()), "not a git commit"),
    (_line(json.dumps(dict(honest_header(), diff=["x"])).encode()), "diff is not text"),
])
def test_a_malformed_header_is_one_line(arena: Arena, header: bytes, match: str) -> None:
    assert_refused(arena, header, HONEST_STREAM, match)


@pytest.mark.parametrize("legacy", ["..", ".", "../fuzz-00000000", "fuzz-0123abcd/x", NO_PROJECT, HONEST,
                                    "other-0123abcd", "fuzz", ".fuzz-00000000", "x" * 121, 7, True, ["fuzz-1"], {}])
def test_an_older_checkout_name_that_is_not_this_projects_is_refused(arena: Arena, legacy: Any) -> None:
    """legacy_project names the checkout an older client made of this project: a plain name that is
    the project's own but for the hash, never a folder elsewhere nor another project's checkout."""
    assert_refused(arena, honest_header(legacy_project=legacy), HONEST_STREAM, "older checkout name")


def test_an_older_checkout_name_without_a_project_is_refused(arena: Arena) -> None:
    header = honest_header(legacy_project="fuzz-00000000", project=None, files={}, cwd=".")
    assert_refused(arena, header, b"END\n", "older checkout name")


@pytest.mark.parametrize("value", ["true", 1, 0, None, [], {"x": 1}])
def test_allow_runs_in_home_is_true_or_false(arena: Arena, value: Any) -> None:
    assert_refused(arena, honest_header(allow_runs_in_home=value), HONEST_STREAM, "not true or false")


@pytest.mark.parametrize("plan,match", [
    ("plan", "plan options"), ([], "plan options"), ({"json": True, "extra": 1}, "plan options"),
    ({"json": 1}, "json .* not true or false"), ({"node": -1}, "--node -1"), ({"rank": True}, "--rank True"),
    ({"node": 10**12}, "--node"), ({"rank": "0"}, "--rank '0'"), ({"rank": 1.0}, "--rank 1.0"),
    ({"node": 0, "rank": 0}, "not both"),
])
def test_malformed_plan_options_are_one_line(arena: Arena, plan: Any, match: str) -> None:
    assert_refused(arena, honest_header(plan=plan), HONEST_STREAM, match)


def test_runs_that_would_land_in_the_login_users_home_are_refused_before_anything_is_received(arena: Arena) -> None:
    """The checkout is under the login user's home (ORCHESTRATOR_HOME unset there), and the spec's
    runs_dir is the default relative one: refused before a file is asked for or written."""
    error = assert_refused(arena, honest_header(), HONEST_STREAM, r"^runs_dir: 'runs' is relative",
                           user_home=arena.home)
    assert "remote.allow_runs_in_home: true" in error and str(arena.checkout() / "pkg" / "runs") in error
    assert not arena.checkout().exists()
    code, messages, calls = feed(arena, honest_header(allow_runs_in_home=True), HONEST_STREAM, user_home=arena.home)
    assert code == 0 and len(calls) == 1, messages
    code, messages, calls = feed(arena, honest_header(spec=dict(SPEC, entrypoint="mod.py", runs_dir="~/runs")),
                                 b"END\n", user_home=arena.home)
    assert code == 0 and calls[0][0].runs_dir == "~/runs", messages


def test_tilde_in_a_received_path_is_the_login_users_home(arena: Arena) -> None:
    spec = dict(SPEC, entrypoint="mod.py", checkpoint={"dir": "~/ckpt/x"}, workdir="~/work")
    code, messages, calls = feed(arena, honest_header(spec=spec), HONEST_STREAM, user_home=arena.root / "alice")
    assert code == 0, messages
    (received, _, _), = calls
    assert received.checkpoint.dir == str(arena.root / "alice" / "ckpt" / "x")
    assert received.workdir == str(arena.root / "alice" / "work")


def test_an_older_host_named_checkout_is_adopted_once_and_kept(arena: Arena) -> None:
    """A checkout made before the client id (named by the laptop's host name) holds runs under a
    relative runs_dir: the first submission under the new name uses it, and later ones keep it
    even after the host name (and so the older name) changed."""
    old = arena.checkout("fuzz-01d0c0de")
    (old / "pkg" / "runs" / "fuzz-run").mkdir(parents=True)
    (old / "pkg" / "runs" / "fuzz-run" / "ckpt.pt").write_text("step 300")
    code, messages, calls = feed(arena, honest_header(legacy_project="fuzz-01d0c0de"), HONEST_STREAM)
    assert code == 0 and calls[0][2] == str(old / "pkg"), messages
    assert not arena.checkout().exists() and (old / "pkg" / "mod.py").read_bytes() == MOD
    assert (arena.projects / ".aliases" / PROJECT).read_text().strip() == "fuzz-01d0c0de"
    code, messages, calls = feed(arena, honest_header(legacy_project="fuzz-0ddba11e"), b"END\n")  # host renamed
    assert code == 0 and calls[0][2] == str(old / "pkg") and not arena.checkout().exists(), messages
    assert (old / "pkg" / "runs" / "fuzz-run" / "ckpt.pt").read_text() == "step 300"


def test_a_projects_own_checkout_wins_over_an_older_one(arena: Arena) -> None:
    assert feed(arena, honest_header(), HONEST_STREAM)[0] == 0
    arena.checkout("fuzz-01d0c0de").mkdir()
    code, messages, calls = feed(arena, honest_header(legacy_project="fuzz-01d0c0de"), b"END\n")
    assert code == 0 and calls[0][2] == str(arena.checkout() / "pkg"), messages
    assert not (arena.projects / ".aliases").exists()


def test_an_alias_naming_no_plain_checkout_is_ignored(arena: Arena) -> None:
    """The alias record lies in the receiver's own folder, but is read as hostile all the same."""
    (arena.projects / ".aliases").mkdir()
    (arena.projects / ".aliases" / PROJECT).write_text("../../victim\n")
    code, messages, calls = feed(arena, honest_header(), HONEST_STREAM)
    assert code == 0 and calls[0][2] == str(arena.checkout() / "pkg"), messages
    assert sorted(p.name for p in arena.victim.iterdir()) == ["secret.txt", "sub"]


def test_plan_answers_the_login_nodes_plan_and_submits_nothing(arena: Arena) -> None:
    import sys

    spec = dict(SPEC, entrypoint="mod.py", checkpoint={"dir": "~/ckpt/x"})
    code, messages, calls = feed(arena, honest_header(spec=spec, plan={"json": False, "node": None, "rank": None}),
                                 HONEST_STREAM, user_home=arena.root / "alice")
    assert code == 0 and calls == [], messages
    planned = messages[-1]["planned"]
    assert planned["warnings"] == []
    assert sys.executable in planned["text"] and str(arena.checkout() / "pkg" / "runs") in planned["text"]
    code, messages, calls = feed(arena, honest_header(spec=spec, plan={"json": True}), b"END\n",
                                 user_home=arena.root / "alice")
    launch = json.loads(messages[-1]["planned"]["text"])
    assert launch["payload"]["checkpoint"]["dir"] == str(arena.root / "alice" / "ckpt" / "x")
    assert launch["payload"]["python"] == sys.executable and calls == []


def test_plan_warns_where_submit_would_refuse_runs_in_the_home(arena: Arena) -> None:
    code, messages, calls = feed(arena, honest_header(plan={}), HONEST_STREAM, user_home=arena.home)
    assert code == 0 and calls == [], messages
    (warning,) = messages[-1]["planned"]["warnings"]
    assert warning.startswith("runs_dir: 'runs' is relative")


def test_an_oversized_header_is_refused(arena: Arena, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("orchestrator.remote.remote_protocol.MAX_HEADER_BYTES", 100)
    assert_refused(arena, honest_header(), HONEST_STREAM, "header is over")


def test_too_many_files_are_refused(arena: Arena, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("orchestrator.remote.remote_protocol.MAX_FILES", 3)
    assert_refused(arena, honest_header(), HONEST_STREAM, "over the limit of 3")


def _blob(data: bytes, size: Optional[int] = None, name: Optional[str] = None) -> bytes:
    return f"{name or sha(data)} {len(data) if size is None else size}\n".encode() + data


REST = blob_stream(MOD, SCRIPT)  # the other two blobs, then END


@pytest.mark.parametrize("stream,match", [
    pytest.param(_blob(b"unasked") + REST, "not asked for", id="unrequested"),
    pytest.param(_blob(TRAIN) + _blob(TRAIN) + REST, "not asked for", id="twice"),
    pytest.param(_blob(TRAIN, size=-5) + REST, "announced as -5 bytes", id="negative"),
    pytest.param(_blob(TRAIN, size=10**19) + REST, "announced as", id="oversized"),
    pytest.param(_blob(TRAIN, size=len(TRAIN) - 1) + REST, "announced as", id="shorter"),
    pytest.param(_blob(TRAIN + b"!", name=sha(TRAIN)) + REST, "announced as", id="longer"),
    pytest.param(_blob(b"p" * len(TRAIN), name=sha(TRAIN)) + REST, "arrived damaged", id="damaged"),
    pytest.param(f"{sha(TRAIN)} {len(TRAIN)}\n".encode() + TRAIN[:3], "closed in the middle", id="truncated"),
    pytest.param(f"{sha(TRAIN)} {len(TRAIN)}".encode(), "malformed blob header", id="cut-line"),
    pytest.param(b"hello world\n", "malformed blob header", id="garbage"),
    pytest.param(f"{sha(TRAIN)}  {len(TRAIN)}\n".encode() + TRAIN, "malformed blob header", id="two-spaces"),
    pytest.param(f"{sha(TRAIN)} +{len(TRAIN)}\n".encode() + TRAIN, "malformed blob header", id="plus-sign"),
    pytest.param(f"{sha(TRAIN).upper()} {len(TRAIN)}\n".encode() + TRAIN, "malformed blob header", id="upper"),
    pytest.param(b"x" * 500, "malformed blob header", id="long-line"),
    pytest.param(_blob(TRAIN) + b"END\n", "still missing", id="end-early"),
    pytest.param(b"", "still missing", id="eof"),
])
def test_a_hostile_blob_stream_is_one_line_and_leaves_nothing_partial(arena: Arena, stream: bytes, match: str) -> None:
    assert_refused(arena, honest_header(), stream, match)
    assert not arena.checkout().exists() or not (arena.checkout() / "train.py").exists()


# ---- the client's --remote ------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["--remote", "", "status"], ["--remote=", "submit", "s.yaml"],
                                  ["--remote=-oProxyCommand=sh", "status"], ["--remote", "", "validate", "s.yaml"],
                                  ["--remote", " ", "list"]])
def test_an_empty_or_option_like_remote_host_is_refused(argv: list[str], capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--remote '' acted locally, without a word."""
    from orchestrator.cli import main

    monkeypatch.setenv("ORCHESTRATOR_CONFIG", str(tmp_path / "none.yaml"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert re.search(r"--remote: .* is not an ssh destination", err) and len(err.strip().splitlines()) == 1, err


def test_load_settings_refuses_an_empty_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.remote import load_settings

    monkeypatch.setenv("ORCHESTRATOR_CONFIG", str(tmp_path / "none.yaml"))
    with pytest.raises(UsageError, match=r"--remote: '' is not an ssh destination \(it is empty\)"):
        load_settings("")
    with pytest.raises(UsageError, match="which ssh would read as an option"):
        load_settings("-oProxyCommand=sh")


def test_the_project_name_the_client_sends_is_one_the_receiver_takes() -> None:
    from orchestrator.remote import legacy_project_name, project_name

    for root in ("/home/me/My Project", "/home/me/.dotfiles", "/home/me/-x", "/home/me/ünï", "/"):
        name, legacy = project_name(root, "0123abcd" * 4), legacy_project_name(root)
        assert _PROJECT_NAME.fullmatch(name) and name != NO_PROJECT, name
        header = {"protocol": 1, "spec": dict(SPEC), "project": name, "legacy_project": legacy, "cwd": ".",
                  "files": {"a.py": file_entry(b"a")}}
        checked = _header(encode(header))
        assert (checked.project, checked.legacy_project) == (name, legacy)


# ---- (b) hostile submissions, generated -----------------------------------------------------------
NAMES = st.sampled_from(["a", "b", "pkg", "x.py", "sub dir", "ünï", "-dash", ".hid", "victim", "home"])
HOSTILE_PROJECTS = st.one_of(
    st.sampled_from(["..", ".", "", "../escape", "a/b", "/abs", ".hidden", "-opt", NO_PROJECT, "x" * 121, "a\0b",
                     "../../victim", "p\n"]),
    st.integers(), st.none(), st.lists(st.text(max_size=3), max_size=2))
HOSTILE_EXECUTORS = st.one_of(st.sampled_from(["local", "debug", "SLURM", " slurm", "slurm\n", "", "remove"]),
                              st.integers(), st.booleans(), st.lists(st.just("slurm"), min_size=1, max_size=2),
                              st.text(max_size=8).filter(lambda t: t != "slurm"))


@st.composite
def hostile_paths(draw: st.DrawFn, root: str) -> str:
    """A path that must not be written: climbing out, absolute, with an empty or '.' part, NUL,
    a name this system cannot hold, or a part over the name limit."""
    parts = draw(st.lists(NAMES, max_size=3))
    kind = draw(st.sampled_from(["dotdot", "abs", "empty", "dot", "nul", "trailing", "surrogate", "long"]))
    at = draw(st.integers(0, len(parts)))
    if kind == "dotdot":
        parts[at:at] = [".."] * draw(st.integers(1, 4))
        return "/".join([*parts, draw(st.sampled_from(["victim/x.py", "x.py", "victim/sub/y"]))])
    if kind == "abs":
        return "/".join([root, draw(st.sampled_from(["victim", "home/remote/blobs", "home"])), *parts, "x.py"])
    if kind in ("empty", "dot"):
        parts[at:at] = ["" if kind == "empty" else "."]
        return "/".join(parts) if len(parts) > 1 else parts[0]
    if kind == "trailing":
        return "/".join([*parts, "x.py"]) + "/"
    if kind == "long":
        return "/".join([*parts, "n" * draw(st.integers(MAX_NAME_BYTES + 1, MAX_NAME_BYTES + 50))])
    bad = "\0" if kind == "nul" else draw(st.sampled_from(["\ud800", "\udbff", "\ud834"]))
    return "/".join([*parts, f"x{bad}.py"])


@st.composite
def links_out(draw: st.DrawFn, root: str) -> dict[str, list]:
    """Shipped links whose target leads out of the project."""
    kind = draw(st.sampled_from(["abs", "climb", "through"]))
    if kind == "abs":
        return {draw(NAMES): link_entry(draw(st.sampled_from([root, f"{root}/victim", "/", f"{root}/home/remote"])))}
    if kind == "climb":
        folders = draw(st.lists(NAMES, max_size=2))
        up = len(folders) + 1 + draw(st.integers(0, 2))
        tail = draw(st.sampled_from(["", "victim", "victim/sub", "home/remote/blobs"]))
        return {"/".join([*folders, "out"]): link_entry("/".join([".."] * up + ([tail] if tail else [])))}
    depth = draw(st.integers(1, 3))  # a link to a folder above, then '..' through it
    base = "/".join(["d"] * depth)
    return {f"{base}/up": link_entry("/".join([".."] * depth)), f"{base}/out": link_entry("up/../x")}


@st.composite
def hostile_cases(draw: st.DrawFn, root: str) -> tuple[Any, bytes, list[str]]:
    """An honest header and stream with one to three hostile changes; each change alone must
    make the receiver refuse. Also the name of each change, for the failure's report."""
    header = honest_header(cwd=draw(st.sampled_from([".", "pkg", "new/sub"])))
    files, stream, plants = header["files"], HONEST_STREAM, []
    # stream and plant twice as often: only they get past the header to the blob stream and the checkout
    kinds = draw(st.lists(st.sampled_from(
        ["path", "link_out", "cwd_under_link", "beneath", "size", "mode", "sha", "shape", "link_field", "executor",
         "project", "cwd", "stream", "plant", "raw", "reserved", "stream", "plant", "legacy", "flag", "plan"]),
        min_size=1, max_size=3))
    for kind in kinds:
        if kind == "path":
            files[draw(hostile_paths(root))] = file_entry(draw(st.sampled_from([TRAIN, MOD, b"evil"])))
        elif kind == "link_out":
            files.update(draw(links_out(root)))
        elif kind == "cwd_under_link":
            name = draw(st.sampled_from(["out", "lnk"]))
            if name == "out":
                target = draw(st.sampled_from([f"{root}/victim", "pkg", "../../../../victim"]))
                files["out"] = link_entry(target)
            header["cwd"] = "/".join([name, *draw(st.lists(NAMES, max_size=2))])
        elif kind == "beneath":
            files[draw(st.sampled_from(["lnk", "train.py", "pkg/up", "run.sh"])) + "/" + draw(NAMES)] = file_entry(MOD)
        elif kind == "size":
            files["train.py"][1] = draw(st.one_of(st.integers(max_value=-1), st.integers(MAX_FILE_BYTES + 1, 2**70),
                                                  st.floats(), st.booleans(), st.text(max_size=3), st.none()))
        elif kind == "mode":
            files[draw(st.sampled_from(["train.py", "run.sh"]))][2] = draw(st.one_of(
                st.text(max_size=6), st.integers(), st.none(), st.sampled_from(["0o777", "0o4755", "0o666", "644"]))
                .filter(lambda m: m not in ("0o644", "0o755")))
        elif kind == "sha":
            files["pkg/mod.py"][0] = draw(st.one_of(st.text(max_size=70), st.integers(), st.none(),
                                                    st.just(sha(MOD).upper()), st.just(sha(MOD)[:-1])))
        elif kind == "shape":
            files[draw(NAMES)] = draw(st.one_of(st.text(max_size=4), st.integers(), st.none(),
                                                st.lists(st.integers(), max_size=2), st.lists(st.text(), min_size=5),
                                                st.dictionaries(st.text(max_size=2), st.integers(), max_size=2)))
        elif kind == "link_field":
            files["lnk"] = draw(st.sampled_from([[sha(b"pkg"), 0, "0o777", ""], [sha(b"pkg"), 0, "0o777", None, 1],
                                                 [sha(b"x"), 0, "0o777", "pkg"], [sha(b"pkg"), 1, "0o777", "pkg"],
                                                 [sha(b"pkg"), 0, "0o755", "pkg"], [sha(b"pkg"), 0, "0o777", 3],
                                                 [sha(b"p\0"), 0, "0o777", "p\0"]]))
        elif kind == "executor":
            executor = draw(HOSTILE_EXECUTORS)
            header["spec"] = dict(SPEC, executor=executor) if executor != "remove" else {"name": "fuzz"}
        elif kind == "project":
            header["project"] = draw(HOSTILE_PROJECTS)
        elif kind == "cwd":
            header["cwd"] = draw(st.one_of(st.sampled_from(["..", "../x", "a/../..", "", "a//b", "./a", "a/", "a\0",
                                                            "train.py", "train.py/x", "lnk", "lnk/x", "pkg/up/z",
                                                            f"{root}/victim", "/"]),
                                           st.integers(), st.lists(st.text(max_size=2), max_size=2)))
        elif kind == "stream":
            stream = draw(hostile_streams())
        elif kind == "plant":
            plants.append(draw(st.sampled_from(["pkg", "checkout", "cwd"])))
        elif kind == "raw":
            return draw(st.sampled_from([b"{", b"[" * 5000, b"null\n", b'{"protocol": true}\n', b"\n", b"",
                                         json.dumps(dict(header, protocol=2)).encode() + b"\n",
                                         json.dumps(dict(header, surprise=1)).encode() + b"\n"])), stream, kinds
        elif kind == "reserved":
            files[draw(st.sampled_from(["", "pkg/", "new/"])) + SHIPPED_NAME] = file_entry(MOD)
        elif kind == "legacy":
            header["legacy_project"] = draw(st.one_of(HOSTILE_PROJECTS, st.sampled_from([HONEST, "other-0123abcd"]))
                                            .filter(lambda name: name is not None))  # None: no older name, honest
        elif kind == "flag":
            header["allow_runs_in_home"] = draw(st.one_of(st.integers(), st.text(max_size=5), st.none(),
                                                          st.lists(st.booleans(), max_size=2)))
        elif kind == "plan":
            header["plan"] = draw(st.one_of(
                st.text(max_size=5), st.integers(), st.lists(st.integers(), max_size=2),
                st.fixed_dictionaries({"node": st.one_of(st.integers(max_value=-1), st.booleans(), st.text(max_size=3),
                                                         st.floats(allow_nan=False))}),
                st.fixed_dictionaries({"node": st.integers(0, 3), "rank": st.integers(0, 3)}),
                st.fixed_dictionaries({"json": st.one_of(st.integers(), st.text(max_size=3), st.none())}),
                st.dictionaries(st.sampled_from(["jsn", "nodes", "ranks", "all"]), st.integers(), min_size=1,
                                max_size=2)))
    if "cwd" in plants:
        header["cwd"] = "work/new"
    return header, stream, [*kinds, *(f"plant:{p}" for p in plants)]


@st.composite
def hostile_streams(draw: st.DrawFn) -> bytes:
    """The honest blobs with one thing wrong: cut short, a blob not asked for, sent twice, a
    size that is negative, too large or not the header's, damaged bytes, a malformed line."""
    body = HONEST_STREAM[:-len(b"END\n")]
    kind = draw(st.sampled_from(["cut", "unasked", "twice", "size", "damage", "garbage", "no_end_missing"]))
    if kind == "cut":
        return body[:draw(st.integers(0, len(body) - 1))]
    if kind == "unasked":
        extra = draw(st.binary(max_size=20))
        return _blob(extra, name=draw(st.sampled_from([sha(extra), "0" * 64]))) + body + b"END\n"
    if kind == "twice":
        return _blob(TRAIN) + body + b"END\n"
    if kind == "size":
        size = draw(st.one_of(st.integers(max_value=-1), st.integers(len(TRAIN) + 1, 10**20 - 1),
                              st.integers(0, len(TRAIN) - 1)))
        return f"{sha(TRAIN)} {size}\n".encode() + TRAIN + body + b"END\n"
    if kind == "damage":
        at = draw(st.integers(0, len(TRAIN) - 1))
        damaged = TRAIN[:at] + bytes([TRAIN[at] ^ draw(st.integers(1, 255))]) + TRAIN[at + 1:]
        return _blob(damaged, name=sha(TRAIN)) + body + b"END\n"
    if kind == "garbage":
        return draw(st.binary(min_size=1, max_size=100).filter(lambda b: b != b"END\n" and not b.startswith(b"END\n")))
    return _blob(TRAIN) + b"END\n"


def _plant(arena: Arena, what: str) -> None:
    """Links left where the receiver writes (a job or the user made them): never written through."""
    checkout = arena.checkout()
    if what == "checkout":
        if not checkout.exists() and not checkout.is_symlink():
            checkout.symlink_to(arena.victim)
        return
    if checkout.is_symlink():
        return
    checkout.mkdir(parents=True, exist_ok=True)
    name = "pkg" if what == "pkg" else "work"
    if not (checkout / name).is_symlink():
        (checkout / name).symlink_to(arena.victim)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=st.data())
def test_generated_hostile_submissions_write_nothing_outside_and_run_nothing(data: st.DataObject,
                                                                              tmp_path: Path) -> None:
    root = Path(tempfile.mkdtemp(dir=tmp_path, prefix="ex-"))
    try:
        arena = Arena(root)
        header, stream, kinds = data.draw(hostile_cases(str(root)), label="case")
        planted = [k.split(":", 1)[1] for k in kinds if k.startswith("plant:")]
        siblings = sorted(p.name for p in tmp_path.iterdir())

        def plant() -> None:
            for what in planted:
                _plant(arena, what)

        assert_refused(arena, header, stream, plant=plant)
        assert sorted(p.name for p in tmp_path.iterdir()) == siblings  # nothing beside the arena either
    finally:
        shutil.rmtree(root, ignore_errors=True)
