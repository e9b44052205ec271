"""Generated hostile environments (hypothesis), not a list of them.

Whatever ``ORCHESTRATOR_HOME``, ``$HOME``, the registry, the current folder or a run folder
is (a FIFO or a device where a file belongs, a file where a folder belongs, /proc, a dangling
symbolic link or a loop, unreadable, read-only, full, a folder whose name is not UTF-8, a
folder that was deleted), every command ends with its output or with ONE line naming the path
and the fix (exit 1 or 2): never a traceback, never a hang.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core import fs_checks
from orchestrator.core.errors import OrchestratorError
from orchestrator.core.records import RunRecord, register, registered_runs

from tests.unit.test_hostile_input import SETTINGS, anything, cli

ROOT = Path(__file__).resolve().parents[2]
CONSOLE = Path(sys.executable).parent / "orchestrator"
SPEC = ROOT / "orchestrator" / "examples" / "demo.yaml"
#: Each example of these starts a process or two: fewer of them.
FEW = settings(SETTINGS, max_examples=min(SETTINGS.max_examples, 12))


class Hung(BaseException):
    """Not an Exception: nothing under test may catch it."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """A command that blocks (on a FIFO, say) fails the test instead of hanging it."""
    def boom(*_: object) -> None:
        raise Hung(f"still running after {seconds}s")

    old = signal.signal(signal.SIGALRM, boom)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def environ(**values: str | None) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def one_line(code: int, err: str, *, codes: tuple[int, ...] = (1, 2)) -> str:
    assert code in codes, f"exit {code}: {err[-2000:]}"
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"not one line: {err!r}"
    return lines[0]


# ---- 1. the registry's home, $HOME and registry.jsonl ------------------------------------------
FOLDER_KINDS = ["file", "fifo", "device", "proc", "dangling", "loop"]
REGISTRY_KINDS = ["reg-folder", "reg-fifo", "reg-device", "reg-proc", "reg-dangling", "reg-loop"]


def _make_bad(base: Path, kind: str) -> None:
    """Make ``base`` (which does not exist yet) the kind of thing asked for."""
    if kind == "file":
        base.write_text("not a folder")
    elif kind == "fifo":
        os.mkfifo(base)
    elif kind == "device":
        base.symlink_to("/dev/zero" if base.name == "registry.jsonl" else "/dev/null")
    elif kind == "proc":
        base.symlink_to("/proc/self/status" if base.name == "registry.jsonl" else "/proc/self")
    elif kind == "dangling":
        base.symlink_to(base.parent / "nowhere")
    elif kind == "loop":
        base.symlink_to(base.parent / (base.name + ".2"))
        (base.parent / (base.name + ".2")).symlink_to(base)
    elif kind == "folder":
        base.mkdir()
    else:
        raise AssertionError(kind)


def _hostile_home(tmp: Path, kind: str, depth: int, via_home: bool) -> tuple[dict[str, str | None], Path]:
    """The environment to run under, and the path an error must name."""
    base = tmp / "base"
    if kind in FOLDER_KINDS:
        _make_bad(base, kind)
        folder, culprit = base.joinpath(*["sub"] * depth), base
    else:
        folder = base.joinpath(*["sub"] * depth)
        folder.mkdir(parents=True)
        culprit = folder / "registry.jsonl"
        _make_bad(culprit, kind.removeprefix("reg-"))
    if not via_home:
        return {"ORCHESTRATOR_HOME": str(folder), "HOME": str(tmp)}, culprit
    if kind in FOLDER_KINDS:
        return {"ORCHESTRATOR_HOME": None, "HOME": str(folder)}, culprit
    # the registry folder is $HOME/.local/share/orchestrator: move the damage there
    home = tmp / "home"
    reg_folder = home / ".local" / "share" / "orchestrator"
    reg_folder.parent.mkdir(parents=True)
    shutil.move(str(folder), str(reg_folder))
    if kind in ("reg-dangling", "reg-loop"):  # the links name the folder they were made in: make them again
        (reg_folder / "registry.jsonl").unlink()
        for leftover in reg_folder.glob("registry.jsonl*"):
            leftover.unlink()
        _make_bad(reg_folder / "registry.jsonl", kind.removeprefix("reg-"))
    return {"ORCHESTRATOR_HOME": None, "HOME": str(home)}, reg_folder / "registry.jsonl"


@SETTINGS
@given(kind=st.sampled_from(FOLDER_KINDS + REGISTRY_KINDS), depth=st.integers(0, 2), via_home=st.booleans())
def test_a_hostile_registry_home_is_one_line_naming_it(tmp_path_factory: pytest.TempPathFactory, kind: str,
                                                       depth: int, via_home: bool) -> None:
    tmp = tmp_path_factory.mktemp("env")
    env, culprit = _hostile_home(tmp, kind, depth, via_home)
    with environ(**env):
        for argv in (["list"], ["status"], ["status", "--json"], ["status", "some-run"], ["logs", "some-run"]):
            with deadline(5):
                code, out, err, _ = cli(*argv)
            line = one_line(code, err)
            assert str(culprit) in line and "ORCHESTRATOR_HOME" in line, line
        record = RunRecord(run_id="r-0", run_dir=str(tmp / "run"), executor="local")
        with deadline(5), pytest.raises(OrchestratorError) as caught:
            register(record)
        message = str(caught.value)
        assert "\n" not in message and str(culprit) in message and "ORCHESTRATOR_HOME" in message, message


def test_a_registry_home_that_does_not_exist_yet_is_empty_then_created(tmp_path: Path) -> None:
    with environ(ORCHESTRATOR_HOME=str(tmp_path / "a" / "b")):
        assert registered_runs() == []
        code, out, err, _ = cli("list")
        assert code == 0 and "no runs registered yet" in out, err
        register(RunRecord(run_id="r-1", run_dir=str(tmp_path / "run"), executor="local"))
        assert [e["run_id"] for e in registered_runs()] == ["r-1"]


@pytest.mark.parametrize("value", ["relative/home", "."])
def test_a_relative_orchestrator_home_is_refused(value: str) -> None:
    with environ(ORCHESTRATOR_HOME=value):
        code, _, err, _ = cli("list")
    line = one_line(code, err)
    assert "ORCHESTRATOR_HOME" in line and "absolute" in line, line


FAULTS = [errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ENAMETOOLONG]


_REAL_OS = {"mkdir": os.mkdir, "open": os.open, "write": os.write}


@SETTINGS
@given(err=st.sampled_from(FAULTS), where=st.sampled_from(["mkdir", "open", "write"]), fresh=st.booleans())
def test_a_registry_that_cannot_be_written_is_one_line(tmp_path_factory: pytest.TempPathFactory, err: int, where: str,
                                                        fresh: bool) -> None:
    """Read-only, full, over quota, failing: register() says which path and what to do."""
    fresh = fresh or where == "mkdir"  # an existing folder is not made again
    home = tmp_path_factory.mktemp("home") / ("new" if fresh else "")
    registry_fds: set[int] = set()

    def mkdir(path: object, *a: object, **k: object) -> None:
        if where == "mkdir" and str(home) in os.fsdecode(path):  # type: ignore[arg-type]
            raise OSError(err, os.strerror(err), path)
        _REAL_OS["mkdir"](path, *a, **k)

    def open_(path: object, flags: int, *a: object, **k: object) -> int:
        fd: int
        if str(path).endswith("registry.jsonl") and flags & (os.O_WRONLY | os.O_RDWR):
            if where == "open":
                raise OSError(err, os.strerror(err), path)
            fd = _REAL_OS["open"](path, flags, *a, **k)
            registry_fds.add(fd)
            return fd
        fd = _REAL_OS["open"](path, flags, *a, **k)
        return fd

    def write(fd: int, data: bytes) -> int:
        if where == "write" and fd in registry_fds:
            raise OSError(err, os.strerror(err))
        n: int = _REAL_OS["write"](fd, data)
        return n

    fakes = {"mkdir": mkdir, "open": open_, "write": write}
    try:
        for name, fake in fakes.items():
            setattr(os, name, fake)
        with environ(ORCHESTRATOR_HOME=str(home)), pytest.raises(OrchestratorError) as caught:
            register(RunRecord(run_id="r-2", run_dir=str(home / "run"), executor="local"))
    finally:
        for name, real in _REAL_OS.items():
            setattr(os, name, real)
    message = str(caught.value)
    assert "\n" not in message and str(home) in message and "ORCHESTRATOR_HOME" in message, message
    assert errno.errorcode[err] in message, message


def _as_nobody(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=60)


needs_root = pytest.mark.skipif(not (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("setpriv")),
                                reason="drops to another user with setpriv (needs root)")


@needs_root
def test_an_unreadable_or_read_only_registry_for_another_user(request: pytest.FixtureRequest) -> None:
    """Real permissions, not injected faults: a registry folder of root's, seen by nobody."""
    tmp_path = Path(tempfile.mkdtemp(prefix="orch-perm-"))  # pytest's own is private to root
    request.addfinalizer(lambda: shutil.rmtree(tmp_path, ignore_errors=True))
    tmp_path.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    (home / "registry.jsonl").write_text(json.dumps({"run_id": "a", "run_dir": "/nowhere"}) + "\n")
    (home / "registry.jsonl").chmod(0o600)
    env = {**os.environ, "ORCHESTRATOR_HOME": str(home), "HOME": str(tmp_path)}
    out = _as_nobody([str(CONSOLE), "list"], env, tmp_path)
    line = one_line(out.returncode, out.stderr)
    assert str(home / "registry.jsonl") in line and "EACCES" in line and "ORCHESTRATOR_HOME" in line, line
    (home / "registry.jsonl").chmod(0o644)  # readable, but its folder and itself are root's
    code = ("import sys\nfrom orchestrator.core.records import RunRecord, register\nfrom orchestrator.core.errors import "
            "OrchestratorError\ntry:\n    register(RunRecord(run_id='b', run_dir='/nowhere', executor='local'))\n"
            "except OrchestratorError as exc:\n    print(exc, file=sys.stderr)\n    sys.exit(exc.exit_code)\n")
    out = _as_nobody([sys.executable, "-c", code], env, tmp_path)
    line = one_line(out.returncode, out.stderr)
    assert str(home / "registry.jsonl") in line and "EACCES" in line and "ORCHESTRATOR_HOME" in line, line
    out = _as_nobody([sys.executable, "-c", code], {**env, "ORCHESTRATOR_HOME": str(home / "new")}, tmp_path)
    line = one_line(out.returncode, out.stderr)  # a registry folder nobody may create
    assert str(home / "new") in line and "EACCES" in line and "ORCHESTRATOR_HOME" in line, line


