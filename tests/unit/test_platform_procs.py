"""Process bookkeeping where /proc is missing: psutil's table (what macOS uses) checked against
/proc's on the same processes, the degraded table (neither) never confirming a PID, the stack
request's choices on each, and the pipe that ends a rank whose launcher is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Iterator

import pytest

from orchestrator.core import ownership, platform_caps, procs
from orchestrator.node import stack_requests
from tests.integration.macos_standin import REPO



@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen]:
    """A child in a session of its own, with a child of its own in its group."""
    proc = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print('ok', flush=True); time.sleep(60)")], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ok"
    yield proc
    procs.signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def _choose(monkeypatch: pytest.MonkeyPatch, table: procs.ProcessTable) -> None:
    """Use ``table`` in this process as the platform's (``procs.table`` is otherwise chosen once)."""
    monkeypatch.setattr(procs, "table", lambda: table)


def test_psutil_reads_what_proc_reads(sleeper: subprocess.Popen) -> None:
    proc_fs, ps = procs.ProcFS(), procs.PsutilTable()
    a, b = proc_fs.stat(sleeper.pid), ps.stat(sleeper.pid)
    assert a is not None and b is not None
    assert (a.ppid, a.pgid, a.sid) == (b.ppid, b.pgid, b.sid) == (os.getpid(), sleeper.pid, sleeper.pid)
    assert b.state not in ("Z", "X") and b.start == ps.stat(sleeper.pid).start  # stable: an identity
    assert ps.cmdline(sleeper.pid) == proc_fs.cmdline(sleeper.pid)
    assert sleeper.pid in ps.pids()
    members = {st.pid for st in map(ps.stat, ps.pids()) if st is not None and st.sid == sleeper.pid}
    assert len(members) == 2 and sleeper.pid in members  # the sleeper and its child
    assert ps.catches(sleeper.pid, signal.SIGTERM) is None  # psutil cannot see handlers: it says so
    assert ps.stat(2**22) is None and ps.cmdline(2**22) == []


def test_psutil_sees_a_zombie_as_ended() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while procs.ProcFS().stat(child.pid).state != "Z":  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    try:
        assert procs.PsutilTable().stat(child.pid).state == "Z"  # type: ignore[union-attr]
    finally:
        child.wait()


def test_identity_checks_through_psutil(sleeper: subprocess.Popen, monkeypatch: pytest.MonkeyPatch) -> None:
    """What macOS runs: a recorded (pid, start) is signalled only while it still matches."""
    _choose(monkeypatch, procs.PsutilTable())
    assert procs.can_identify() and not procs.can_see_handlers()
    start = procs.start_time(sleeper.pid)
    assert start is not None and procs.same_process(sleeper.pid, start) and procs.alive(sleeper.pid)
    assert not procs.same_process(sleeper.pid, start + 1)
    assert not procs.signal_if_same(sleeper.pid, start + 1, signal.SIGTERM)
    assert sorted(procs.session_members(sleeper.pid, start)) == sorted(procs.group_members(sleeper.pid))
    assert len(procs.session_members(sleeper.pid, start)) == 2
    assert procs.session_members(sleeper.pid, start + 1) == []  # another process with that number: not ours
    assert procs.signal_session(sleeper.pid, start, signal.SIGKILL) == 2
    sleeper.wait(timeout=10)
    assert not procs.same_process(sleeper.pid, start)


