"""Warm standby interpreters on the nodes of a SLURM job's ranks (``recovery.survivors: keep``,
issue 50): a rank replaced beside the survivors is forked from one, not started as a new
interpreter that imports torch again (3 s of the 6 s a replacement took on the site cluster).

One standby per node of the ranks' step, started once every rank has reported progress through
the rank API (not before: its imports would compete with the ranks' own start, DDP's included;
started at their join, on this 2-core machine, they slowed the ranks' start past a 10 s
``stall_s``), as a step of one task beside the ranks' (``srun --overlap --mem=0``). It is the local executor's zygote
(``orchestrator.backends.local.zygote``): it imports torch, ``torch._dynamo`` (DDP's constructor
needs it) and the rank API's healer, then waits; a replacement is a set of one rank
(``"entry": "slurm"``: the child runs ``slurm_rank`` as the rank it stands in for, with this
node's SLURM variables and the job's), whose exit it reports. Its process hygiene is the
zygote's: a child subreaper, every rank in its own session, nothing left when it ends. A standby
that failed to start, or died, is passed over: the replacement starts as a fresh step
(``agent_survivors.stand_in_argv``). Standard library only.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from typing import IO, Any, Callable, Mapping, Sequence

from orchestrator.backends.slurm.node import slurm_controller
from orchestrator.backends.slurm.node.agent_state import say
from orchestrator.backends.slurm.node.slurm_task import STAND_IN_OPTION, STEP_NODES_OPTION
from orchestrator.core.interpreter import module_argv
from orchestrator.core.payload import is_script

#: What a standby imports before it is needed: torch, what DDP's constructor imports, and the rank
#: API's healer (``jobs.heal``, with ``jobs.distributed``).
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "jobs.heal")
ZYGOTE = "orchestrator.backends.local.zygote"
RANK_ENTRY = "orchestrator.backends.slurm.node.slurm_rank"


def preload_for(entrypoint: str) -> list[str]:
    """The modules a standby imports: ``PRELOAD``, and the entrypoint's module when it is one of the
    project's (``jobs.train:main``); a user's module is never imported ahead (its import may run anything)."""
    module = "" if is_script(entrypoint) else entrypoint.split(":", 1)[0]
    return [*PRELOAD, *([module] if module.startswith("jobs.") else [])]


class Forked:
    """A rank forked by a standby, as ``StandIns`` sees a process: ``poll``, ``send_signal``, ``wait``."""

    def __init__(self, standby: Standby, rank: int) -> None:
        self.standby, self.rank = standby, rank

    def poll(self) -> int | None:
        """Its exit code as srun would say it (a signal's death as 128 + its number), None while it runs;
        a standby gone without reporting it took the rank with it (SIGKILL)."""
        code = self.standby.exits.get(self.rank)
        if code is None and not self.standby.alive():
            code = self.standby.exits.get(self.rank, -signal.SIGKILL)
        return None if code is None else 128 - code if code < 0 else code

    def send_signal(self, signum: int) -> None:
        self.standby.send({"signal": int(signum)})

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float) -> int:
        return wait_for(self.poll, timeout, "standby rank")


def wait_for(poll: Callable[[], int | None], timeout: float | None, what: str) -> int:
    """``poll``'s exit code once it has one (asked every 20 ms); TimeoutExpired after ``timeout``."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while (code := poll()) is None:
        if deadline is not None and time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(what, timeout or 0)
        time.sleep(0.02)
    return code


class Standby:
    """One node's warm interpreter, and the ranks it forked (by rank: their exits)."""

    def __init__(self, host: str, argv: Sequence[str], environ: Mapping[str, str]) -> None:
        self.host = host
        self.proc = slurm_controller.start(argv, environ, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.lock = threading.Lock()
        self.exits: dict[int, int] = {}
        self.running: set[int] = set()  # forked in the set that runs now
        self.in_set = False
        self.ready = False  # its imports are done: a rank forked now starts warm
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork(self, rank: int, rank_argv: Sequence[str], step_hosts: Sequence[str], environ: Mapping[str, str],
             log: str) -> Forked:
        """Fork rank ``rank`` (``slurm_rank`` with the ranks' own arguments in ``rank_argv``, as that
        rank of the step on ``step_hosts``) with ``environ`` over this node's own."""
        args = [*rank_args(rank_argv), *stand_in_args(rank, step_hosts)]
        with self.lock:
            self.exits.pop(rank, None)
            self.running.add(rank)
            self.send({"rank": rank, "entry": "slurm", "args": args, "env": dict(environ), "log": log,
                       "payload": args[0]})
            if not self.in_set:  # a rank added to a set that runs needs no "go"
                self.send({"go": True})
                self.in_set = True
        return Forked(self, rank)

    def send(self, message: dict[str, Any]) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass  # gone: its ranks went with it (Forked.poll says so)

    def close(self, grace_s: float = 5.0) -> None:
        """Stop it: its ranks are ended (the zygote stops what is left), then it leaves."""
        self.send({"done": True})
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.terminate()  # srun forwards it: the zygote stops its ranks and leaves
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def _read(self, stream: IO[bytes] | None) -> None:
        if stream is None:
            return
        for line in stream:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict) and isinstance(msg.get("ready"), (int, float)):
                self.ready = True
                say(f"warm standby ready on {self.host} (its imports took {msg['ready']:.1f}s): a restart's ranks "
                    "there, or a rank replaced there, are forked from it")
            if not (isinstance(msg, dict) and isinstance(msg.get("rank"), int) and isinstance(msg.get("exit"), int)):
                continue  # a fork's {"rank", "pid"} says nothing the agent needs
            with self.lock:
                self.exits[msg["rank"]] = msg["exit"]
                self.running.discard(msg["rank"])
                if not self.running and self.in_set:  # the set is over: the next replacement starts another
                    self.send({"end": True})
                    self.in_set = False


#: The ranks' srun options a step of one task beside it sets itself (its one node and task, its log).
_OWN_OPTIONS = ("--nodes=", "--ntasks=", "--nodelist=", "--ntasks-per-node=", "--kill-on-bad-exit", "--output=",
                "--open-mode=")


def step_options(rank_argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The ranks' srun (as the agent ran it, without the health gate's options) split into the
    options a step of one task on one node beside it keeps (``--cpus-per-task``, ``--unbuffered``,
    ``--chdir``...), and the rank's own command."""
    options: list[str] = []
    i = 1
    while i < len(rank_argv):
        word = rank_argv[i]
        if word == "--output":  # its value is the step's %t pattern
            i += 2
            continue
        if not word.startswith("-"):  # the rank's own command
            break
        if not word.startswith(_OWN_OPTIONS):
            options.append(word)
        i += 1
    return options, list(rank_argv[i:])


def beside_step(rank_argv: Sequence[str], host: str, *own: str) -> tuple[list[str], list[str]]:
    """An srun of one task on ``host`` beside the ranks' running step (``rank_argv``: as the agent ran
    it), with ``own`` options of its own: ``--overlap --mem=0`` (the step holds the node's CPUs and
    memory), the ranks' other options (``step_options``); and the rank's own command."""
    options, program = step_options(rank_argv)
    return [rank_argv[0], "--overlap", "--mem=0", "--nodes=1", "--ntasks=1", f"--nodelist={host}", *own,
            "--kill-on-bad-exit=0", *options], program


def standby_argv(rank_argv: Sequence[str], host: str, modules: Sequence[str], ranks_per_node: int = 1,
                 stop_grace_s: float = 5.0) -> list[str]:
    """The srun of one node's standby, beside the ranks' step: the CPUs of all the node's ranks
    (``--cpus-per-task`` times ``ranks_per_node``: a whole attempt's ranks may be forked from it),
    and the ranks' ``stop_grace_s`` when it is told to stop (a cancel's SIGTERM reaches it)."""
    head, program = beside_step(rank_argv, host)
    head = [f"--cpus-per-task={int(word.split('=', 1)[1]) * max(1, ranks_per_node)}"
            if word.startswith("--cpus-per-task=") and word.split("=", 1)[1].isdigit() else word for word in head]
    return [*head, *module_argv(program[0], ZYGOTE, "--say-ready", f"--stop-grace={stop_grace_s:g}", *modules)]


#: Without the rank API's progress, the standbys start once every rank is past its own start
#: (``agent_warm_start.past_their_start``: with a stall watchdog, new output this long after its
#: join; without, the join and this long), or this long after the ranks started (no group, or no
#: sign at all): their imports then compete with training, not with the ranks' own start. On the
#: site cluster (2 cores, 2026-12-05) standbys started 5 s after the join starved rank 0's start
#: past a 10 s ``stall_s``, twice, and the job stopped for want of progress.
AFTER_JOIN_S = 5.0
AFTER_START_S = 60.0


def training(reported: Sequence[float | None], past_start: Sequence[bool], since: float, now: float) -> bool:
    """Whether the ranks are past their start (``since``), so that standbys may import beside them:
    every rank reported progress through the rank API since then, or every rank is past its own
    start (``past_start``: ``agent_warm_start.past_their_start``), or AFTER_START_S went by."""
    if reported and all(t is not None and t >= since for t in reported):
        return True
    if past_start and all(past_start):
        return True
    return now >= since + AFTER_START_S


class Standbys:
    """The job's warm standbys, by node. They outlive the attempts inside the job (a restart forks
    the next attempt's ranks from them: ``agent_warm_start``) and go when the agent ends."""

    def __init__(self) -> None:
        self.by_host: dict[str, Standby] = {}
        self.looked_at = 0.0  # when the ranks' progress was last read for their start

    def warm_up(self, hosts: Sequence[str], rank_argv: Sequence[str], environ: Mapping[str, str],
                modules: Sequence[str], ranks_per_node: int, stop_grace_s: float) -> None:
        """A standby on each of ``hosts`` that never had one (once per node: a node whose standby
        died, with the node or otherwise, starts its ranks cold from then on)."""
        for host in dict.fromkeys(hosts):
            if host in self.by_host:
                continue
            try:
                self.by_host[host] = Standby(host, standby_argv(rank_argv, host, modules, ranks_per_node, stop_grace_s),
                                             environ)
            except OSError as exc:  # srun could not start: ranks on that node start fresh
                say(f"no warm standby on {host}: {exc}")

    def on(self, host: str) -> Standby | None:
        """The node's standby while it is alive."""
        standby = self.by_host.get(host)
        return standby if standby is not None and standby.alive() else None

    def drop(self) -> None:
        """Forget every standby at once, their sruns SIGKILLed (the agent's last resort has just
        SIGKILLed the job's steps, theirs among them: a step daemon that stopped answering may hold
        one, and a rank forked there would never start); new ones start once the ranks train again."""
        for standby in self.by_host.values():
            standby.proc.kill()
        self.by_host.clear()

    def close(self) -> None:
        for standby in self.by_host.values():
            standby.close()
        self.by_host.clear()


def rank_args(rank_argv: Sequence[str]) -> list[str]:
    """The rank entry's own arguments in the ranks' srun (its payload, ``--master-port``...)."""
    argv = list(rank_argv)
    return argv[argv.index(RANK_ENTRY) + 1:] if RANK_ENTRY in argv else []


def stand_in_args(rank: int, step_hosts: Sequence[str]) -> list[str]:
    """The options that make a task rank ``rank`` of the ranks' step on ``step_hosts``
    (``slurm_task.stand_in``)."""
    return [STAND_IN_OPTION, str(rank), STEP_NODES_OPTION, ",".join(step_hosts)]
