"""A run's state is spelled in one place (orchestrator.core.states): no module outside it compares a
state with, or sets one to, a string literal ("COMPLETED"), where a typo would be a silent bug.
SLURM's own words (sacct's, scontrol's JobState) are SLURM's vocabulary and are read as such
(backends/slurm/slurm_status.py maps them), so only what is named ``state`` is held to the rule."""

from __future__ import annotations

import ast
from pathlib import Path

from orchestrator.core.states import State

ROOT = Path(__file__).resolve().parents[2] / "orchestrator"
WORDS = {s.value for s in State}


def _named_state(node: ast.AST) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name == "state" or name.endswith("_state")


def _literal(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value in WORDS


def offences(source: str) -> list[int]:
    """The lines where a state is compared with, assigned or passed a state's name as a literal."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_named_state(s) for s in sides) and any(_literal(s) for s in sides):
                lines.append(node.lineno)
        elif isinstance(node, ast.keyword) and node.arg == "state" and _literal(node.value):
            lines.append(node.value.lineno)
        elif isinstance(node, ast.Assign):
            targets = [t for tgt in node.targets for t in (tgt.elts if isinstance(tgt, ast.Tuple) else [tgt])]
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            if any(_named_state(t) and _literal(v) for t, v in zip(targets, values)):
                lines.append(node.lineno)
    return lines


def test_no_state_is_spelled_as_a_string_outside_the_states_module() -> None:
    found = {str(p.relative_to(ROOT)): offences(p.read_text(encoding="utf-8"))
             for p in ROOT.rglob("*.py") if p.name != "states.py"}
    assert not {k: v for k, v in found.items() if v}, "use orchestrator.core.states.State, not a string: " + str(
        {k: v for k, v in found.items() if v})


def test_the_check_finds_each_spelling() -> None:
    assert offences('if record.state == "COMPLETED":\n    pass\n') == [1]
    assert offences('record.update(state="RUNNING")\n') == [1]
    assert offences('state, changes = "FAILED", {}\n') == [1]
    assert offences('if state == State.COMPLETED:\n    pass\n') == []
    assert offences('if job.get("JobState") == "PREEMPTED":\n    pass\n') == []  # SLURM's word, read as such
