"""A spec's data and its validation errors, below both the models and the loader: plain data
checked as a file's data is (``plain_data``), and pydantic's errors turned into one line per
problem that names the field and the fix (``format_validation_error``). ``spec.py`` uses it for
``JobSpec(...)`` called directly, ``loading.py`` for files, mappings and overrides.
"""

from __future__ import annotations

import difflib
import numbers
import re
from pathlib import PurePath
from typing import Any, Iterable, Mapping

from pydantic import BaseModel, ValidationError

from orchestrator.core.errors import SpecError, UsageError
from orchestrator.spec.validators import shown
from orchestrator.spec.yaml_text import MAX_DEPTH, MAX_NODES, at, join


def plain_data(value: Any, source: str, path: str = "", depth: int = 1, budget: list[int] | None = None) -> Any:
    """A Python mapping (or a JobSpec's dump) as the plain data a spec file holds, checked as a
    file's data is: keys are text (an int key is refused, not turned into text), at most
    MAX_DEPTH levels and MAX_NODES values. Paths become text, any integer or real number (numpy's
    too) a Python int or float, tuples lists, models their fields; any other object is refused."""
    budget = [0] if budget is None else budget
    budget[0] += 1
    if depth > MAX_DEPTH:
        raise SpecError([f"{at(path)}nested more than {MAX_DEPTH} levels deep"], source=source)
    if budget[0] > MAX_NODES:
        raise SpecError([f"holds more than {MAX_NODES} values; a spec is a few dozen fields"], source=source)
    if isinstance(value, BaseModel):
        value = _explicit(value)
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise SpecError([f"{at(path)}the key {shown(key)} is {_kind(key)}, not text; spec keys are names: "
                                 f"write {shown(str(key))}"], source=source)
            out[str(key)] = plain_data(item, source, join(path, key), depth + 1, budget)
        return out
    if isinstance(value, (list, tuple)):
        return [plain_data(x, source, f"{path}[{i}]", depth + 1, budget) for i, x in enumerate(value)]
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (str, PurePath)):
        return str(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise UsageError(f"{source}: {at(path)}a spec mapping holds a {type(value).__name__} object; give text, "
                     "numbers, true/false, paths, lists and mappings only")


def _explicit(model: BaseModel) -> dict[str, Any]:
    """A model's fields that differ from their defaults (so a JobSpec merged after a file changes
    only what it sets), by value or by type: ``model_copy(update={"nodes": True})`` is not the
    default 1 (True == 1), and a key pydantic does not know is kept, so validation refuses both."""
    out: dict[str, Any] = {}
    fields = type(model).model_fields
    for name, field in fields.items():
        value = getattr(model, name, None)
        default = field.get_default(call_default_factory=True)
        if isinstance(value, BaseModel) and type(value) is type(default):
            nested = _explicit(value)
            if nested:
                out[name] = nested
        elif not (type(value) is type(default) and value == default):
            out[name] = value
    for name, value in vars(model).items():  # set by model_copy(update=...) under a name no field has
        if name not in fields:
            out[name] = value
    return out


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "the boolean " + str(value)
    if isinstance(value, numbers.Number):
        return "a number"
    return "a " + type(value).__name__


def spec_error(exc: ValidationError, data: Mapping[str, Any], model: type[BaseModel]) -> SpecError:
    """The SpecError for a model constructed directly (``JobSpec(nodes='2')``): the same lines as
    load_spec's, from the same formatter."""
    try:
        plain = plain_data(data, "")
    except (SpecError, UsageError) as problem:
        return problem if isinstance(problem, SpecError) else SpecError([str(problem).removeprefix(": ")])
    return SpecError(format_validation_error(exc, plain, model))


def format_validation_error(exc: ValidationError, data: Any, model: type[BaseModel]) -> list[str]:
    """One line per problem, ``field.path: what is wrong and the fix``. ``data`` (what was
    validated) tells the keys the user wrote from the names pydantic adds to locations."""
    return list(dict.fromkeys(line for _, line in located_problems(exc, data, model)))


_LEADING_FIELD = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*):")


