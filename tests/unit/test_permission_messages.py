"""Permission problems say "no permission", who owns what, and what can change it (issue 32).

A teammate reading a run folder they may not read, or cancelling a run they may not write, has
nothing damaged in front of them, and must never be told to remove or rename someone else's file.
These are real permissions: root's files seen by the user nobody (``setpriv``, so root only), and
a file of this user's own that its mode keeps from them (any user).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from orchestrator.core import fs_checks
from orchestrator.core.errors import RunNotFoundError, UsageError
from orchestrator.core.run_folder import RunFolder

needs_root = pytest.mark.skipif(not (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("setpriv")),
                                reason="drops to the user nobody with setpriv (needs root)")

#: Each case as nobody: (name, code that raises), the message printed as JSON by the driver below.
CASES = {
    "log": "fs_checks.read_file(ROOT + '/run/logs/rank-1.log', \"rank 1's log\", 'remove or rename it', "
           "RunNotFoundError)",
    "hidden": "fs_checks.read_file(ROOT + '/private/spec.yaml', 'the spec', 'remove or rename it', RunNotFoundError)",
    "append": "fs_checks.append(ROOT + '/run/logs/new.log', b'x', 'the log', 'remove or rename it')",
    "mkdir": "fs_checks.checked_dir(ROOT + '/run/sub/deeper', 'the run folder', 'remove or rename whatever is there',"
             " create=True)",
    "group": "fs_checks.read_file(ROOT + '/run/group-only.json', 'the plan', 'remove or rename it')",
    "registry": "fs_checks.read_file(ROOT + '/run/logs/rank-1.log', 'the run registry', fs_checks.REGISTRY_FIX)",
    "cancel": "ownership.request_cancel(ROOT + '/run', 'test')",
    "lock": "ownership.take(ROOT + '/run')",
}
DRIVER = """
import json, sys
from orchestrator import fs_checks, ownership
from orchestrator.core.errors import OrchestratorError, RunNotFoundError
ROOT = sys.argv[1]
out = {}
for name, code in json.loads(sys.argv[2]).items():
    try:
        exec(code)
        out[name] = None
    except OrchestratorError as exc:
        out[name] = [type(exc).__name__, str(exc)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def as_nobody() -> Iterator[dict[str, list[str] | None]]:
    """A run folder of root's (a teammate's), every case tried on it by the user nobody."""
    root = Path(tempfile.mkdtemp(prefix="orch-perm-"))  # pytest's own folders are private to root
    try:
        root.chmod(0o755)
        logs = root / "run" / "logs"
        logs.mkdir(parents=True, mode=0o755)
        (root / "run").chmod(0o755)
        logs.chmod(0o755)
        (logs / "rank-1.log").write_text("step 1\n")
        (logs / "rank-1.log").chmod(0o600)  # created under umask 077
        (root / "run" / "group-only.json").write_text("{}")
        (root / "run" / "group-only.json").chmod(0o640)  # for root's group, which nobody is not in
        (root / "private").mkdir(mode=0o700)
        (root / "private" / "spec.yaml").write_text("name: x\n")
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                              DRIVER, str(root), json.dumps(CASES)], capture_output=True, text=True, timeout=60,
                             cwd="/", env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
        assert out.returncode == 0, out.stderr
        results = json.loads(out.stdout)
        results["root"] = [str(root)]
        yield results
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _message(results: dict[str, list[str] | None], name: str, kind: str) -> str:
    got = results[name]
    assert got is not None, f"{name}: nothing was refused"
    assert got[0] == kind, got
    message = got[1]
    assert "no permission" in message and "EACCES" in message, message
    assert "remove" not in message and "rename" not in message and "damaged" not in message, message
    assert "\n" not in message, message
    return message


@needs_root
def test_another_users_unreadable_log(as_nobody: dict[str, list[str] | None]) -> None:
    root = as_nobody["root"][0]  # type: ignore[index]
    message = _message(as_nobody, "log", "RunNotFoundError")
    assert message.startswith(f"rank 1's log {root}/run/logs/rank-1.log cannot be read: no permission (EACCES); it is "
                              "owned by root (group root, mode -rw-------): ask root, its owner, to let group root "
                              f"read it (chmod g+r {root}/run/logs/rank-1.log)"), message
    assert message.endswith("and check that you are in group root (id lists yours)"), message


