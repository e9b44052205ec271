"""The supervisor's side of the zygote (see zygote.py): every local rank is its child.

``ForkedRank`` offers the part of ``subprocess.Popen`` the supervisor uses (pid, poll, wait),
so ranks forked from a pre-imported parent and ranks exec'd as fresh interpreters are watched,
failed fast and killed by the same code.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from typing import Any

from orchestrator.core import platform_caps
from orchestrator.core.errors import SubmissionError
from orchestrator.core.interpreter import module_argv
from orchestrator.core.payload import is_script
from orchestrator.core.procs import alive, signal_group, signal_name

__all__ = ["ForkedRank", "ZygoteGroup", "builds_ddp", "start_zygote"]


def start_zygote(preload: bool = True) -> subprocess.Popen:
    """Start the ranks' parent now. With ``preload`` it imports torch while the CLI validates and
    plans, and forks the ranks; without, it execs each rank as a fresh interpreter. Where forking
    after ``import torch`` is not safe (macOS: ``platform_caps.fork_after_torch_safe``) it never
    preloads, whatever the caller asked."""
    mode = "torch" if preload and platform_caps.fork_after_torch_safe() else "--exec"
    return subprocess.Popen(module_argv(sys.executable, "orchestrator.backends.local.zygote", mode, f"--parent={os.getpid()}"),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)


#: The project's entrypoints that wrap the model in DistributedDataParallel (jobs.parallel.wrap_model).
DDP_ENTRYPOINTS = frozenset({"jobs.train", "jobs.examples.rank_api_example"})
#: What a script's text holds when it builds DDP: torch's class, or the rank API's wrapper of it.
DDP_WORDS = (b"DistributedDataParallel", b"wrap_model")
#: How much of a script is read to see whether it builds DistributedDataParallel itself.
SCRIPT_READ_BYTES = 1 << 20


def builds_ddp(entrypoint: str, framework: str | None) -> bool:
    """Whether every rank of this job builds DistributedDataParallel, whose constructor imports
    ``torch._dynamo`` (with sympy: 2-3 s of CPU a rank on 2 cores), so that the zygote should
    import it once before forking (``zygote.DDP_IMPORTS``): a framework run (Lightning, Fabric,
    accelerate and the transformers Trainer wrap the model in DDP), one of the project's trainers,
    or a script whose text names DistributedDataParallel or the rank API's ``wrap_model`` (a module
    of the user's is not imported to find out: its package may run anything). Anything else is not
    preloaded, as before: for a job that never builds DDP the import would only delay its ranks (a
    2-rank all-reduce started 3 s later on 2 cores, 2026-11-28)."""
    if framework is not None:
        return True
    if not is_script(entrypoint):
        return entrypoint.split(":", 1)[0] in DDP_ENTRYPOINTS
    try:
        with open(entrypoint, "rb") as fh:
            text = fh.read(SCRIPT_READ_BYTES)
    except OSError:
        return False  # the rank will say what is wrong with it
    return any(word in text for word in DDP_WORDS)


class ZygoteGroup:
    """One zygote and the set of ranks it runs now. The same zygote forks every attempt's ranks
    (``start`` again after ``end_set``) for as long as it stays healthy: each set's end is
    reported and its leftovers stopped before the next set starts."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.pids: dict[int, int] = {}
        self.codes: dict[int, int] = {}
        self.leftovers: list[int] | None = None  # what the zygote had to stop after the set's ranks ended
        self.lost: str | None = None  # why the zygote ended before reporting every rank's end
        self._closing = False
        self._buffer = b""

    def start(self, ranks: list[dict[str, Any]], timeout_s: float = 300) -> list[ForkedRank]:
        """Fork this set of ranks; the zygote stays for another set (``end_set``, then ``start``)."""
        self.pids, self.codes, self.leftovers = {}, {}, None
        self._send([*ranks, {"go": True}], [msg["rank"] for msg in ranks], timeout_s,
                   "the local launcher process died before starting the ranks",
                   "the local launcher process did not start every rank; "
                   "set local.preload_torch: false to start ranks as fresh interpreters")
        return [ForkedRank(self, msg["rank"]) for msg in ranks]

    def add(self, msg: dict[str, Any], timeout_s: float = 60) -> ForkedRank:
        """Fork one more rank into the running set: a replacement for one that ended, beside the
        survivors (``recovery.survivors: keep``). Its earlier exit is forgotten."""
        rank = msg["rank"]
        self.codes.pop(rank, None)
        self.pids.pop(rank, None)
        self._send([msg], [rank], timeout_s, "the local launcher process died before starting the replacement rank",
                   f"the local launcher process did not start the replacement for rank {rank}")
        return ForkedRank(self, rank)

    def _send(self, messages: list[dict[str, Any]], ranks: list[int], timeout_s: float, died: str,
              not_started: str) -> None:
        """Send ``messages`` to the zygote and wait until it reports the pid of every one of ``ranks``."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write("".join(json.dumps(msg) + "\n" for msg in messages).encode())
            self.proc.stdin.flush()
        except BrokenPipeError as exc:
            raise SubmissionError(died) from exc
        deadline = time.monotonic() + timeout_s
        while any(rank not in self.pids for rank in ranks):
            if time.monotonic() > deadline or (not self.pump(block_s=0.5) and self.proc.poll() is not None):
                raise SubmissionError(not_started)

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
            if "leftovers" in msg:
                self.leftovers = msg["leftovers"]
        return True

    def _orphans(self) -> None:
        """The zygote is gone. If it ended before reporting every rank, nobody knows how those
        ranks ended (they die with it: their parent-death signal), so no rank is blamed: the run
        fails for the zygote's loss, said as such."""
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        unreported = [r for r in self.pids if r not in self.codes]
        if unreported and not self._closing and self.lost is None:
            code = self.proc.returncode
            how = (f"killed by {signal_name(-code)}" if code is not None and code < 0
                   else f"exit code {code}")
            self.lost = (f"the local launcher process (the ranks' parent, pid {self.proc.pid}) ended ({how}) while "
                         f"rank(s) {', '.join(map(str, unreported))} ran; they were stopped with it")
        for rank, pid in self.pids.items():
            if rank not in self.codes and not alive(pid):
                self.codes[rank] = -9  # stopped with the zygote (SIGKILL, its parent-death signal)

    def end_set(self, timeout_s: float = 15.0) -> bool:
        """End the current set (its ranks have ended) and wait for the zygote to report what it
        stopped that they left running. True when it did and can fork another set; otherwise it
        is closed (``close``) and a new zygote must serve the next one."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(b'{"end": true}\n')
            self.proc.stdin.flush()
        except OSError:  # it is gone: closed below
            pass
        deadline = time.monotonic() + timeout_s
        while self.leftovers is None and self.lost is None and self.proc.poll() is None and \
                time.monotonic() < deadline:
            self.pump(block_s=0.1)
        while self.leftovers is None and self.pump():
            pass
        if self.leftovers is not None and self.lost is None and self.proc.poll() is None:
            return True
        self.close()
        return False

    def close(self, timeout_s: float = 15.0) -> None:
        """No more sets: wait for the zygote to stop the ranks' leftovers and exit; ask it (SIGTERM:
        it still cleans up), and only then force it."""
        self._closing = True
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.write(b'{"done": true}\n')
                self.proc.stdin.close()
            except OSError:  # it is gone already
                pass
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.pump(block_s=0.1)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        while self.pump():
            pass


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

    def signal(self, sig: int) -> None:
        """``sig`` to the rank's session, which it leads from its first instructions on
        (``zygote.child``); before that, to its pid: it is the zygote's unreaped child, so the pid
        is its own, and the zygote holds the signal until the rank's handlers are in place."""
        if not signal_group(self.pid, sig) and self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"rank {self.rank}", timeout or 0)
            self.group.pump(block_s=0.05)
        return code
