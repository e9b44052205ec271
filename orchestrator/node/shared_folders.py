"""Whether the nodes share the run folder (and a checkpoint folder of its own) with the job's
agent: the health gate's check of it (``orchestrator.node.health``).

Before the gate's tasks start, the job's agent (locally, the supervisor) writes one token, named
``agent``, in a folder of its own in each folder the ranks must share (``write_agent_token``). Each
node then looks for it (``wait_for_agent_token``): a listing of a folder that holds that one name,
usually just once, since it was written before the node started. A node that sees it shares the
folder with the agent's node; every node compared with that same one is every node sharing it with
every other. That is one listing of one name a node: each node looking for every other node's
token (how the gate worked until 2026-11-29) listed a folder of a name a node about ten times in
its first second, what a metadata server pays as nodes squared at a thousand nodes.

Whom a node that does not see it blames (``not_shared``): itself (its own verdict says so), unless
more than half of the nodes other than the agent's do not see it either. Then the folder is not
one folder the nodes share (a node-local disk at the same path on each) or the agent's node is
the odd one, and every node is blamed, the agent's own too, with a line naming the field.
Standard library only: it runs on every node before every attempt.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from orchestrator.core.fs_checks import errno_text, shown
from orchestrator.core.run_folder import RunFolder

TYPE_CHECKING = False  # not typing's: the gate's tasks start lean (docs/PERFORMANCE.md)
if TYPE_CHECKING:
    from typing import Mapping, Sequence

#: The agent's token, in each folder's ``agent`` folder of the attempt.
AGENT_TOKEN = "agent"
#: The spec's fields of the folders the nodes must share, as a failing node names them.
RUNS_DIR, CHECKPOINT_DIR = "runs_dir", "checkpoint.dir"

#: A node looks for the agent's token at once, then after 0.01 s, each wait half again as long, up
#: to 0.5 s: one listing when the filesystem shows the token at once (the agent wrote it before
#: the step started), about 130 over a whole token wait of 60 s, each of a one-name folder.
_POLL_FIRST_S, _POLL_GROWTH, _POLL_MAX_S = 0.01, 1.5, 0.5


def health_dir(run_dir: str, attempt: int) -> Path:
    """``<run>/health/attempt-<K>``: one folder per attempt, so an earlier attempt's tokens never
    pass for this one's."""
    return RunFolder.of(run_dir).root / "health" / f"attempt-{attempt}"


def checkpoint_tokens(checkpoint_dir: str, attempt: int) -> Path:
    """Where the agent leaves its token in a checkpoint folder of its own (hidden: a checkpoint
    reader, and recovery's progress check, skip dot-files). The agent removes it after the gate."""
    return Path(checkpoint_dir) / ".orch-health" / f"attempt-{attempt}"


def token_folders(run_dir: str, checkpoint_dir: str, attempt: int) -> list[tuple[str, Path, str]]:
    """(field, the folder the agent's token goes in, the folder to name) for each folder the nodes
    must share: the run folder, and a checkpoint folder outside it (else each node resumes from its
    own checkpoints)."""
    folders = [(RUNS_DIR, health_dir(run_dir, attempt) / AGENT_TOKEN, run_dir)]
    if _outside(checkpoint_dir, run_dir):
        folders.append((CHECKPOINT_DIR, checkpoint_tokens(checkpoint_dir, attempt) / AGENT_TOKEN, checkpoint_dir))
    return folders


def _outside(folder: str, run_dir: str) -> bool:
    a, b = os.path.abspath(folder), os.path.abspath(run_dir)
    try:
        return os.path.commonpath([a, b]) != b
    except ValueError:
        return True


def write_agent_token(run_dir: str, checkpoint_dir: str, attempt: int, host: str) -> list[str]:
    """The agent's token in each folder, before the gate's tasks start. Returns what could not be
    written, one line each (the nodes then wait out the token wait there, and fail the gate)."""
    failed: list[str] = []
    for field, folder, named in token_folders(run_dir, checkpoint_dir, attempt):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{AGENT_TOKEN}.{os.getpid()}.tmp"
            tmp.write_text(f"{host} {os.getpid()}\n", encoding="utf-8")
            os.replace(tmp, folder / AGENT_TOKEN)
        except OSError as exc:
            failed.append(f"cannot write the health gate's token under {shown(named)} ({field}) on {host}: "
                          f"{errno_text(exc)}")
    return failed


def wait_for_agent_token(folder: Path, node: str, named: str, field: str, deadline: float,
                         wait_s: float) -> str | None:
    """Look for the agent's token in ``folder`` until ``deadline``: None once seen, else the line
    that says this node does not share ``named`` (a fresh listing each look: on NFS reading the
    folder revalidates it, where a lookup of a missing name may be answered from the cache)."""
    pause = _POLL_FIRST_S
    while True:
        try:
            if AGENT_TOKEN in os.listdir(folder):
                return None
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return (f"{node} does not see the job agent's health token under {shown(named)} after {wait_s:g}s: "
                    f"is {field} shared between the nodes? (or that folder is unreadable there)")
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * _POLL_GROWTH, _POLL_MAX_S)


def not_shared(unseen: Mapping[str, Sequence[str]], nodes: Sequence[str], agent_node: str,
               folders: Mapping[str, str]) -> dict[str, str]:
    """Node -> the line that blames it beyond its own verdict. ``unseen``: node -> the fields whose
    agent token it did not see; ``folders``: field -> the folder. For each field more than half of
    the nodes other than the agent's did not see, every node is blamed with one line: the folder is
    not one the nodes share (or the agent's node is the odd one). Fewer: only those nodes, by their
    own verdicts (nothing here)."""
    others = [n for n in nodes if n != agent_node]
    out: dict[str, str] = {}
    for field, folder in folders.items():
        missing = [n for n in others if field in unseen.get(n, ())]
        if others and 2 * len(missing) > len(others):
            line = (f"{field} {shown(folder)} is not one folder the nodes share: {len(missing)} of the {len(others)} "
                    f"node(s) besides {agent_node} (the job agent's) do not see what the agent wrote there; give "
                    f"{field} a path on a filesystem every node mounts")
            for n in nodes:
                out[n] = f"{out[n]}; {line}" if n in out else line
    return out