def located_problems(exc: ValidationError, data: Any, model: type[BaseModel]) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for err in exc.errors(include_url=False):
        loc = [str(p) for p in err["loc"]]
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key" + _suggestion(loc, model)
        elif err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] == "literal_error":
            msg = f"got {shown(err['input'])}; {msg[0].lower()}{msg[1:]}"
        elif err["type"] == "dict_type" and loc == ["args"]:
            msg = ("args is a mapping of argument names to values (lr: 0.1); put positional arguments and "
                   f"short flags in extra_args, a list, got {_described(err['input'], False)}")
        elif err["type"] not in ("value_error", "assertion_error") and "input" in err:
            msg = f"{msg}, got {_described(err['input'], err['type'] == 'string_type')}"
            msg += _exponent_hint(err["input"], err["type"])
        path = _dotted(err["loc"], data)
        for line in msg.split("\n"):
            # Cross-field messages already start with the field they concern.
            line = line if len(line) <= 400 else line[:380] + "... (shortened)"
            leading = _LEADING_FIELD.match(line)
            where = path or (leading.group(1) if leading else "")
            problems.append((where, line if not path else f"{path}: {line}"))
    return list(dict.fromkeys(problems))


def _described(value: Any, wants_text: bool) -> str:
    """What YAML made of a value, with a hint where YAML's reading surprises people."""
    kind = {bool: "true/false", int: "a number", float: "a number", str: "text", list: "a list",
            dict: "a mapping", type(None): "nothing (null)"}.get(type(value), type(value).__name__)
    if isinstance(value, (dict, list)) or value is None:
        return kind
    hint = "; quote it to give text" if wants_text and kind in ("true/false", "a number", "date", "datetime") else ""
    return f"{kind} {shown(value)}{hint}"


#: A number with an exponent that YAML 1.2 reads as a number and the spec loader, which reads numbers
#: as YAML 1.1 does (PyYAML), reads as text: 1e9, -2E+4, 1.0e9 (1.1 wants a dot and a signed exponent).
_EXPONENT = re.compile(r"([-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?))([eE])([-+]?)([0-9]+)")


def _exponent_hint(value: Any, error_type: str) -> str:
    """For text such as '1e9' given to a number field: how to write it so that it is a number."""
    match = _EXPONENT.fullmatch(value) if isinstance(value, str) and error_type in ("int_type", "float_type") else None
    if match is None:
        return ""
    number = float(value)
    whole = f"{int(number)}" if number.is_integer() and abs(number) < 1e16 else None
    if error_type == "int_type":
        return f"; write it in full: {whole}" if whole else ""
    mantissa, e, sign, exponent = match.groups()
    written = f"{mantissa if '.' in mantissa else mantissa + '.0'}{e}{sign or '+'}{exponent}"
    return (f"; YAML reads a number with an exponent as a number only with a dot and a signed exponent: write "
            f"{written}{f' or {whole}' if whole else ''}")


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "literal", "union"}


_UNKNOWN = object()


def _dotted(loc: Iterable[Any], data: Any = _UNKNOWN) -> str:
    """``distributed.interface[1]`` from pydantic's location. The validated data tells a key the
    user wrote (kept, whatever it looks like: 'extra_args[0]', 'str') from the names pydantic
    inserts (union branches such as 'list[str]', '[key]'), which are dropped."""
    out, node = "", data
    for p in loc:
        if isinstance(node, dict) and isinstance(p, str) and p in node:
            node = node[p]
        elif isinstance(node, list) and isinstance(p, int) and 0 <= p < len(node):
            node = node[p]
        elif isinstance(p, str) and ("[" in p or p.startswith("function-") or p in _TYPE_TAGS):
            continue  # a name pydantic inserted
        else:
            node = _UNKNOWN  # past the data: a missing field, say
        # A key is echoed no more than a value is: long or unprintable keys are shown as repr.
        out = f"{out}[{p}]" if isinstance(p, int) else join(out, p)
    return out


def _suggestion(loc: list[str], root: type[BaseModel]) -> str:
    model: type[BaseModel] | None = root
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
