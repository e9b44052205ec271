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
from typing import Any, Iterable, Mapping

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator.errors import SpecError, UsageError
from orchestrator.spec import JobSpec
from orchestrator.validators import shown


#: Spec files larger than this are refused before they are read (a spec is a few KB).
MAX_FILE_BYTES = 1024 * 1024
#: A parsed spec may hold at most this many values (counting each use of a YAML alias) ...
MAX_NODES = 100_000
#: ... nested at most this deep.
MAX_DEPTH = 32


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (the last would silently win)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key; the base class reports it
                duplicate = False
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {shown(key)} appears twice in one mapping; keep one",
                    key_node.start_mark)
            if not isinstance(key, (list, dict)):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {shown(key)} appears twice in one object; keep one")
        out[key] = value
    return out


def _json_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a spec accepts; give a finite value")


def parse_text(text: str, as_json: bool) -> Any:
    """YAML (or JSON) text -> plain data, refusing duplicate keys, NaN/Infinity in JSON,
    over-deep nesting and alias bombs. Raises ValueError with a one-line reason."""
    try:
        if as_json:
            data = json.loads(text, object_pairs_hook=_json_pairs, parse_constant=_json_constant)
        else:
            data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except RecursionError:
        raise ValueError(f"nested too deeply (the limit is {MAX_DEPTH} levels)") from None
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ValueError(_one_line(exc)) from None
    _check_shape(data)
    return data


def _check_shape(data: Any) -> None:
    """Walk the data as a tree, as everything after loading will, and stop early when it is too
    big or too deep. YAML aliases share one object, so a few lines can expand to billions of
    values (an alias bomb); counting each use catches that before anything expands it."""
    count = 0
    stack = [(data, 1)]
    while stack:
        item, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ValueError(f"holds more than {MAX_NODES} values (YAML aliases count each time they are "
                             "used); a spec is a few dozen fields")
        if depth > MAX_DEPTH:
            raise ValueError(f"nested more than {MAX_DEPTH} levels deep")
        if isinstance(item, dict):
            stack.extend((x, depth + 1) for pair in item.items() for x in pair)
        elif isinstance(item, list):
            stack.extend((x, depth + 1) for x in item)


def read_spec_file(path: str | Path) -> dict[str, Any]:
    """Read one YAML or JSON file into a mapping; errors name the file and the fix."""
    p = Path(path)
    source = str(path)
    if p.is_dir():
        raise SpecError([f"is a directory; give a spec file (YAML or JSON) such as {p / 'spec.yaml'}"], source=source)
    if not p.is_file():
        raise SpecError([f"file not found (looked at {p.resolve()})"], source=source)
    try:
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise SpecError([f"is {size} bytes; a spec file may be at most {MAX_FILE_BYTES} bytes"], source=source)
        raw = p.read_bytes()[: MAX_FILE_BYTES + 1]
    except OSError as exc:
        raise SpecError([f"cannot read it: {exc.strerror}"], source=source) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SpecError([f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                         "save it as UTF-8"], source=source) from None
    try:
        data = parse_text(text, as_json=p.suffix.lower() == ".json")
    except ValueError as exc:
        raise SpecError([f"cannot parse: {exc}"], source=source) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError([f"the top level must be a mapping of fields, got {type(data).__name__}"], source=source)
    return data


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], parsed value)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part.strip() for part in key.split(".")):
        raise SpecError([f"--set {shown(item)}: expected key.path=value, e.g. --set distributed.port=29500"])
    try:
        value = parse_text(raw, as_json=False) if raw.strip() else ""
    except ValueError as exc:
        raise SpecError([f"--set {shown(item)}: cannot read the value: {exc}"]) from None
    return [part.strip() for part in key.split(".")], value


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


def load_spec(*sources: Any, overrides: Iterable[str] = (), executor: str | None = None) -> JobSpec:
    """Spec files (YAML or JSON paths), mappings and JobSpecs, deep-merged in order (later ones
    win key by key), then each ``"key.path=value"`` override in order (the value is read as
    YAML, as with ``--set``), then ``executor``. Raises SpecError naming the source, the field
    and the fix. (``orchestrator.load_spec``; the CLI calls it without importing the rest of the
    API.)"""
    if isinstance(overrides, (str, bytes)):
        raise UsageError("overrides is a list of 'key.path=value' strings, e.g. overrides=['nodes=2']")
    data: dict[str, Any] = {}
    names: list[str] = []
    for source in sources:
        if isinstance(source, JobSpec):
            data, name = deep_merge(data, source.model_dump(mode="json", exclude_defaults=True)), "<JobSpec>"
        elif isinstance(source, Mapping):
            data, name = deep_merge(data, json.loads(json.dumps(source, default=_refuse))), "<mapping>"
        elif isinstance(source, (str, Path)):
            data, name = deep_merge(data, read_spec_file(source)), str(source)
        else:
            raise UsageError(f"load_spec takes spec files, mappings or JobSpecs, not {type(source).__name__}")
        names.append(name)
    for item in overrides:
        data = apply_override(data, *parse_override(item))
    if executor is not None:
        data["executor"] = executor
    return spec_from_dict(data, source=", ".join(names) or None)


def _refuse(value: Any) -> Any:
    """Paths become text; any other object is refused (a spec is plain data)."""
    if isinstance(value, Path):
        return str(value)
    raise UsageError(f"a spec mapping holds a {type(value).__name__}; give text, numbers, true/false, "
                     "paths, lists and mappings only")


def spec_from_dict(data: dict[str, Any], source: str | None = None) -> JobSpec:
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc), source=source) from None


def format_validation_error(exc: ValidationError) -> list[str]:
    problems: list[str] = []
    for err in exc.errors(include_url=False):
        loc = [str(p) for p in err["loc"]]
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key" + _suggestion(loc)
        elif err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] == "literal_error":
            msg = f"got {shown(err['input'])}; {msg[0].lower()}{msg[1:]}"
        elif err["type"] == "dict_type" and loc == ["args"]:
            msg = ("args is a mapping of argument names to values (lr: 0.1); put positional arguments and "
                   f"short flags in extra_args, a list, got {_described(err['input'], False)}")
        elif err["type"] not in ("value_error", "assertion_error") and "input" in err:
            msg = f"{msg}, got {_described(err['input'], err['type'] == 'string_type')}"
        path = _dotted(loc)
        for line in msg.split("\n"):
            # Cross-field messages already start with the field they concern.
            line = line if len(line) <= 400 else line[:380] + "... (shortened)"
            problems.append(line if not path else f"{path}: {line}")
    return list(dict.fromkeys(problems))


def _described(value: Any, wants_text: bool) -> str:
    """What YAML made of a value, with a hint where YAML's reading surprises people."""
    kind = {bool: "true/false", int: "a number", float: "a number", str: "text", list: "a list",
            dict: "a mapping", type(None): "nothing (null)"}.get(type(value), type(value).__name__)
    if isinstance(value, (dict, list)):
        return kind
    hint = "; quote it to give text" if wants_text and kind in ("true/false", "a number", "date", "datetime") else ""
    return f"{kind} {shown(value)}{hint}"


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "literal", "union"}


def _dotted(loc: list[str]) -> str:
    # pydantic inserts union branch names ("list[...]", "literal[...]") into locations; drop them.
    parts = [p for p in loc if "[" not in p and not p.startswith("function-") and p not in _TYPE_TAGS]
    out = ""
    for p in parts:
        # A key is echoed no more than a value is: long or unprintable keys are shown as repr.
        p = p if len(p) <= 40 and p.isprintable() and p.strip() == p and p else shown(p, 40)
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
