"""Reading faulthandler's dumps (orchestrator.core.stacks) and the watchdog's decisions
(orchestrator.node.watchdog): plain cases, and one real dump taken through the launcher's mechanism
(faulthandler on STACK_SIGNAL) from a live process."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

from orchestrator.backends.slurm.node import stacks_probe
from orchestrator.core import procs
from orchestrator.node import stack_requests
from orchestrator.core import stacks
from orchestrator.core.stacks import Where, in_collective, main_thread, parse, user_frame, where
from orchestrator.node.watchdog import Watch, did_nothing, init_culprits, never_joined_message, straggler

SITE = sysconfig.get_paths()["purelib"]
STDLIB = sysconfig.get_paths()["stdlib"]
OURS = str(Path(stacks.__file__).parents[1] / "node")  # the launcher's folder

WAITING = f"""Thread 0x00007f0000000002 (most recent call first):
  File "{STDLIB}/threading.py", line 331 in wait
  File "{STDLIB}/threading.py", line 1002 in _bootstrap

Current thread 0x00007f0000000001 (most recent call first):
  File "{SITE}/torch/distributed/distributed_c10d.py", line 3913 in all_reduce
  File "{SITE}/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/home/u/proj/train.py", line 87 in step
  File "/home/u/proj/train.py", line 120 in main
  File "<frozen runpy>", line 88 in _run_code
  File "{OURS}/launcher.py", line 50 in call_entrypoint
"""

STRAGGLER = f"""Current thread 0x00007f0000000001 (most recent call first):
  File "{STDLIB}/time.py", line 1 in sleep_helper
  File "/home/u/proj/data.py", line 12 in slow_loader
  File "/home/u/proj/train.py", line 80 in step
  File "{OURS}/launcher.py", line 50 in call_entrypoint
"""


def test_threads_and_frames_innermost_first() -> None:
    threads = parse(WAITING)
    assert [t.ident for t in threads] == ["0x00007f0000000002", "0x00007f0000000001"]
    assert threads[1].current and not threads[0].current
    assert threads[1].frames[0].function == "all_reduce" and threads[1].frames[2].line == 87


def test_the_main_thread_is_not_a_threading_bootstrap() -> None:
    assert main_thread(parse(WAITING)).ident == "0x00007f0000000001"  # type: ignore[union-attr]


def test_user_frame_skips_torch_ours_stdlib_and_frozen() -> None:
    main = main_thread(parse(WAITING))
    assert main is not None
    frame = user_frame(main.frames)
    assert frame is not None and frame.where() == "train.py:87 in step"
    assert in_collective(main.frames) == "all_reduce"
    assert where(WAITING) == Where("train.py:87 in step", "all_reduce", True)


def test_a_rank_outside_any_collective() -> None:
    w = where(STRAGGLER)
    assert w.user == "data.py:12 in slow_loader" and w.collective is None
    assert w.text() == "data.py:12 in slow_loader (not in a collective)"


def test_only_the_last_of_several_dumps_counts() -> None:
    threads = parse(WAITING + "\n" + STRAGGLER)
    assert len(threads) == 1 and threads[0].frames[1].function == "slow_loader"


def test_no_dump_is_no_answer() -> None:
    assert where("") == Where(None, None, False) and "did not answer" in where("").text()
    assert parse("garbage\n  not a frame\n") == []


def test_truncated_and_unknown_lines_are_tolerated() -> None:
    text = 'Current thread 0x1 (most recent call first):\n  File "/x/a.py", line ??? in f\n  ...\n'
    t = parse(text)
    assert t[0].frames[0].line == 0 and t[0].frames[0].function == "f"


def test_straggler_is_the_rank_outside_a_collective() -> None:
    wheres = {0: where(WAITING), 1: where(WAITING), 2: where(STRAGGLER), 3: where(WAITING)}
    rank, why = straggler(wheres, {0: 10.0, 1: 10.0, 2: 50.0, 3: 5.0})
    assert rank == 2 and why == "ranks 0, 1, 3 wait in a collective while it is outside any"
    assert straggler({2: where(STRAGGLER)}, {2: 1.0}) == (2, "its stack is not inside a collective")


IN_BACKWARD = f"""Current thread 0x00007f0000000001 (most recent call first):
  File "{SITE}/torch/autograd/graph.py", line 829 in _engine_run_backward
  File "{SITE}/torch/autograd/__init__.py", line 353 in backward
  File "{SITE}/torch/_tensor.py", line 626 in backward
  File "/home/u/proj/train.py", line 90 in step
  File "{OURS}/launcher.py", line 50 in call_entrypoint