# ---- 2. the current folder: not UTF-8, or deleted ---------------------------------------------------
def _console(argv: list[str], cwd: bytes, strict: bool) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ}
    if strict:  # what a terminal under en_US.UTF-8 gives Python: strict UTF-8 on stdout
        env["PYTHONIOENCODING"] = "utf-8:strict"
    else:
        env.pop("PYTHONIOENCODING", None)
        env["LC_ALL"] = "C.UTF-8"
    return subprocess.run([str(CONSOLE), *argv], cwd=cwd, env=env, capture_output=True, timeout=60)


#: Folder names that are not valid UTF-8: stray bytes, a cut sequence, an encoded surrogate.
not_utf8_names = (
    st.lists(st.one_of(st.binary(min_size=1, max_size=4), st.sampled_from([b"\xff", b"\xc3(", b"\xed\xa0\x80"])),
             min_size=1, max_size=3)
    .map(lambda parts: b"".join(parts).replace(b"/", b"_").replace(b"\0", b"_"))
    .filter(lambda b: b not in (b".", b"..") and not _utf8(b))
)


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


CWD_COMMANDS = [["validate", str(SPEC)], ["validate", "spec.yaml"], ["plan", str(SPEC)], ["plan", "--json", str(SPEC)],
                ["list"], ["status"], ["status", "--json"], ["status", "no-such-run"]]