def test_without_a_table_no_pid_is_ever_confirmed(sleeper: subprocess.Popen, monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither /proc nor psutil: a PID may name anything, so nothing is signalled by PID; whether
    a PID exists is all that can be said (alive), and a process group still answers for itself."""
    _choose(monkeypatch, procs.NoTable())
    assert not procs.can_identify()
    assert procs.start_time(sleeper.pid) is None
    assert procs.alive(sleeper.pid) and not procs.alive(2**22)
    assert not procs.same_process(sleeper.pid, None)
    assert not procs.signal_if_same(sleeper.pid, None, signal.SIGKILL)
    assert procs.session_members(sleeper.pid, 0) == [] and procs.descendants(os.getpid()) == []
    assert sleeper.poll() is None
    assert procs.group_alive(sleeper.pid)
    assert procs.signal_group(sleeper.pid, signal.SIGKILL)
    sleeper.wait(timeout=10)
    deadline = time.monotonic() + 10
    while procs.group_alive(sleeper.pid):  # its child is reparented, killed, reaped by init
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not procs.signal_group(sleeper.pid, signal.SIGKILL)


def test_signal_names_without_realtime_signals(monkeypatch: pytest.MonkeyPatch) -> None:
    number = int(signal.SIGRTMIN) + 4
    assert procs.signal_name(number) == "SIGRTMIN+4"
    monkeypatch.delattr(signal, "SIGRTMIN")
    monkeypatch.delattr(signal, "SIGRTMAX")
    assert procs.signal_name(number) == f"signal {number}" and procs.signal_name(int(signal.SIGURG)) == "SIGURG"


def _rank_like(tmp_path: Path, signum: int, with_handler: bool = True, table: str = "ProcFS") -> subprocess.Popen:
    """A process that records itself as rank 0 of ``tmp_path`` the way the launcher does, listening
    for ``signum`` (or, ``with_handler=False``, recording the signal without a handler), its start
    time read through ``table`` (procs.ProcFS or procs.PsutilTable: the one the reader uses)."""
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(f"""
        import faulthandler, json, os, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from orchestrator import ownership, procs
        from orchestrator.core.records import write_json_atomic
        from orchestrator.node.stack_requests import live_path, rank_record_path
        fh = open(live_path({str(tmp_path)!r}, 0), "a")
        if {with_handler!r}:
            faulthandler.register({signum}, file=fh, all_threads=True, chain=False)
        write_json_atomic(rank_record_path({str(tmp_path)!r}, 0), {{
            "rank": 0, "host": os.uname().nodename, "host_key": ownership.this_host(), "pid": os.getpid(),
            "start_ticks": procs.{table}().stat(os.getpid()).start, "stack_signal": {signum}}})
        def waiting_here():
            print("ok", flush=True)
            while True:
                time.sleep(0.01)
        waiting_here()
    """))
    live = stack_requests.live_path(tmp_path, 0)
    live.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ok"
    return proc


def test_sigurg_dumps_stacks_and_leaves_a_process_without_the_handler_alone(tmp_path: Path) -> None:
    """macOS's stack signal, for real: faulthandler answers it, and a process without the handler
    (one that exec'd another program) is not hurt by it, which is why it may be sent where no
    one can tell whether the handler is still there."""
    rank = _rank_like(tmp_path, int(signal.SIGURG))
    try:
        dumps = stack_requests.request_local(tmp_path)
        assert "waiting_here" in dumps[0] and rank.poll() is None
    finally:
        rank.kill()
        rank.wait()
    deaf = subprocess.Popen([sys.executable, "-c", "import time; print('ok', flush=True); time.sleep(30)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert deaf.stdout is not None and deaf.stdout.readline().strip() == "ok"
        os.kill(deaf.pid, signal.SIGURG)
        time.sleep(0.3)
        assert deaf.poll() is None
    finally:
        deaf.kill()
        deaf.wait()


def test_stack_requests_where_handlers_cannot_be_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """psutil's table (macOS): SIGURG is sent (harmless without the handler); a rank that lost its
    handler is asked, stays alive, and is said to be silent for a reason this system cannot
    see; a signal whose default action kills is refused, saying why; a rank that is gone has ended."""
    from types import SimpleNamespace

    from orchestrator.front.run_stacks import _silence

    _choose(monkeypatch, procs.PsutilTable())
    monkeypatch.setattr(platform_caps, "stack_signal", lambda: platform_caps.StackSignal(
        int(signal.SIGURG), "SIGURG", harmless=True))
    rank = _rank_like(tmp_path, int(signal.SIGURG), table="PsutilTable")
    try:
        dumps, refused = stack_requests.request_local_explained(tmp_path)
        assert "waiting_here" in dumps[0] and refused == {}
    finally:
        rank.kill()
        rank.wait()
    rank = _rank_like(tmp_path, int(signal.SIGURG), with_handler=False, table="PsutilTable")
    try:
        dumps, refused = stack_requests.request_local_explained(tmp_path, timeout_s=0.5)
        assert dumps == {0: ""} and refused == {} and rank.poll() is None
        why = _silence(SimpleNamespace(executor="local"), stack_requests.rank_procs(tmp_path)[0], 0.5)  # type: ignore[arg-type]
        assert why.startswith("asked, silent for 0.5s: this system cannot tell"), why
    finally:
        rank.kill()
        rank.wait()
    harmful = int(signal.SIGRTMIN) + 4
    rank = _rank_like(tmp_path, harmful, table="PsutilTable")
    try:
        dumps, refused = stack_requests.request_local_explained(tmp_path)
        assert dumps == {} and "would end a process without it" in refused[0] and rank.poll() is None
    finally:
        rank.kill()
        rank.wait()
    assert stack_requests.request_local_explained(tmp_path)[1] == {0: stack_requests.ENDED}


def test_stack_requests_without_a_table_say_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rank = _rank_like(tmp_path, int(signal.SIGURG))
    try:
        _choose(monkeypatch, procs.NoTable())
        dumps, refused = stack_requests.request_local_explained(tmp_path)
        assert dumps == {} and refused == {0: stack_requests.UNCONFIRMED}
        assert "pip install psutil" in stack_requests.UNCONFIRMED
        before = stack_requests.live_path(tmp_path, 0).stat().st_size
        from orchestrator.node import forensics

        assert forensics.capture_local(tmp_path, "a test") == {}
        saved = (tmp_path / "stacks" / "rank-0.txt").read_text()
        assert "not asked" in saved and "pip install psutil" in saved  # the saved stacks say why there are none
        assert stack_requests.live_path(tmp_path, 0).stat().st_size == before  # nothing was sent
    finally:
        rank.kill()
        rank.wait()


def test_the_rank_records_the_signal_it_listens_on(tmp_path: Path) -> None:
    rank = _rank_like(tmp_path, int(signal.SIGURG))
    try:
        rp = stack_requests.rank_procs(tmp_path)[0]
        assert rp.signal == signal.SIGURG and rp.host_key == ownership.this_host()
        assert stack_requests.signal_ranks(tmp_path) == [0]  # /proc sees the SIGURG handler
    finally:
        rank.kill()
        rank.wait()


def test_a_rank_ends_its_group_when_the_pipe_of_its_launcher_closes(tmp_path: Path) -> None:
    """Where no parent-death signal exists: the zygote holds the only write end of a pipe; once it
    is gone (closed here), the rank's watcher thread ends the rank and its process group."""
    read_fd, write_fd = os.pipe()
    os.set_inheritable(read_fd, True)
    pids = tmp_path / "pids"
    rank = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, subprocess, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from orchestrator.node.launcher import watch_parent_pipe
        watch_parent_pipe({read_fd})
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(60)
    """)], pass_fds=(read_fd,), start_new_session=True, stderr=subprocess.PIPE, text=True)
    os.close(read_fd)
    try:
        deadline = time.monotonic() + 30
        while not pids.exists() or len(pids.read_text().split()) != 2:
            assert time.monotonic() < deadline and rank.poll() is None
            time.sleep(0.05)
        child = int(pids.read_text().split()[1])
        time.sleep(0.3)
        assert rank.poll() is None  # nothing happens while the write end is open
        os.close(write_fd)
        assert rank.wait(timeout=10) == -signal.SIGKILL
        assert "the local launcher process is gone" in (rank.stderr.read() if rank.stderr else "")
        deadline = time.monotonic() + 10
        while procs.alive(child):
            assert time.monotonic() < deadline, "the rank's child outlived it"
            time.sleep(0.05)
    finally:
        procs.signal_group(rank.pid, signal.SIGKILL)
        rank.wait()


def test_the_launcher_takes_the_pipe_option_and_refuses_a_bad_one() -> None:
    from orchestrator.backends.local import zygote
    from orchestrator.node.launcher import PARENT_PIPE, main

    assert zygote.PARENT_PIPE == PARENT_PIPE  # spelled twice: the zygote does not import the launcher
    assert main(["payload.json", "--parent-pipe=x"]) == 2
    assert main([]) == 2