"""

IN_CUSTOM_BACKWARD = f"""Current thread 0x00007f0000000001 (most recent call first):
  File "/home/u/proj/ops.py", line 20 in backward
  File "{SITE}/torch/autograd/function.py", line 307 in apply
  File "{SITE}/torch/autograd/graph.py", line 829 in _engine_run_backward
  File "{SITE}/torch/_tensor.py", line 626 in backward
  File "/home/u/proj/train.py", line 90 in step
"""


def test_a_rank_waiting_in_ddps_backward_all_reduce_is_not_the_straggler() -> None:
    """A healthy DDP rank waits for its peers' gradients inside autograd's engine, where no
    torch.distributed frame is; the frozen rank is the one in user code (3 of 3 freezes were
    blamed on the healthy rank before)."""
    assert where(IN_BACKWARD).collective
    assert not where(IN_CUSTOM_BACKWARD).collective  # user code inside backward: not a wait
    rank, why = straggler({0: where(IN_BACKWARD), 1: where(STRAGGLER)}, {0: 5.0, 1: 10.0})
    assert rank == 1, why


def test_straggler_falls_back_to_no_answer_then_oldest_progress() -> None:
    w = where(WAITING)
    assert straggler({0: w, 1: None, 2: w}, {0: 1.0, 1: 9.0, 2: 2.0})[0] == 1
    rank, why = straggler({0: w, 1: w, 2: w}, {0: 3.0, 1: 1.0, 2: 2.0})
    assert rank == 1 and "least recently" in why


def test_watch_progress_and_stall() -> None:
    w = Watch(world_size=2, started=100.0, stall_s=20.0, init_timeout_s=30.0)
    w.observe(100.0, {0: 10, 1: 10}, {0: None, 1: None}, [])
    w.observe(105.0, {0: 20, 1: 10}, {0: None, 1: 90.0}, [0, 1])  # 90.0: an earlier attempt's report
    assert w.last_progress(0) == 105.0 and w.last_progress(1) == 105.0  # the join counts
    assert not w.stalled(124.0) and w.stalled(125.0)
    w.observe(126.0, {0: 20, 1: 10}, {0: None, 1: 126.0}, [0, 1])  # a heartbeat of this attempt
    assert not w.stalled(140.0) and w.last_progress(1) == 126.0
    # a rank that sends heartbeats is judged by them, not by its log
    w.observe(150.0, {0: 20, 1: 999}, {0: None, 1: 126.0}, [0, 1])
    assert w.last_progress(1) == 126.0


def test_the_supervisors_look_again_when_the_stall_clock_runs_out() -> None:
    """Not up to a look's interval later: a hang is judged at stall_s (10 ms after), and a look
    that finds new progress pushes the next one back; no stall clock, the plain interval."""
    w = Watch(world_size=2, started=100.0, stall_s=20.0, init_timeout_s=30.0)
    assert w.stall_due() is None and w.next_look(101.0, 1.0) == 1.0  # no rank past its start yet
    w.observe(105.0, {0: 1, 1: 1}, {0: 104.0, 1: 104.5}, [0, 1])
    assert w.stall_due() == 125.0
    assert w.next_look(110.0, 1.0) == 1.0 and round(w.next_look(124.5, 1.0), 6) == 0.51
    assert not w.stalled(125.0 - 1e-6) and w.stalled(124.5 + w.next_look(124.5, 1.0))
    assert w.next_look(130.0, 1.0) == 0.01  # overdue: look at once (never a busy loop)
    w.observe(124.9, {0: 1, 1: 1}, {0: 124.9, 1: 104.5}, [0, 1])
    assert w.stall_due() == 144.9
    assert Watch(world_size=2, started=100.0, init_timeout_s=30.0).next_look(101.0, 1.0) == 1.0


def test_watch_init_deadline() -> None:
    w = Watch(world_size=4, started=0.0, init_timeout_s=10.0)
    w.observe(1.0, {}, {}, [0, 3])
    assert w.never_joined(10.0) == [] and w.never_joined(10.5) == [1, 2]
    assert init_culprits([1, 2], calling=[0, 2, 3]) == [1]
    assert init_culprits([1, 2], calling=[0, 1, 2, 3]) == [1, 2]
    msg = never_joined_message([0, 1, 2, 3], [0, 1, 3], 4, 10)
    assert msg.startswith("rank 2 never called init_process_group") and "ranks 0, 1, 3 waited" in msg


def test_did_nothing() -> None:
    assert did_nothing(4, [0, 0, 0, 0], []) is not None
    assert did_nothing(4, [0, 0, 0, 0], [0]) is None
    assert did_nothing(1, [0], []) is None
    assert did_nothing(2, [0, 1], []) is None


def test_a_real_dump_through_the_launchers_signal(tmp_path: Path) -> None:
    """A live process registers the dump as the launcher does; a request reads it while it keeps
    running (a second request gets a second, fresh dump)."""
    script = tmp_path / "user_code.py"
    script.write_text(textwrap.dedent(f"""
        import sys, threading, time
        sys.path.insert(0, {str(Path(OURS).parent)!r})
        from orchestrator import stack_requests
        stack_requests.install({str(tmp_path)!r}, 5)
        def helper_loop():
            while True:
                time.sleep(0.01)
        def my_function():
            open({str(tmp_path / 'ready')!r}, 'w').close()
            while True:
                time.sleep(0.01)
        threading.Thread(target=helper_loop, daemon=True).start()
        my_function()
    """))
    proc = subprocess.Popen([sys.executable, str(script)])
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        first = stack_requests.request_local(tmp_path)
        second = stack_requests.request_local(tmp_path, [5])
        assert proc.poll() is None, "the process must keep running"
        os.kill(proc.pid, signal.SIGSTOP)  # stopped: not asked, nothing waited for, and it says why
        deadline = time.monotonic() + 10
        while procs.stat(proc.pid).state not in stack_requests.STOPPED_STATES:  # type: ignore[union-attr]
            assert time.monotonic() < deadline
            time.sleep(0.01)
        asked = time.monotonic()
        dumps, refused = stack_requests.request_local_explained(tmp_path)
        assert time.monotonic() - asked < 1.0 and dumps == {} and refused == {5: stack_requests.STOPPED}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            stacks_probe.main([str(tmp_path)])  # the SLURM node's probe says so on its stdout
        assert stacks_probe.answers(out.getvalue()) == (set(), {5: stack_requests.STOPPED})
        os.kill(proc.pid, signal.SIGCONT)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            stacks_probe.main([str(tmp_path)])
        assert stacks_probe.answers(out.getvalue()) == ({5}, {})
    finally:
        proc.kill()
        proc.wait()
    assert list(first) == [5] and list(second) == [5]
    threads = parse(first[5])
    assert len(threads) == 2
    assert where(first[5]).text() == "user_code.py:12 in my_function (not in a collective)"
    assert where(second[5]).user == "user_code.py:12 in my_function"
    assert any(t.frames and t.frames[0].function == "helper_loop" for t in parse(first[5]))
    # a process that is no longer the rank is never signalled
    assert stack_requests.signal_ranks(tmp_path) == []


def test_only_the_recorded_process_is_signalled(tmp_path: Path) -> None:
    stack_requests.rank_record_path(tmp_path, 0).parent.mkdir(parents=True)
    stack_requests.rank_record_path(tmp_path, 0).write_text(
        f'{{"rank": 0, "host": "{os.uname().nodename}", "pid": {os.getpid()}, "start_ticks": 1}}')
    assert stack_requests.signal_ranks(tmp_path) == []  # same pid, other start time: not ours


def test_the_stacks_command_never_imports_torch(tmp_path: Path) -> None:
    """`orchestrator stacks` on a running (local) run: a fresh interpreter prints the rank's stack
    without importing torch."""
    from orchestrator.core import procs
    from orchestrator.core.records import RunRecord

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(OURS).parent)!r})
        from orchestrator import stack_requests
        stack_requests.install({str(run_dir)!r}, 0)
        def waiting_here():
            open({str(tmp_path / 'ready')!r}, 'w').close()
            time.sleep(60)
        waiting_here()
    """))
    proc = subprocess.Popen([sys.executable, str(script)])
    try:
        RunRecord(run_id="fake-1", run_dir=str(run_dir), executor="local", state="RUNNING", world_size=1,
                  supervisor_pid=os.getpid(), supervisor_start=procs.start_time(os.getpid())).save()
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        code = ("import sys\nfrom orchestrator.cli import main\n"
                f"rc = main(['stacks', {str(run_dir)!r}])\n"
                "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', rc)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                             cwd=Path(OURS).parent)
    finally:
        proc.kill()
        proc.wait()
    assert "=== rank 0 " in out.stdout and "in waiting_here" in out.stdout, out.stdout + out.stderr
    assert out.stdout.strip().endswith("NO-TORCH 0"), out.stdout


def test_wait_lines_group_ranks_at_the_same_place() -> None:
    from orchestrator.core.stacks import wait_lines

    waits = {"0": "a.py:1 in f, waiting in all_reduce", "1": "a.py:1 in f, waiting in all_reduce",
             "2": "a.py:1 in f, waiting in all_reduce", "3": "b.py:9 in g (not in a collective)",
             "5": "a.py:1 in f, waiting in all_reduce"}
    assert wait_lines(waits) == ["ranks 0-2, 5: a.py:1 in f, waiting in all_reduce",
                                 "rank 3: b.py:9 in g (not in a collective)"]


def test_the_stacks_probe_keeps_its_environment_on_export_none_sites(monkeypatch) -> None:
    """srun reads SLURM_EXPORT_ENV as --export: the probe's srun says ALL, so a site defaulting to
    --export=NONE still starts the probe with this PATH and Python; a surrounding job's SLURM_* stay out."""
    from orchestrator.backends.slurm.node import slurm_controller, stacks_probe

    seen: dict = {}

    def fake_run(argv, **kwargs):  # type: ignore[no-untyped-def]
        seen.update(kwargs["env"])
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(stack_requests, "rank_procs", lambda run_dir: {0: object()})
    monkeypatch.setattr(stack_requests, "sizes", lambda run_dir, ranks: {r: 0 for r in ranks})
    monkeypatch.setattr(stack_requests, "wait_written", lambda run_dir, before, timeout_s=1.0: before)
    monkeypatch.setattr(stack_requests, "read_from", lambda run_dir, rank, a, b: "")
    monkeypatch.setattr(slurm_controller.subprocess, "run", fake_run)
    monkeypatch.setenv("SLURM_EXPORT_ENV", "NONE")
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    stacks_probe.request_slurm("/nonexistent/run", "77", 2, sys.executable)
    assert seen["SLURM_EXPORT_ENV"] == "ALL" and "SLURM_JOB_ID" not in seen


def test_a_rank_not_asked_for_its_stacks_is_not_said_to_have_not_answered(tmp_path) -> None:
    """A stopped rank's saved file says why it was not asked, with no 'did not answer' summary above."""
    from orchestrator.core import stack_files, stacks

    assert stacks.describe("(not asked: stopped)\n") == ""
    assert stacks.describe("") == ""
    stack_files.save(tmp_path, {1: "(not asked: stopped (SIGSTOP))\n"}, "a test")
    saved = "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())
    assert "(not asked: stopped (SIGSTOP))" in saved and "did not answer" not in saved
