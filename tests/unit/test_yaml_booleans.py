"""Booleans in what users write: YAML 1.2's, not PyYAML's YAML 1.1 ones.

PyYAML reads an unquoted yes/no/on/off as a boolean, so the README's own ``recovery: {on: [...]}``
became ``{True: [...]}`` and was refused. The spec loader (``loading.SpecLoader``, used for spec
files, pipeline files and ``--set`` values) reads only true/false as booleans; a field that is
true/false still takes yes/no/on/off, as specs written for YAML 1.1 say them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from orchestrator.core.errors import SpecError
from orchestrator.spec.loading import YAML11_BOOLEANS, load_spec, parse_override, parse_text
from orchestrator.front.pipeline import load_pipeline
from orchestrator.spec.models import RECOVERY_KINDS, JobSpec
from tests.unit.test_hostile_input import cli

README = Path(__file__).resolve().parents[2] / "docs" / "manual" / "recovery.md"
BASE = "name: a\nentrypoint: jobs.train:main\n"


def _readme_block(first_line: str) -> str:
    """The README's ```yaml block that starts with ``first_line``, as written."""
    for block in re.findall(r"```yaml\n(.*?)```", README.read_text(encoding="utf-8"), re.S):
        if block.startswith(first_line):
            return block
    raise AssertionError(f"README has no yaml block starting {first_line!r}")


def test_the_readme_recovery_example_validates_as_written(tmp_path: Path) -> None:
    block = _readme_block("recovery:\n")
    assert re.search(r"^  on: \[", block, re.M), "the example's 'on' key is unquoted, as users write it"
    path = tmp_path / "spec.yaml"
    path.write_text(BASE + block, encoding="utf-8")
    code, out, err, _ = cli("validate", str(path))
    assert code == 0, err
    assert out.startswith("ok: a:"), out
    assert load_spec(path).recovery.on == list(RECOVERY_KINDS)


@pytest.mark.parametrize("word", ["on", "off", "yes", "no", "On", "OFF", "Yes", "NO", "y", "n", "Y", "N", "tRue"])
def test_yes_no_on_off_are_text_as_keys_and_values(word: str) -> None:
    assert parse_text(f"{word}: {word}", as_json=False) == {word: word}
    assert parse_text(f"[{word}, {{{word}: 1}}]", as_json=False) == [word, {word: 1}]
    assert parse_override(f"args.x={word}") == (["args", "x"], word)


@pytest.mark.parametrize("word, value", [("true", True), ("True", True), ("TRUE", True), ("false", False),
                                         ("False", False), ("FALSE", False)])
def test_true_and_false_are_still_booleans(word: str, value: bool) -> None:
    assert parse_text(f"a: {word}\nb: '{word}'", as_json=False) == {"a": value, "b": word}
    assert parse_override(f"args.x={word}") == (["args", "x"], value)


def test_the_other_implicit_types_are_unchanged() -> None:
    assert parse_text("a: null\nb: ~\nc: 1\nd: 1.5\ne: 0x1f\nf: n1\ng: no_way\nh: onward", as_json=False) == \
        {"a": None, "b": None, "c": 1, "d": 1.5, "e": 31, "f": "n1", "g": "no_way", "h": "onward"}


def _bool_fields(model: type[BaseModel] = JobSpec, prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        kind = field.annotation
        if kind is bool:
            out.append(prefix + name)
        elif isinstance(kind, type) and issubclass(kind, BaseModel):
            out += _bool_fields(kind, f"{prefix}{name}.")
    return out


BOOL_FIELDS = _bool_fields()


def _get(spec: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        spec = getattr(spec, part)
    return spec


def test_every_true_false_field_was_found() -> None:
    assert {"recovery.health_check", "slurm.exclusive", "checkpoint.resume", "tracking.mlflow"} <= set(BOOL_FIELDS)


@pytest.mark.parametrize("field", BOOL_FIELDS)
def test_a_true_false_field_still_takes_yes_no_on_off(tmp_path: Path, field: str) -> None:
    """--set recovery.health_check=off and `exclusive: yes` in a file mean what they meant under YAML 1.1."""
    base = tmp_path / "base.yaml"
    base.write_text(BASE, encoding="utf-8")
    for word, value in YAML11_BOOLEANS.items():
        assert _get(load_spec(base, overrides=[f"{field}={word}"]), field) is value, (field, word)
    section, last = field.split(".")  # every true/false field is one level down
    path = tmp_path / "spec.yaml"
    path.write_text(BASE + f"{section}:\n  {last}: off\n", encoding="utf-8")
    assert _get(load_spec(path), field) is False
    assert _get(load_spec(base, overrides=[f"{section}={{{last}: No}}"]), field) is False  # a whole section


def test_the_cli_set_off_turns_the_health_gate_off(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(BASE, encoding="utf-8")
    code, _, err, _ = cli("validate", str(path), "--set", "recovery.health_check=off", "--set", "recovery.on=[hang]")
    assert code == 0, err
    spec = load_spec(path, overrides=["recovery.health_check=off", "recovery={on: [crash], exclude_failed_nodes: no}"])
    assert spec.recovery.health_check is False and spec.recovery.exclude_failed_nodes is False
    assert spec.recovery.on == ["crash"]


def test_text_fields_keep_yes_no_on_off_as_text(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(BASE + "args: {mode: on, on: 1}\nenv: {FEATURE: off}\nsweep: {fast: [yes, no]}\n", encoding="utf-8")
    spec = load_spec(path, overrides=["args.amp=yes", "slurm.extra_sbatch.mail-type=NONE"])
    assert spec.args == {"mode": "on", "on": 1, "amp": "yes"}
    assert spec.env == {"FEATURE": "off"} and spec.sweep == {"fast": ["yes", "no"]}


def test_json_and_python_keep_their_strict_booleans(tmp_path: Path) -> None:
    """JSON has booleans of its own and a mapping is Python's: the text 'off' stays a wrong type there."""
    path = tmp_path / "spec.json"
    path.write_text('{"name": "a", "entrypoint": "jobs.train:main", "recovery": {"health_check": "off"}}')
    with pytest.raises(SpecError, match="recovery.health_check"):
        load_spec(path)
    with pytest.raises(SpecError, match="recovery.health_check"):
        load_spec({"name": "a", "entrypoint": "jobs.train:main", "recovery": {"health_check": "off"}})


def test_pipeline_files_use_the_same_loader(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(BASE, encoding="utf-8")
    path = tmp_path / "pipeline.yaml"
    path.write_text("stages:\n  yes: {spec: a.yaml}\n  no: {spec: a.yaml, after: [yes], set: [args.x=on]}\n",
                    encoding="utf-8")
    pipeline = load_pipeline(path)
    assert [s.name for s in pipeline.stages] == ["yes", "no"]
    assert pipeline.stage("no").after[0].stage == "yes" and pipeline.stage("no").overrides == ("args.x=on",)
