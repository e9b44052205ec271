"""The backend seam (issue 52, item 1): outside ``orchestrator/backends/`` nothing compares a
backend's name ("slurm", "local", "debug") and nothing imports a backend's package; the code asks
the registry instead (``orchestrator.backends``: what a backend is; ``orchestrator.backends.factory``:
its executor, whose methods do what differs; ``planner``: its planner, for what a plan says), or
a spec's own facts (``JobSpec.scheduled``, ``emulated``, ``in_process``). Checked from the source
(ast), TYPE_CHECKING blocks included: a type named from a backend is an import of it too.

``DEBTS``: the sites left, per module, counted; the count may only fall (a new site fails, and so
does a stale count, so that the list shrinks with the code)."""

from __future__ import annotations

import ast
from pathlib import Path

from orchestrator.backends import BACKENDS

ROOT = Path(__file__).resolve().parents[2]
NAMES = set(BACKENDS)
REGISTRY = {"orchestrator.backends", "orchestrator.backends.factory", "orchestrator.backends.kinds"}

#: module (path) -> the seam's sites it still has: none.
DEBTS: dict[str, int] = {}


def _is_module(name: str) -> bool:
    """Whether ``from orchestrator.backends import name`` imports a module (else a registry name)."""
    return (ROOT / "orchestrator" / "backends" / name).is_dir() or (ROOT / "orchestrator" / "backends" / f"{name}.py").exists()


def _sites(path: Path) -> list[str]:
    """Each comparison with a backend's name and each import of a backend package in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = [c.value for s in sides for c in ([s] if isinstance(s, ast.Constant) else
                                                        s.elts if isinstance(s, (ast.Tuple, ast.List, ast.Set)) else [])
                     if isinstance(c, ast.Constant) and c.value in NAMES]
            if named:
                found.append(f"line {node.lineno}: compares with {named[0]!r}: {ast.unparse(node)[:80]}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            full = [node.module] if node.module != "orchestrator.backends" else \
                [f"{node.module}.{a.name}" for a in node.names if _is_module(a.name)]
            for name in full:
                if name.startswith("orchestrator.backends.") and name not in REGISTRY:
                    found.append(f"line {node.lineno}: imports {name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("orchestrator.backends.") and alias.name not in REGISTRY:
                    found.append(f"line {node.lineno}: imports {alias.name}")
    return found


def _outside() -> dict[str, list[str]]:
    out = {}
    for package in ("orchestrator", "jobs"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("orchestrator/backends/") or "/examples/" in rel:
                continue
            sites = _sites(path)
            if sites:
                out[rel] = sites
    return out


def test_nothing_outside_the_backends_names_a_backend_or_imports_one() -> None:
    found = _outside()
    wrong = [f"{rel}: {len(sites)} site(s), {DEBTS.get(rel, 0)} allowed:\n    " + "\n    ".join(sites)
             for rel, sites in found.items() if len(sites) > DEBTS.get(rel, 0)]
    stale = [f"{rel}: {DEBTS[rel]} allowed, {len(found.get(rel, []))} left: lower DEBTS"
             for rel in DEBTS if len(found.get(rel, [])) < DEBTS[rel]]
    assert not wrong and not stale, "ask the registry (orchestrator.backends, its factory, the planner) or " \
        "the spec's facts instead:\n" + "\n".join(wrong + stale)


def test_the_check_finds_what_it_forbids(tmp_path: Path) -> None:
    """The check itself can fail: each form it forbids is found in a module written here."""
    module = tmp_path / "m.py"
    module.write_text("from orchestrator.backends.slurm.executor import X\nimport orchestrator.backends.local.zygote\n"
                      "from orchestrator.backends import slurm\nfrom orchestrator.backends import backend\n"
                      "if spec.executor == 'slurm' or x in ('local', 'y') or 'debug' != e:\n    pass\n")
    sites = _sites(module)
    assert len(sites) == 6 and not any("imports orchestrator.backends.backend" in s for s in sites), sites
