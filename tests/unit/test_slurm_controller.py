"""Every SLURM command goes through orchestrator.backends.slurm.node.slurm_controller (one owner for timeouts, busy
retries and error mapping): a grep of the source holds every other module to it, and the
controller's retries are bounded."""

from __future__ import annotations

import re
import subprocess
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.backends.slurm.node import slurm_controller

ROOT = Path(__file__).resolve().parents[2]
#: The two SLURM commands that are not the controller's: the agent's srun that starts the ranks
#: (a long-lived Popen whose messages it reads), and sbatch, which submitit runs.
ALLOWED = {"orchestrator/backends/slurm/node/slurm_controller.py", "orchestrator/backends/slurm/node/slurm_job.py"}
_CALL = re.compile(r"subprocess\.(run|Popen|call|check_call|check_output)\(")
_TOOL = re.compile(r"\[\s*\"(" + "|".join(sorted(slurm_controller.TOOLS)) + r")\"")


@lru_cache(maxsize=1)
def _builders() -> frozenset[str]:
    """The project's functions that build a SLURM command's argv (a list that starts with one)."""
    found = set()
    for path in (ROOT / "orchestrator").rglob("*.py"):
        for chunk in re.split(r"\ndef ", path.read_text(encoding="utf-8"))[1:]:
            name = re.match(r"\w+", chunk)
            if name and _TOOL.search(chunk.split("\n@")[0].split("\nclass ")[0]):
                found.add(name.group(0))
    return frozenset(found)


def _calls(text: str) -> list[str]:
    """The subprocess calls of ``text`` whose argv (in the call, or a name assigned a SLURM
    command's argv in the same module) starts with a SLURM tool."""
    names = {m.group(1) for m in re.finditer(r"(\w+)\s*=\s*\[\s*\"(?:" + "|".join(slurm_controller.TOOLS) + r")\"", text)}
    while True:  # argv built on another SLURM argv: exists = [*base, ...]
        more = {m.group(1) for m in re.finditer(r"(\w+)\s*=\s*\[\s*\*(\w+)", text) if m.group(2) in names}
        if more <= names:
            break
        names |= more
    # argv from a function that builds SLURM commands (probe_argv, node_check_argv)
    for m in re.finditer(r"^\s*([\w, ]+?)\s*=\s*(\w+)\(", text, re.MULTILINE):
        if m.group(2) in _builders():
            names |= {n.strip() for n in m.group(1).split(",")}
    found = []
    for m in _CALL.finditer(text):
        args = text[m.end():m.end() + 200]
        first = re.match(r"\s*(\[[^\]]*|[\w.]+(?:\([^)]*\))?)", args)
        head = first.group(1) if first else ""
        if _TOOL.match(head) or head.split("(")[0] in names | _builders():
            found.append(head[:60])
    return found


def test_no_slurm_command_runs_outside_the_controller() -> None:
    wrong = []
    for path in sorted((ROOT / "orchestrator").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ALLOWED:
            continue
        for call in _calls(path.read_text(encoding="utf-8")):
            wrong.append(f"{rel}: subprocess call {call!r}: run it through orchestrator.backends.slurm.node.slurm_controller.run")
    assert not wrong, "\n".join(wrong)


def test_the_agent_runs_only_the_ranks_srun_itself() -> None:
    text = (ROOT / "orchestrator" / "backends" / "slurm" / "node" / "slurm_job.py").read_text(encoding="utf-8")
    calls = _CALL.findall(text)
    assert calls == ["Popen"], calls  # the ranks' srun; every other command is the controller's


def test_the_grep_sees_a_call_that_comes_back() -> None:
    assert _calls('out = subprocess.run(["scontrol", "show", "job"], capture_output=True)')
    assert _calls('cmd = ["squeue", "-h"]\nout = subprocess.run(cmd, text=True)')
    assert _calls('base = ["srun", "-N1"]\nexists = [*base, "sh"]\nr = subprocess.run(exists)')
    assert {"node_check_argv", "probe_argv"} <= _builders()
    assert _calls('exists, inside = node_check_argv(spec)\nr = subprocess.run(inside, text=True)')
    assert not _calls('subprocess.run(["ip", "-o", "addr"])')


def _fake(answers: list[tuple[int, str]], calls: list[list[str]]) -> SimpleNamespace:
    def run(argv, **kw):  # type: ignore[no-untyped-def]
        calls.append(argv)
        code, err = answers[min(len(calls) - 1, len(answers) - 1)]
        return subprocess.CompletedProcess(argv, code, "ok" if code == 0 else "", err)

    return SimpleNamespace(run=run, TimeoutExpired=subprocess.TimeoutExpired, DEVNULL=subprocess.DEVNULL)


def test_a_busy_controller_is_asked_again_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    sleeps: list[float] = []
    monkeypatch.setattr(slurm_controller.time, "sleep", sleeps.append)
    busy = "squeue: error: Socket timed out on send/recv operation"
    monkeypatch.setattr(slurm_controller, "subprocess", _fake([(1, busy), (0, "")], calls))
    answer = slurm_controller.run(["squeue", "-h"])
    assert answer.ok and answer.stdout == "ok" and len(calls) == 2 and sleeps == [1.0]

    calls.clear(), sleeps.clear()
    monkeypatch.setattr(slurm_controller, "subprocess", _fake([(1, busy)], calls))
    answer = slurm_controller.run(["squeue", "-h"])
    assert not answer.ok and answer.busy and len(calls) == 1 + len(slurm_controller.BUSY_BACKOFF_S)
    assert "could not reach the SLURM controller" in (answer.problem or "")


def test_a_plain_refusal_is_not_retried_but_a_requeue_is(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(slurm_controller.time, "sleep", lambda s: None)
    monkeypatch.setattr(slurm_controller, "subprocess", _fake([(1, "scancel: error: Invalid job id specified")], calls))
    assert not slurm_controller.scancel("12").ok and len(calls) == 1
    calls.clear()
    monkeypatch.setattr(slurm_controller, "subprocess", _fake([(1, "Socket timed out on send/recv operation"), (0, "")], calls))
    assert slurm_controller.requeue("12", 30.0).ok and len(calls) == 2
    calls.clear()  # a job that pends was requeued already (an earlier try's answer lost): done, not asked again
    monkeypatch.setattr(slurm_controller, "subprocess", _fake([(1, "Job is pending execution for job 12")], calls))
    assert slurm_controller.requeue("12", 30.0).ok and len(calls) == 1


def test_a_missing_tool_is_an_answer_not_an_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    answer = slurm_controller.run(["sinfo", "-h"])
    assert answer.returncode is None and answer.missing and "sinfo" in answer.complaint
    assert slurm_controller.show_job("1") == {} and slurm_controller.nodes_gone(["n1"]) == set()
    with pytest.raises(ValueError, match="not a SLURM command"):
        slurm_controller.run(["ls"])


def test_node_states_and_host_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    fake = _fake([(0, "")], calls)
    fake.run = lambda argv, **kw: subprocess.CompletedProcess(argv, 0, "n1 idle\nn2 down*\nn3 drain\nn4 mix\n", "")
    monkeypatch.setattr(slurm_controller, "subprocess", fake)
    assert slurm_controller.nodes_gone(["n1", "n2", "n3", "n4"]) == {"n2", "n3"}
    assert slurm_controller.controller_hosts("(null)") == []
    assert slurm_controller.controller_hosts("n[1-2]") == ["n1", "n2"]