@FEW
@given(name=not_utf8_names, argv=st.sampled_from(CWD_COMMANDS), strict=st.booleans())
def test_a_current_folder_whose_name_is_not_utf8(tmp_path_factory: pytest.TempPathFactory, name: bytes,
                                                 argv: list[str], strict: bool) -> None:
    cwd = os.fsencode(tmp_path_factory.mktemp("cwd")) + b"/" + name
    os.mkdir(cwd)
    shutil.copy(SPEC, os.path.join(cwd, b"spec.yaml"))
    out = _console(argv, cwd, strict)
    err = out.stderr.decode(errors="replace")
    if argv == ["status", "no-such-run"]:
        one_line(out.returncode, err, codes=(1,))
        return
    assert out.returncode == 0 and "Traceback" not in err, err[-3000:]
    if argv[:2] == ["plan", "--json"]:
        plan = json.loads(out.stdout)
        assert os.fsencode(plan["payload"]["workdir"]) == cwd  # the folder's own bytes, through JSON
    elif argv[0] == "plan":
        for part in re.split(rb"[\x00-\x1f\x7f]+", name):  # its own bytes, as ls shows them (rich drops controls)
            assert part in out.stdout


@FEW
@given(argv=st.sampled_from(CWD_COMMANDS + [["run", str(SPEC)], ["submit", str(SPEC)], ["report", "x"]]),
       strict=st.booleans())
