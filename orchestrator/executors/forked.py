"""The supervisor's side of the zygote (see zygote.py): ranks forked from a pre-imported parent.

``ForkedRank`` offers the part of ``subprocess.Popen`` the supervisor uses (pid, poll, wait),
so spawned and forked ranks are watched, failed fast and killed by the same code.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from typing import Any

from orchestrator.errors import SubmissionError


def start_zygote() -> subprocess.Popen:
    """Start importing torch now; ranks are forked from it once the plan is ready."""
    return subprocess.Popen([sys.executable, "-u", "-m", "orchestrator.executors.zygote", "torch"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)


class ZygoteGroup:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.pids: dict[int, int] = {}
        self.codes: dict[int, int] = {}
        self._buffer = b""

    def start(self, ranks: list[dict[str, Any]], timeout_s: float = 300) -> list[ForkedRank]:
        assert self.proc.stdin is not None
        try:
            for msg in ranks:
                self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.write(b'{"done": true}\n')
            self.proc.stdin.close()
        except BrokenPipeError as exc:
            raise SubmissionError("the local launcher process died before starting the ranks") from exc
        deadline = time.monotonic() + timeout_s
        while len(self.pids) < len(ranks):
            if time.monotonic() > deadline or (not self.pump(block_s=0.5) and self.proc.poll() is not None):
                raise SubmissionError("the local launcher process did not start every rank; "
                                      "set local.preload_torch: false to start ranks as fresh interpreters")
        return [ForkedRank(self, msg["rank"]) for msg in ranks]

    def pump(self, block_s: float = 0.0) -> bool:
        """Read whatever the zygote reported; True if anything arrived."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], block_s)
        if not ready:
            return False
        chunk = os.read(fd, 65536)
        if not chunk:
            self._orphans()
            return False
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            msg = json.loads(line)
            if "pid" in msg:
                self.pids[msg["rank"]] = msg["pid"]
            if "exit" in msg:
                self.codes[msg["rank"]] = msg["exit"]
        return True

    def _orphans(self) -> None:
        """The zygote is gone: a rank it never reported on is dead once its process is."""
        for rank, pid in self.pids.items():
            if rank not in self.codes and not alive(pid):
                self.codes[rank] = 1
        if self.proc.poll() is None:
            self.proc.wait(timeout=5)

    def close(self) -> None:
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ForkedRank:
    def __init__(self, group: ZygoteGroup, rank: int) -> None:
        self.group, self.rank = group, rank
        self.pid = group.pids[rank]

    def poll(self) -> int | None:
        while self.group.pump():
            pass
        if self.rank not in self.group.codes and self.group.proc.poll() is not None:
            self.group._orphans()
        return self.group.codes.get(self.rank)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"rank {self.rank}", timeout or 0)
            self.group.pump(block_s=0.05)
        return code


def alive(pid: int) -> bool:
    """True for a running process; a zombie (state Z) counts as dead."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
