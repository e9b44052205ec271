"""States, attempt outcomes, failure kinds, actions and end reasons are spelled once, in
orchestrator/core/states.py: the SLURM job agent, the local supervisor, recovery and the watchdog use
the enums, never the bare words (a typo there would be a state no one reads)."""

from __future__ import annotations

import ast
from pathlib import Path

from orchestrator.core.states import Action, EndReason, FailureKind, Outcome, Phase, State

ROOT = Path(__file__).resolve().parents[2]
MODULES = ["orchestrator/backends/slurm/node/slurm_job.py", "orchestrator/backends/slurm/node/agent_state.py", "orchestrator/backends/slurm/node/agent_decisions.py",
           "orchestrator/backends/slurm/node/agent_requeue.py", "orchestrator/backends/slurm/node/agent_recovery.py", "orchestrator/backends/slurm/node/agent_watch.py",
           "orchestrator/backends/local/supervisor.py", "orchestrator/core/recovery.py", "orchestrator/node/watchdog.py"]
WORDS = {str(m.value) for enum in (State, Outcome, FailureKind, Action, EndReason, Phase) for m in enum} - {""}
#: SLURM's own words, read from what its controller answers (scontrol's JobState), not ours.
SLURMS = {"PREEMPTED", "SUSPENDED"}


def _words(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    in_fstrings = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    return [f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in WORDS - SLURMS
            and id(node) not in docstrings and id(node) not in in_fstrings]


def test_no_state_is_spelled_outside_the_enums() -> None:
    found = [hit for module in MODULES for hit in _words(ROOT / module)]
    assert not found, "use the enum of orchestrator.core.states:\n" + "\n".join(found)


def test_the_words_are_strings_on_disk() -> None:
    import json

    assert json.dumps({"outcome": Outcome.NODE_FAILURE, "action": Action.RESTART}) == \
        '{"outcome": "node_failure", "action": "restart"}'
    assert Outcome.of_failure(FailureKind.HANG) == "hang" == EndReason.HANG
    assert f"{State.FAILED}" == "FAILED" and Action.NONE == ""
