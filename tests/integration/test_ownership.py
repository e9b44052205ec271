"""One owner per run, tried as sequences of operations on real processes.

Generated sequences of run / start-twice / cancel / status / copy the folder / symlink the record /
kill the supervisor / hang up on it / the same from another host (a PID namespace: its PIDs and
host key differ, the files and the lock are shared, as on a second node), checking after every
step: a bystander run is never touched, one live attempt per folder at most, nothing outlives
its run, and the recorded state matches what runs. Then the single cases the classes came from.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.core.records import RunRecord
from orchestrator.core.states import TERMINAL

SCRIPTS = Path(__file__).parent / "scripts"
SETTLE_S = 15.0  # the most any step may take to show its effect (stop grace included)

OTHER_HOST = shutil.which("unshare") is not None and os.geteuid() == 0


def _spec(tmp: Path, name: str, entrypoint: Path = SCRIPTS / "sleep.py", seconds: float = 300) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(json.dumps({
        "name": name, "entrypoint": str(entrypoint), "nodes": 1, "cpu_ranks_per_node": 2,
        "runs_dir": str(tmp / "runs"), "args": {"seconds": seconds}, "local": {"preload_torch": False},
    }))
    return path


def _cli(*argv: str, cwd: Path | None = None, other_host: bool = False, timeout: float = 90) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "orchestrator", *argv]
    if other_host:
        cmd = ["unshare", "--pid", "--fork", "--mount-proc", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def _procs_with(text: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as fh:
                    cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
                with open(f"/proc/{name}/stat") as fh:
                    state = fh.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if text in cmd and state not in ("Z", "X"):
                found.append(int(name))
    return found


def _ranks(name: str) -> list[int]:
    return _procs_with(f"orchestrator: {name} rank")


def _run_dir(tmp: Path, name: str) -> Path:
    found = sorted((tmp / "runs").glob(f"{name}-*"))
    assert len(found) <= 1, found
    return found[0] if found else tmp / "runs" / f"{name}-none"


def _eventually(check, what: str, within: float = SETTLE_S) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within:.0f}s: {what}")
        time.sleep(0.1)


def _state(run_dir: Path) -> str:
    return RunRecord.load(run_dir).state if (run_dir / "record.json").exists() else "NONE"


class World:
    """The model: is the target run live? And the invariants, checked after every step."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.spec = _spec(tmp, "target")
        self.live = False
        self.bystander_dir = None  # type: Path | None

    @property
    def run_dir(self) -> Path:
        return _run_dir(self.tmp, "target")

    def start_bystander(self) -> None:
        out = _cli("run", "--detach", str(_spec(self.tmp, "bystander")))
        assert out.returncode == 0, out.stderr
        self.bystander_dir = _run_dir(self.tmp, "bystander")
        _eventually(lambda: len(_ranks("bystander")) == 2, "the bystander's ranks run")
        self.bystander_ranks = sorted(_ranks("bystander"))

    # -- steps ------------------------------------------------------------------------------
    def start(self) -> None:
        out = _cli("run", "--detach", str(self.spec))
        if self.live:
            assert out.returncode != 0 and "live attempt" in out.stderr, out
        else:
            assert out.returncode == 0, out.stderr
            self.live = True
            _eventually(lambda: len(_ranks("target")) == 2, "the started run's ranks run")

    def start_twice(self) -> None:
        procs = [subprocess.Popen([sys.executable, "-m", "orchestrator", "run", "--detach", str(self.spec)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
        outs = [(p.wait(timeout=90), p.stderr.read()) for p in procs]
        started = [o for o in outs if o[0] == 0]
        assert len(started) == (0 if self.live else 1), outs
        assert all("live attempt" in err for code, err in outs if code != 0), outs
        if started:
            self.live = True
            _eventually(lambda: len(_ranks("target")) == 2, "the started run's ranks run")

    def cancel(self, other_host: bool = False) -> None:
        if not self.run_dir.exists():
            return
        out = _cli("cancel", str(self.run_dir), other_host=other_host)
        assert "Traceback" not in out.stderr, out.stderr
        if self.live:
            assert out.returncode == 0, out.stderr
            assert _state(self.run_dir) == "CANCELLED"
            self.live = False

    def cancel_elsewhere(self) -> None:
        self.cancel(other_host=True)

    def status_elsewhere(self) -> None:
        if not self.run_dir.exists():
            return
        before = _state(self.run_dir)
        out = _cli("status", str(self.run_dir), other_host=True)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        if self.live:
            assert _state(self.run_dir) == before == "RUNNING"

    def cancel_copy(self) -> None:
        if not self.run_dir.exists():
            return
        copy = self.tmp / f"copy-{time.monotonic_ns()}"
        shutil.copytree(self.run_dir, copy, symlinks=True, ignore=shutil.ignore_patterns("lock"))
        out = _cli("cancel", str(copy))
        assert "Traceback" not in out.stderr, out.stderr
        if self.live:
            assert out.returncode != 0 and "copy" in out.stderr, out

    def cancel_symlinked_record(self) -> None:
        if not self.run_dir.exists():
            return
        link = self.tmp / f"link-{time.monotonic_ns()}"
        link.mkdir()
        (link / "record.json").symlink_to(self.run_dir / "record.json")
        out = _cli("cancel", str(link))
        assert out.returncode != 0 and "symbolic link" in out.stderr and "Traceback" not in out.stderr, out

    def kill_supervisor(self, sig: int = signal.SIGKILL) -> None:
        if not self.live:
            return
        pid = RunRecord.load(self.run_dir).supervisor_pid
        assert pid
        os.kill(pid, sig)
        _eventually(lambda: not _ranks("target"), "the ranks of a killed supervisor are gone")
        self.live = False
        if sig == signal.SIGHUP:  # a hang-up stops the run in order, as a cancel does
            _eventually(lambda: _state(self.run_dir) == "CANCELLED", "a hung-up run is CANCELLED")
        else:
            out = _cli("status", str(self.run_dir))
            assert out.returncode == 0 and "FAILED" in out.stdout, out

    def hang_up(self) -> None:
        self.kill_supervisor(signal.SIGHUP)

    # -- invariants -------------------------------------------------------------------------
    def check(self) -> None:
        assert sorted(_ranks("bystander")) == self.bystander_ranks, "a bystander's rank was touched"
        assert _state(self.bystander_dir) == "RUNNING"
        supervisors = _procs_with(f"orchestrator.backends.local.executor {self.run_dir} ")
        assert len(supervisors) <= 1, f"two live supervisors of one folder: {supervisors}"
        assert len(_ranks("target")) <= 2, "two sets of ranks in one folder"
        if not self.live:
            _eventually(lambda: not _ranks("target"), "nothing outlives its run")
            assert _state(self.run_dir) in TERMINAL | {"NONE"}
        else:
            assert _state(self.run_dir) == "RUNNING"

    def finish(self) -> None:
        for name in ("target", "bystander"):
            run_dir = _run_dir(self.tmp, name)
            if run_dir.exists():
                _cli("cancel", str(run_dir))
        _eventually(lambda: not _ranks("target") and not _ranks("bystander"), "everything stopped at the end")


STEPS = ["start", "start_twice", "cancel", "cancel_copy", "cancel_symlinked_record", "kill_supervisor", "hang_up"]
STEPS += ["cancel_elsewhere", "status_elsewhere"] if OTHER_HOST else []


@settings(max_examples=int(os.environ.get("ORCH_SEQUENCE_EXAMPLES", "5")), deadline=None,
          derandomize=os.environ.get("CI") == "true",
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.sampled_from(STEPS), min_size=3, max_size=6))
def test_generated_sequences_keep_one_owner_per_run(tmp_path_factory: pytest.TempPathFactory,
                                                    steps: list[str]) -> None:
    world = World(tmp_path_factory.mktemp("own"))
    world.start_bystander()
    try:
        for step in ["start", *steps]:
            getattr(world, step)()
            world.check()
    finally:
        world.finish()


# ---- the single cases -------------------------------------------------------------------------
def test_foreground_run_stops_its_ranks_on_hangup_and_rerun_resumes_the_folder(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "fg")
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "run", str(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _eventually(lambda: len(_ranks("fg")) == 2, "the ranks run", within=60)
        proc.send_signal(signal.SIGHUP)  # the terminal closed
        proc.wait(timeout=SETTLE_S)
        assert not _ranks("fg")
        assert _state(_run_dir(tmp_path, "fg")) == "CANCELLED"
    finally:
        proc.kill()
    again = _cli("run", "--detach", str(spec))
    assert again.returncode == 0, again.stderr
    assert RunRecord.load(_run_dir(tmp_path, "fg")).attempts == 2
    _cli("cancel", str(_run_dir(tmp_path, "fg")))


def test_foreground_run_killed_takes_its_ranks_with_it(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "fgkill")
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "run", str(spec)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _eventually(lambda: len(_ranks("fgkill")) == 2, "the ranks run", within=60)
    proc.kill()
    proc.wait()
    _eventually(lambda: not _ranks("fgkill"), "ranks gone after their supervisor's SIGKILL", within=10)
    out = _cli("status", str(_run_dir(tmp_path, "fgkill")))
    assert "FAILED" in out.stdout and "supervisor" in out.stdout, out


def test_killed_zygote_is_reported_as_such_and_blames_no_rank(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "zyg")
    assert _cli("run", "--detach", str(spec)).returncode == 0
    run_dir = _run_dir(tmp_path, "zyg")
    _eventually(lambda: len(_ranks("zyg")) == 2, "the ranks run", within=60)
    zygote = [p for p in _procs_with("orchestrator.backends.local.zygote")
              if open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] ==
              str(RunRecord.load(run_dir).supervisor_pid)]
    assert len(zygote) == 1
    os.kill(zygote[0], signal.SIGKILL)
    _eventually(lambda: _state(run_dir) in TERMINAL, "the run ends")
    rec = RunRecord.load(run_dir)
    assert rec.state == "FAILED" and rec.failed_rank is None, rec
    assert "launcher process" in (rec.error or "") and "SIGKILL" in (rec.error or ""), rec.error
    _eventually(lambda: not _ranks("zyg"), "the ranks went with the zygote", within=10)


def test_run_from_a_worker_thread_is_cancelled_without_signalling_the_caller(tmp_path: Path) -> None:
    from orchestrator import Run, load_spec, run

    spec = load_spec(_spec(tmp_path, "thread"))
    ended: dict[str, object] = {}
    caught: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: caught.append(s))
    try:
        worker = threading.Thread(target=lambda: ended.setdefault("run", run(spec)))
        worker.start()
        _eventually(lambda: len(_ranks("thread")) == 2, "the ranks run", within=60)
        assert Run.get(str(_run_dir(tmp_path, "thread"))).cancel() == "CANCELLED"
        worker.join(timeout=SETTLE_S)
        assert not worker.is_alive()
        assert ended["run"].state == "CANCELLED"  # type: ignore[attr-defined]
        assert not caught, "cancel signalled the process that called run()"
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_stacks_never_kills_a_rank_that_exec_d_another_program(tmp_path: Path) -> None:
    script = tmp_path / "execs.py"
    script.write_text("import os, sys\nos.execv(sys.executable, [sys.executable, '-c', "
                      "'import time; time.sleep(300)', 'orchestrator: execs rank'])\n")
    spec = _spec(tmp_path, "execs", entrypoint=script)
    assert _cli("run", "--detach", str(spec)).returncode == 0
    run_dir = _run_dir(tmp_path, "execs")
    # The exec'd programs only: a rank still before its exec carries the same name in its title, and
    # during the exec its cmdline reads empty (a snapshot then missed one rank: CI, 2026-12-06).
    execd = lambda: sorted(_procs_with("time.sleep(300) orchestrator: execs rank"))  # noqa: E731
    _eventually(lambda: len(execd()) == 2, "the exec'd ranks run", within=60)
    before = execd()
    out = _cli("stacks", str(run_dir))
    assert "Traceback" not in out.stderr, out.stderr
    time.sleep(1)
    assert execd() == before, "stacks killed a rank"
    assert _state(run_dir) == "RUNNING"
    _cli("cancel", str(run_dir))


def test_our_processes_never_import_from_the_users_directory(tmp_path: Path) -> None:
    """A json.py and a typing.py where the user runs the CLI: neither the zygote, the detached
    supervisor nor the launcher imports them; the user's own module there is still found."""
    cwd = tmp_path / "project"
    cwd.mkdir()
    marker = tmp_path / "hijacked"
    for name in ("json", "typing", "signal"):
        (cwd / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write('{name} ' + __import__('os').getcwd())\n"
                                        "raise SystemExit('hijacked')\n")
    (cwd / "mymod.py").write_text("def main(argv):\n    return 'found'\n")
    for preload in (True, False):
        spec = cwd / f"spec-{preload}.yaml"
        spec.write_text(json.dumps({"name": f"cwd{int(preload)}", "entrypoint": "mymod:main", "nodes": 1,
                                    "cpu_ranks_per_node": 2, "runs_dir": str(tmp_path / "runs"),
                                    "local": {"preload_torch": preload}}))
        orchestrator = str(Path(sys.executable).parent / "orchestrator")
        out = subprocess.run([orchestrator, "run", spec.name], cwd=cwd, capture_output=True, text=True, timeout=300)
        assert not marker.exists(), marker.read_text()
        assert out.returncode == 0 and "result: found" in out.stdout, out.stdout + out.stderr
        detached = subprocess.run([orchestrator, "run", "--detach", spec.name], cwd=cwd,
                                  capture_output=True, text=True, timeout=120)
        assert detached.returncode == 0, detached.stderr
        run_dir = _run_dir(tmp_path, f"cwd{int(preload)}")
        _eventually(lambda: _state(run_dir) in TERMINAL, "the detached run ends", within=120)
        assert not marker.exists(), marker.read_text()
        assert _state(run_dir) == "COMPLETED"
