"""Ctrl-C (or SIGTERM) during a local pipeline stops the whole pipeline: the stage it interrupts
ends CANCELLED (its ranks stopped in order), no later stage starts (each is reported as not run),
and the CLI exits 130, as an interrupted command does (SIGTERM: the signal ends it, once said).
Tiny standard-library stages; every wait is bounded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from orchestrator.core.records import RunRecord

STAGE = """import os, sys, time
out, tag = sys.argv[sys.argv.index("--out") + 1], sys.argv[sys.argv.index("--tag") + 1]
open(os.path.join(out, tag + ".started"), "w").close()
time.sleep(float(sys.argv[sys.argv.index("--seconds") + 1]))
open(os.path.join(out, tag + ".ended"), "w").close()
"""


def _eventually(check: Callable[[], bool], what: str, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"not within {within}s: {what}"
        time.sleep(0.1)


def _project(tmp_path: Path) -> Path:
    (tmp_path / "out").mkdir()
    (tmp_path / "stage.py").write_text(STAGE)
    for tag in ("first", "second"):
        (tmp_path / f"{tag}.yaml").write_text(json.dumps({
            "name": f"intr-{tag}", "entrypoint": str(tmp_path / "stage.py"), "runs_dir": str(tmp_path / "runs"),
            "nodes": 1, "cpu_ranks_per_node": 1, "code": {"snapshot": False}, "local": {"preload_torch": False},
            "stop_grace_s": 5,
            "args": {"out": str(tmp_path / "out"), "tag": tag, "seconds": 120 if tag == "first" else 0}}))
    path = tmp_path / "pipeline.yaml"
    # when: any: were the interrupt only a cancel of the first stage, the second would run after it
    path.write_text("stages:\n  first: {spec: first.yaml}\n"
                    "  second: {spec: second.yaml, after: [{stage: first, when: any}]}\n")
    return path


def _ranks_of(folder: Path) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if str(folder).encode() in cmd and state != "Z" and int(pid) != os.getpid():
            found.append(int(pid))
    return found


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("sig, code, inherited", [(signal.SIGINT, 130, False), (signal.SIGTERM, -signal.SIGTERM, False),
                                                  (signal.SIGINT, 130, True)],
                         ids=["ctrl-c", "term", "ctrl-c-started-ignoring-it"])
def test_an_interrupt_during_a_stage_stops_the_whole_local_pipeline(tmp_path: Path, sig: int, code: int,
                                                                    inherited: bool) -> None:
    """``inherited``: the CLI starts with SIGINT ignored, as a shell's background job (or a CI
    runner's) does: it once exited 1 then, as if a stage had failed."""
    pipeline = _project(tmp_path)
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "pipeline", str(pipeline)],
                                stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                                preexec_fn=_ignore_sigint if inherited else None)
    try:
        _eventually(lambda: (tmp_path / "out" / "first.started").exists() or proc.poll() is not None,
                    "the first stage's rank runs")
        assert proc.poll() is None, err.read_text()
        proc.send_signal(sig)  # Ctrl-C, or a kill (the ranks lead sessions of their own: not theirs)
        ended = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    said, complaints = out.read_text(), err.read_text()
    # Ctrl-C: the CLI's exit code for an interrupt; SIGTERM: passed on once said, it ends the process
    assert ended == code, (ended, said, complaints)
    first = RunRecord.load(next((tmp_path / "runs").glob("intr-first-*")))
    assert first.state == "CANCELLED", first
    assert not (tmp_path / "out" / "first.ended").exists()
    assert not (tmp_path / "out" / "second.started").exists(), "a stage started after the interrupt"
    assert not list((tmp_path / "runs").glob("intr-second-*")), "the second stage's run was made"
    lines = {line.split(":")[0]: line for line in said.splitlines() if line.startswith(("first:", "second:"))}
    assert "CANCELLED" in lines["first"], said
    assert "not run" in lines["second"] and f"interrupted by {signal.Signals(sig).name}" in lines["second"], said
    assert "Traceback" not in complaints, complaints
    _eventually(lambda: not _ranks_of(tmp_path / "out"), "no rank outlives the pipeline", within=15)
