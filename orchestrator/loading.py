"""Spec files and ``--set`` overrides, turned into a JobSpec.

Precedence, lowest first (documented once, here and in the README):

1. the model's defaults;
2. each spec file, in the order given, deep-merged (later files win key by key);
3. each ``--set key.path=value``, in the order given (the value is read as a YAML scalar or
   flow list, so ``nodes=2`` is an int and ``distributed.interface=[eth0,ib0]`` a list);
4. ``--executor`` on the command line.

Errors name the file, the dotted key path and the fix, and raise ``SpecError`` (exit code 2).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator.errors import SpecError
from orchestrator.spec import JobSpec


def read_spec_file(path: str | Path) -> dict[str, Any]:
    """Read one YAML or JSON file into a mapping; errors name the file and line."""
    p = Path(path)
    if not p.is_file():
        raise SpecError([f"file not found (looked at {p.resolve()})"], source=str(path))
    text = p.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise SpecError([f"cannot parse: {_one_line(exc)}"], source=str(path)) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError([f"the top level must be a mapping of fields, got {type(data).__name__}"], source=str(path))
    return data


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], parsed value)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise SpecError([f"--set {item!r}: expected key.path=value, e.g. --set distributed.port=29500"])
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise SpecError([f"--set {item!r}: cannot read the value: {_one_line(exc)}"]) from None
    return key.split("."), value


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def apply_override(data: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    nested: Any = value
    for part in reversed(path):
        nested = {part: nested}
    return deep_merge(data, nested)


def merge_sources(
    files: Iterable[str | Path], overrides: Iterable[str] = (), executor: str | None = None
) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for f in files:
        data = deep_merge(data, read_spec_file(f))
    for item in overrides:
        data = apply_override(data, *parse_override(item))
    if executor is not None:
        data["executor"] = executor
    return data


def load_spec(
    files: Iterable[str | Path], overrides: Iterable[str] = (), executor: str | None = None
) -> JobSpec:
    files = list(files)
    data = merge_sources(files, overrides, executor)
    return spec_from_dict(data, source=", ".join(str(f) for f in files) or None)


def spec_from_dict(data: dict[str, Any], source: str | None = None) -> JobSpec:
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc), source=source) from None


def format_validation_error(exc: ValidationError) -> list[str]:
    problems: list[str] = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key" + _suggestion(loc)
        elif err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] == "literal_error":
            msg = f"got {err['input']!r}; {msg[0].lower()}{msg[1:]}"
        path = _dotted(loc)
        for line in msg.split("\n"):
            # Cross-field messages already start with the field they concern.
            problems.append(line if not path else f"{path}: {line}")
    return problems


def _dotted(loc: list[str]) -> str:
    # pydantic inserts union branch names ("list[...]", "literal[...]") into locations; drop them.
    parts = [p for p in loc if "[" not in p and not p.startswith("function-")]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out


def _suggestion(loc: list[str]) -> str:
    model: type[BaseModel] | None = JobSpec
    for part in loc[:-1]:
        field = model.model_fields.get(part) if model else None
        ann = getattr(field, "annotation", None)
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    if model is None:
        return ""
    close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f"; valid keys here: {', '.join(model.model_fields)}"


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())
