"""The front door and the manual: README.md is short and its quickstart runs as written; the manual
(docs/, built by MkDocs from docs/mkdocs/mkdocs.yml) builds with ``--strict``, so a broken link, a
missing anchor, a page left out of the nav, an example that no longer validates or a command the
CLI page's table lacks fails here; its generated references hold every spec field and every
command, computed here from the code on their own (not with the hook's code), so either can fail.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shlex
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "docs" / "mkdocs" / "mkdocs.yml"
README = ROOT / "README.md"
PERFORMANCE = ROOT / "docs" / "PERFORMANCE.md"
README_MAX_LINES = 300
PERFORMANCE_MAX_LINES = 250


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The manual, built once for this module into a folder of its own."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about MkDocs 2, not ours
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-f", str(CONFIG),
                           "-d", str(out)], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def test_the_manual_builds_with_strict_and_has_every_page_of_its_nav(site: Path) -> None:
    for page in ("index.html", "manual/reference/spec/index.html", "manual/reference/cli/index.html",
                 "PERFORMANCE/index.html", "bench-logs/PERFORMANCE-HISTORY/index.html", "deploy/index.html"):
        assert (site / page).is_file(), page
    assert "hello-ddp" in (site / "index.html").read_text(encoding="utf-8")  # the README is the home page


# ---- the spec reference: every field, found from the JSON schema ------------------------------

def _schema_paths(schema: dict[str, Any], node: dict[str, Any], prefix: str) -> Iterator[str]:
    """Every field path of a JSON schema: nested objects by '.', a list of objects by '[].'."""
    for name, prop in node.get("properties", {}).items():
        path = prefix + name
        yield path
        target, is_list = _object_of(schema, prop)
        if target is not None:
            yield from _schema_paths(schema, target, path + ("[]." if is_list else "."))


def _object_of(schema: dict[str, Any], prop: dict[str, Any]) -> tuple[dict[str, Any] | None, bool]:
    def deref(p: dict[str, Any]) -> dict[str, Any] | None:
        if "$ref" in p:
            return schema["$defs"][p["$ref"].rsplit("/", 1)[1]]
        for option in p.get("anyOf", []):
            found = deref(option)
            if found is not None:
                return found
        return None

    if prop.get("type") == "array" and isinstance(prop.get("items"), dict):
        return deref(prop["items"]), True
    return deref(prop), False


def _headings(html: str, level: int) -> list[str]:
    found = re.findall(rf"<h{level}[^>]*>(.*?)</h{level}>", html, re.S)
    return [re.sub(r"<[^>]+>", "", re.sub(r'<a class="headerlink".*?</a>', "", h)).strip() for h in found]


def test_the_spec_reference_has_every_field_of_the_schema(site: Path) -> None:
    from orchestrator.spec.models import JobSpec

    schema = JobSpec.model_json_schema()
    expected = list(_schema_paths(schema, schema, ""))
    assert {"slurm.partition", "recovery.on", "container.image", "after[].run"} <= set(expected)
    page = (site / "manual" / "reference" / "spec" / "index.html").read_text(encoding="utf-8")
    documented = _headings(page, 3)
    assert set(expected) - set(documented) == set(), "fields the generated spec reference lacks"
    assert set(documented) - set(expected) == set(), "entries that are no field of the spec"
    assert page.count("<strong>Type:</strong>") == page.count("<strong>Default:</strong>") == len(expected)
    leaves = [p for p in expected if not _object_of(schema, _prop(schema, p))[0]]
    assert page.count("<p>Example") == len(leaves), "a field without its example"


def _prop(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node: dict[str, Any] = schema
    parts = path.replace("[].", ".").split(".")
    for i, part in enumerate(parts):
        prop = node["properties"][part]
        if i == len(parts) - 1:
            return prop
        target, _ = _object_of(schema, prop)
        assert target is not None
        node = target
    raise AssertionError(path)


# ---- the CLI reference: every command the parser has ------------------------------------------

def test_the_cli_reference_has_every_command_and_its_options(site: Path) -> None:
    from orchestrator.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    listed = {choice.dest for choice in sub._choices_actions}  # the hidden ones have no help
    assert {"validate", "plan", "submit", "chaos", "gc"} <= listed
    page = (site / "manual" / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    documented = {h.removeprefix("orchestrator ") for h in _headings(page, 2) if h.startswith("orchestrator ")}
    assert documented == listed
    for name in listed:
        for action in sub.choices[name]._actions:
            for option in action.option_strings:
                if action.help != argparse.SUPPRESS and option not in ("-h", "--help"):
                    assert f"<code>{option}" in page, f"orchestrator {name} {option}"


# ---- the front door ---------------------------------------------------------------------------

def test_the_readme_and_performance_stay_short() -> None:
    readme = README.read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_MAX_LINES
    assert len(PERFORMANCE.read_text(encoding="utf-8").splitlines()) <= PERFORMANCE_MAX_LINES
    for marker in ("<!-- main-command -->", "<!-- test-command -->"):  # .ci/run reads the test command here
        assert re.search(rf"^{re.escape(marker)}\n```bash\n[^\n]+\n```$", readme, re.M), marker


def _quickstart() -> str:
    return README.read_text(encoding="utf-8").split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]


def _in_process(*argv: str) -> tuple[int, str, str]:
    from orchestrator.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


#: The quickstart's commands that need a SLURM cluster (the cluster suite submits for real).
NEEDS_A_CLUSTER = {"submit"}


def test_the_readme_quickstart_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """spec.yaml and train.py as the quickstart writes them, then each of its commands but
    ``submit``, in order: ``run`` for real (4 local gloo ranks), the others in this process."""
    quick = _quickstart()
    (tmp_path / "spec.yaml").write_text(re.search(r"```yaml\n(.*?)```", quick, re.S)[1], encoding="utf-8")
    (tmp_path / "train.py").write_text(re.search(r"```python\n(.*?)```", quick, re.S)[1], encoding="utf-8")
    commands = [shlex.split(line.split("  #", 1)[0]) for line in re.search(r"```bash\n(.*?)```", quick, re.S)[1]
                .splitlines() if line.strip()]
    assert [c[0] for c in commands] == ["orchestrator"] * len(commands)
    assert {c[1] for c in commands} == {"validate", "plan", "run", "submit", "status", "logs", "cancel"}
    monkeypatch.chdir(tmp_path)
    run_id = None
    for argv in commands:
        argv = [run_id if word == "RUN" else word for word in argv[1:]]
        if argv[0] in NEEDS_A_CLUSTER:
            continue
        if argv[0] == "run":  # the ranks are real processes: from a process of their own, as typed
            proc = subprocess.run([sys.executable, "-m", "orchestrator", *argv], capture_output=True, text=True,
                                  timeout=120)
            code, out, err = proc.returncode, proc.stdout, proc.stderr
            assert "[rank 0] rank 0/4: sum of ranks = 6" in out, out + err
            run_id = re.search(r"identity: new run (hello-ddp-[0-9a-f]+)", out + err)[1]
        else:
            assert None not in argv, f"{argv}: the quickstart uses RUN before 'run' printed it"
            code, out, err = _in_process(*argv)
        assert code == 0, f"orchestrator {' '.join(map(str, argv))}: exit {code}\n{out}\n{err}"
        if argv[0] == "validate":
            assert out.startswith("ok: hello-ddp: 2 node(s) x 2 rank(s), gloo, "), out
        if argv[0] == "status":
            assert re.search(rf"{run_id}\s+COMPLETED", out), out
        if argv[0] == "logs":
            assert "rank 1/4: sum of ranks = 6" in out, out