@needs_root
def test_a_folder_this_user_may_not_search_is_named(as_nobody: dict[str, list[str] | None]) -> None:
    root = as_nobody["root"][0]  # type: ignore[index]
    message = _message(as_nobody, "hidden", "RunNotFoundError")
    assert f"its folder {root}/private is owned by root (group root, mode drwx------)" in message, message
    assert f"chmod g+rx {root}/private" in message, message


@needs_root
def test_a_file_or_folder_that_cannot_be_created_names_the_folder_to_open_up(
        as_nobody: dict[str, list[str] | None]) -> None:
    root = as_nobody["root"][0]  # type: ignore[index]
    for name in ("append", "mkdir"):
        message = _message(as_nobody, name, "UsageError")
        assert "cannot be created: no permission" in message, message
        folder = f"{root}/run/logs" if name == "append" else f"{root}/run"
        assert f"its folder {folder} is owned by root" in message and f"write in it (chmod g+wx {folder})" in message, \
            message


@needs_root
def test_a_group_that_may_read_but_is_not_yours(as_nobody: dict[str, list[str] | None]) -> None:
    message = _message(as_nobody, "group", "UsageError")
    assert "mode -rw-r-----" in message and "you are not in its group root (id lists yours)" in message, message


@needs_root
def test_a_fix_that_moves_elsewhere_is_still_offered(as_nobody: dict[str, list[str] | None]) -> None:
    message = _message(as_nobody, "registry", "UsageError")
    assert message.endswith("; or set ORCHESTRATOR_HOME to a folder you can read and write (the registry of runs "
                            "lives there; default $HOME/.local/share/orchestrator)"), message


@needs_root
def test_cancelling_a_teammates_run_says_no_permission(as_nobody: dict[str, list[str] | None]) -> None:
    root = as_nobody["root"][0]  # type: ignore[index]
    message = _message(as_nobody, "cancel", "SubmissionError")
    assert message.startswith(f"the cancel request {root}/run/requests/cancel cannot be written: no permission "
                              f"(EACCES); its folder {root}/run is owned by root"), message
    assert f"write in it (chmod g+wx {root}/run)" in message and "ask whoever started the run to cancel it" in message
    message = _message(as_nobody, "lock", "SubmissionError")  # a teammate's `run` of the same spec
    lock = RunFolder.of(root + "/run").lock
    assert message.startswith(f"the run's lock file {lock} cannot be created: no permission (EACCES); its folder "
                              f"{root}/run is owned by root"), message


# ---- this user's own file, kept from them by its mode: any user, in this process ---------------
def test_your_own_file_says_chmod_u(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    path.write_text("x")
    path.chmod(0o200)
    why, fix = fs_checks.no_permission(path, "read", PermissionError(13, "Permission denied"))
    assert why.startswith("cannot be read: no permission (EACCES); it is owned by "), why
    assert "mode --w-------" in why and fix == f"it is yours: chmod u+r {path}", fix


def test_a_mode_that_allows_it_points_at_acls(tmp_path: Path) -> None:
    path = tmp_path / "record.json"
    path.write_text("{}")
    _, fix = fs_checks.no_permission(path, "written")
    assert fix.startswith("the mode allows it, so an ACL, a security module or the file server refuses it"), fix


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any file: see the setpriv cases")
def test_read_file_of_your_own_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text("{}")
    path.chmod(0)
    with pytest.raises(UsageError) as caught:
        fs_checks.read_file(path, "the plan", "remove or rename it")
    assert "no permission" in str(caught.value) and "remove" not in str(caught.value), caught.value


def test_a_permission_error_while_reading_is_no_permission_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file server that checks on read, not on open (NFS with root squash, FUSE): EACCES from
    read(2) on an fd that opened. Only the read is made to fail, not the open."""
    path = tmp_path / "rank-3.log"
    path.write_text("step\n")
    real_fdopen = os.fdopen

    class Refusing:
        def __init__(self, fd: int) -> None:
            self.fh = real_fdopen(fd, "rb")

        def __enter__(self) -> Refusing:
            return self

        def __exit__(self, *exc: object) -> None:
            self.fh.close()

        def read(self) -> bytes:
            raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(fs_checks.os, "fdopen", lambda fd, mode: Refusing(fd))
    with pytest.raises(RunNotFoundError) as caught:
        fs_checks.read_file(path, "rank 3's log", "remove or rename it", RunNotFoundError)
    message = str(caught.value)
    assert "cannot be read: no permission (EACCES)" in message and "remove" not in message, message