def test_a_current_folder_that_was_deleted(tmp_path_factory: pytest.TempPathFactory, argv: list[str],
                                           strict: bool) -> None:
    cwd = tmp_path_factory.mktemp("gone")
    proc = subprocess.Popen(["sh", "-c", f'cd "{cwd}" && rmdir "{cwd}" && exec "$0" "$@"', str(CONSOLE), *argv],
                            env={**os.environ, **({"PYTHONIOENCODING": "utf-8:strict"} if strict else {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)
    if proc.returncode == 0:
        assert argv[0] in ("validate", "list", "status") and "Traceback" not in err, err
        return
    line = one_line(proc.returncode, err)
    if argv[0] == "plan" or argv == ["validate", "spec.yaml"]:
        assert "current folder" in line and "cd " in line, line


# ---- 3. damaged run folders ----------------------------------------------------------------------------
DAMAGE = ["record-folder", "record-fifo", "record-loop", "logs-file", "log-folder", "log-fifo", "metrics-fifo"]
RUN_ID = "damaged-0123abcd"


def _damaged_run(tmp: Path, damage: str, state: str) -> tuple[Path, Path]:
    """A registered run folder with one part damaged; returns (run folder, damaged path)."""
    run_dir = tmp / "run"
    run_dir.mkdir()
    RunRecord(run_id=RUN_ID, run_dir=str(run_dir), executor="local", state=state, world_size=2,
              created=time.time() - 3600).save()
    home = Path(os.environ["ORCHESTRATOR_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "registry.jsonl", "a") as fh:
        fh.write(json.dumps({"run_id": RUN_ID, "run_dir": str(run_dir)}) + "\n")
    record, logs = run_dir / "record.json", run_dir / "logs"
    if damage.startswith("record"):
        record.unlink()
        {"record-folder": record.mkdir, "record-fifo": lambda: os.mkfifo(record),
         "record-loop": lambda: record.symlink_to(record)}[damage]()
        return run_dir, record
    if damage == "logs-file":
        logs.write_text("not a folder")
        return run_dir, logs
    if damage == "metrics-fifo":
        (run_dir / "metrics").mkdir()
        os.mkfifo(run_dir / "metrics" / "rank-0.jsonl")
        return run_dir, run_dir / "metrics" / "rank-0.jsonl"
    logs.mkdir()
    log = logs / "rank-0.log"
    log.mkdir() if damage == "log-folder" else os.mkfifo(log)
    return run_dir, log


@SETTINGS
@given(damage=st.sampled_from(DAMAGE), state=st.sampled_from(["COMPLETED", "FAILED", "RUNNING"]),
       argv=st.sampled_from([["status", RUN_ID], ["status", "{dir}"], ["list"], ["status"], ["status", "--json"],
                             ["logs", RUN_ID], ["logs", "-f", RUN_ID], ["logs", "{dir}", "--rank", "0"],
                             ["cancel", RUN_ID], ["report", RUN_ID]]))
def test_a_damaged_run_folder_is_one_line_or_skipped(tmp_path_factory: pytest.TempPathFactory, damage: str,
                                                     state: str, argv: list[str]) -> None:
    tmp = tmp_path_factory.mktemp("damaged")
    with environ(ORCHESTRATOR_HOME=str(tmp / "home")):
        run_dir, damaged = _damaged_run(tmp, damage, state)
        argv = [a.replace("{dir}", str(run_dir)) for a in argv]
        with deadline(10):
            code, out, err, seconds = cli(*argv)
    assert seconds < 8
    record_damage = damage.startswith("record")
    if argv[0] == "list" or argv in (["status"], ["status", "--json"]):
        assert code == 0, err
        if record_damage:  # skipped, with a warning that names it
            line = one_line(1, err)
            assert line.startswith("warning: skipping") and str(damaged) in line, line
        return
    if record_damage or argv[0] == "logs" or argv[0] == "report":
        line = one_line(code, err)
        assert str(damaged) in line or str(run_dir) in line, line
    else:
        assert code in (0, 1, 2) and "Traceback" not in err and len(err.strip().splitlines()) <= 1, err


plan_contents = st.one_of(
    st.sampled_from(["fifo", "folder"]),
    st.binary(max_size=100),
    anything.map(lambda v: json.dumps(v).encode()),
    st.lists(st.fixed_dictionaries({"index": anything, "args": anything}), max_size=3)
    .map(lambda sweep: json.dumps({"sweep": sweep}).encode()),
)


@SETTINGS
@given(plan=plan_contents, error=st.sampled_from(["", " ", "\n\n", "boom\nline 2"]))
def test_status_of_a_sweep_whose_plan_is_damaged(tmp_path_factory: pytest.TempPathFactory, plan: str | bytes,
                                                 error: str) -> None:
    """The sweep grid reads plan.json: a FIFO, a folder or any content there, and any recorded error."""
    tmp = tmp_path_factory.mktemp("sweep")
    run_dir = tmp / "run"
    run_dir.mkdir()
    RunRecord(run_id=RUN_ID, run_dir=str(run_dir), executor="local", state="FAILED", sweep_size=2, error=error,
              point_states={"0": "COMPLETED", "1": "FAILED"}).save()
    if plan == "fifo":
        os.mkfifo(run_dir / "plan.json")
    elif plan == "folder":
        (run_dir / "plan.json").mkdir()
    else:
        (run_dir / "plan.json").write_bytes(plan)  # type: ignore[arg-type]
    with deadline(5):
        code, out, err, _ = cli("status", str(run_dir))
    assert code == 0 and "Traceback" not in err and "sweep: 1 COMPLETED, 1 FAILED" in out, out + err


# ---- 4. what escapes a subcommand ---------------------------------------------------------------------
hostile_names = st.one_of(st.none(), st.text(max_size=30), st.just("a" * 5000), st.just("x\ny\x1b[31m"),
                          st.binary(max_size=12).map(os.fsdecode))


@SETTINGS
@given(err=st.sampled_from(FAULTS + [errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.EMFILE]), name=hostile_names,
       exc_type=st.sampled_from([OSError, PermissionError, FileNotFoundError, IsADirectoryError]))
def test_an_os_error_escaping_a_subcommand_is_one_line(monkeypatch: pytest.MonkeyPatch, err: int, name: str | None,
                                                       exc_type: type[OSError]) -> None:
    import orchestrator.front.operations

    def status(*_: object, **__: object) -> int:
        raise exc_type(err, os.strerror(err), name) if name is not None else exc_type(err, os.strerror(err))

    monkeypatch.setattr(orchestrator.front.operations, "status", status)
    code, out, stderr, _ = cli("status")
    line = one_line(code, stderr, codes=(1,))
    assert errno.errorcode[err] in line and len(line) < 1000 and "\x1b" not in line, line
    if name:
        assert fs_checks.shown(name)[:40] in line, line


def test_a_programming_error_is_still_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    import orchestrator.front.operations

    def status(*_: object, **__: object) -> int:
        raise KeyError("a bug")

    monkeypatch.setattr(orchestrator.front.operations, "status", status)
    with pytest.raises(KeyError):
        cli("status")


_CUT_SHORT = """
import sys
from orchestrator import cli
def loud(args):
    for i in range(200000):
        print(f"line {i}")
    return CODE
cli.cmd_status = loud
sys.argv = ["orchestrator", "status"]
cli.console_main()
"""


@pytest.mark.parametrize("code", [0, 1, 3])
def test_a_reader_that_stops_early_does_not_hide_the_exit_code(code: int) -> None:
    """`orchestrator status | head -1`: the command's own exit code, and no noise on stderr."""
    proc = subprocess.Popen([sys.executable, "-c", _CUT_SHORT.replace("CODE", str(code))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"line 0\n"
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == code, err
    assert "Traceback" not in err and "Exception ignored" not in err and not err.strip(), err


def test_a_real_status_piped_into_head(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    lines = []
    for i in range(300):
        run_dir = tmp_path / f"run-{i}"
        run_dir.mkdir()
        RunRecord(run_id=f"r-{i:04d}", run_dir=str(run_dir), executor="local", state="COMPLETED",
                  error="x" * 200).save()
        lines.append(json.dumps({"run_id": f"r-{i:04d}", "run_dir": str(run_dir)}))
    (home / "registry.jsonl").write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen([str(CONSOLE), "status", "--json"], env={**os.environ, "ORCHESTRATOR_HOME": str(home)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and not err.strip(), err


@pytest.mark.parametrize("size", [2_000, 2_000_000])
def test_logs_follow_stops_when_its_reader_does(tmp_path: Path, size: int) -> None:
    """`orchestrator logs -f RUN | head`: a follow nobody reads ends, it does not go on for hours."""
    home = tmp_path / "home"
    home.mkdir()
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / "rank-0.log").write_bytes(b"x" * 80 + b"\n" * size)
    RunRecord(run_id="live-1", run_dir=str(run_dir), executor="local", state="RUNNING").save()
    (home / "registry.jsonl").write_text(json.dumps({"run_id": "live-1", "run_dir": str(run_dir)}) + "\n")
    proc = subprocess.Popen([str(CONSOLE), "logs", "-f", "live-1"], env={**os.environ, "ORCHESTRATOR_HOME": str(home)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()
    try:
        code = proc.wait(timeout=20)
    finally:
        proc.kill()
    err = proc.stderr.read().decode()
    assert code == 0 and "Traceback" not in err, err
