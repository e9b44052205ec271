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

import json
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator.errors import SpecError, UsageError
from orchestrator.spec import HOME_ELSEWHERE, JobSpec
from orchestrator.spec_data import MAX_DEPTH, MAX_NODES, at, join, located_problems, plain_data
from orchestrator.validators import shown


#: Spec files larger than this are refused before they are read (a spec is a few KB).
MAX_FILE_BYTES = 1024 * 1024


_YAML_BOOL = "tag:yaml.org,2002:bool"
#: YAML 1.2's core schema: only these plain scalars are booleans. PyYAML follows YAML 1.1, where
#: yes/no/on/off (any case) are booleans too, so ``recovery: {on: [crash]}`` became ``{True: [crash]}``.
_YAML12_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
#: The words YAML 1.1 (and so PyYAML's own loaders) read as booleans that YAML 1.2 reads as text.
YAML11_BOOLEANS = {**dict.fromkeys(("yes", "Yes", "YES", "on", "On", "ON"), True),
                   **dict.fromkeys(("no", "No", "NO", "off", "Off", "OFF"), False)}


class SpecLoader(yaml.SafeLoader):
    """The one YAML loader for what users write (spec files, pipeline files, ``--set`` values):
    YAML's safe loader with YAML 1.2's booleans (only true/false in its three spellings; yes, no,
    on, off stay text), refusing a key given twice in one mapping (the last would silently win)."""

    # Every other implicit type (ints, floats, nulls, timestamps) as SafeLoader has them, in order.
    yaml_implicit_resolvers = {
        first: [(tag, _YAML12_BOOL if tag == _YAML_BOOL else regexp) for tag, regexp in resolvers
                if tag != _YAML_BOOL or first in "tTfF"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

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
            data = _load_yaml(text)
    except RecursionError:
        raise ValueError(f"nested too deeply (the limit is {MAX_DEPTH} levels)") from None
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ValueError(_one_line(exc)) from None
    _check_shape(data)
    return data


def _load_yaml(text: str) -> Any:
    """``yaml.load`` in two steps: compose the node graph (aliases are references in it, merge keys
    not yet applied), check it (``_check_yaml_graph``), and only then construct the data, which
    is when aliases and merge keys expand."""
    loader = SpecLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_yaml_graph(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


_YAML_STR = "tag:yaml.org,2002:str"
_YAML_MERGE = "tag:yaml.org,2002:merge"


def _check_yaml_graph(root: yaml.Node) -> None:
    """Bound what the document expands to before anything expands it: each alias counts the size
    of what it names every time it is used, and a merge key (``<<: *a``, ``<<: [*a, *b]``) the pairs
    it copies in (PyYAML copies them into the mapping, so a chain of merges multiplies like an alias
    bomb while the mapping it builds stays small). One pass over the graph, each node sized once.
    Also refuses a key that YAML did not read as text (``true:`` is the boolean True, ``1:`` a
    number), naming what was written."""
    sized: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded size, expanded height)
    active: set[int] = set()

    def walk(node: yaml.Node, depth: int, path: str) -> tuple[int, int]:
        key = id(node)
        if key not in sized:
            if key in active:
                raise ValueError(f"{at(path)}a YAML alias refers to a value that contains it; a spec is a tree")
            if depth > MAX_DEPTH:
                raise ValueError(f"nested more than {MAX_DEPTH} levels deep")
            active.add(key)
            size, height = 1, 1
            children: list[tuple[yaml.Node, int, str]] = []
            if isinstance(node, yaml.SequenceNode):
                children = [(child, 1, f"{path}[{i}]") for i, child in enumerate(node.value)]
            elif isinstance(node, yaml.MappingNode):
                for key_node, value_node in node.value:
                    if key_node.tag == _YAML_MERGE:  # its pairs land in this mapping, at this depth
                        children.append((value_node, 0, path))
                        continue
                    _check_yaml_key(key_node, path)
                    name = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                    children += [(key_node, 1, path), (value_node, 1, join(path, name))]
            for child, step, child_path in children:
                child_size, child_height = walk(child, depth + step, child_path)
                size += child_size
                height = max(height, child_height + step)
                if size > MAX_NODES:
                    raise ValueError(f"holds more than {MAX_NODES} values (YAML aliases and merge keys count "
                                     "each time they are used); a spec is a few dozen fields")
            active.discard(key)
            sized[key] = (size, height)
        size, height = sized[key]
        if depth + height - 1 > MAX_DEPTH:
            raise ValueError(f"nested more than {MAX_DEPTH} levels deep")
        return size, height

    walk(root, 1, "")


def _check_yaml_key(node: yaml.Node, path: str) -> None:
    """A mapping key must be text. YAML reads some unquoted keys as other things (true, numbers,
    null, dates): say what the user wrote and what it became."""
    if node.tag == _YAML_STR:
        return
    if not isinstance(node, yaml.ScalarNode):
        kind = "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"
        raise ValueError(f"{at(path)}a key is {kind}; keys are text (names)")
    written = node.value
    kind = node.tag.rsplit(":", 1)[-1]
    if kind == "bool":
        became = SpecLoader.bool_values.get(written.lower())
        why = f"became the boolean {became}, because YAML reads true/false unquoted as booleans"
    elif kind in ("int", "float"):
        why = "became a number, not text"
    elif kind == "null":
        why = "became null (nothing), not text"
    elif kind == "timestamp":
        why = "became a date, not text"
    else:
        why = f"is tagged {shown(node.tag)}, not text"
    raise ValueError(f"{at(path)}the key {shown(written)} {why}; quote it to give the name: {shown(written)}: ...")


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
    if not isinstance(item, str):
        raise UsageError(f"an override is a 'key.path=value' string, not {type(item).__name__}: "
                         "e.g. overrides=['nodes=2']")
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part.strip() for part in key.split(".")):
        raise SpecError([f"--set {shown(item)}: expected key.path=value, e.g. --set distributed.port=29500"])
    if "[" in key or "]" in key:
        field = key.split("[")[0].strip()
        field = field if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]{0,60}", field) else "extra_args"
        raise SpecError([f"--set {shown(item)}: a key path names fields (a.b.c), not list items; set the whole "
                         f"list instead: --set '{field}=[a, b]'"])
    try:
        value = parse_text(raw, as_json=False) if raw.strip() else ""
    except ValueError as exc:
        problem = " ".join(str(exc).split())  # YAML quotes the value back: never whole
        problem = problem if len(problem) <= 300 else f"{problem[:280]}... (shortened)"
        raise SpecError([f"--set {shown(item)}: cannot read the value: {problem}"]) from None
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


def load_spec(*sources: Any, overrides: Iterable[str] = (), executor: str | None = None,
              home_elsewhere: bool = False) -> JobSpec:
    """Spec files (YAML or JSON paths), mappings and JobSpecs, deep-merged in order (later ones
    win key by key), then each ``"key.path=value"`` override in order (the value is read as
    YAML, as with ``--set``), then ``executor``. Raises SpecError naming the source, the field
    and the fix. (``orchestrator.load_spec``; the CLI calls it without importing the rest of the
    API.) ``home_elsewhere``: the spec is for another machine (``--remote``): '~' in the path
    fields (``spec.HOME_PATH_FIELDS``) stays as written, for that machine to expand."""
    if overrides is None or isinstance(overrides, (str, bytes, Mapping)) or not isinstance(overrides, Iterable):
        raise UsageError("overrides is a list of 'key.path=value' strings, e.g. overrides=['nodes=2'] "
                         f"(or [] for none), not {type(overrides).__name__}")
    data: dict[str, Any] = {}
    names: list[str] = []
    for source in sources:
        if isinstance(source, JobSpec):
            # Dumped and validated again: a JobSpec changed with model_copy(update=...) was never checked.
            name = "<JobSpec>"
            data = deep_merge(data, plain_data(source, name))
        elif isinstance(source, Mapping):
            name = "<mapping>"
            data = deep_merge(data, plain_data(source, name))
        elif isinstance(source, (str, Path)):
            found = read_spec_file(source)
            if Path(source).suffix.lower() != ".json":
                found = yaml11_booleans(found, JobSpec)
            data, name = deep_merge(data, found), str(source)
        else:
            raise UsageError(f"load_spec takes spec files, mappings or JobSpecs, not {type(source).__name__}")
        names.append(name)
    applied: list[tuple[str, str]] = []  # (the dotted path it sets, the override as given)
    for item in list(overrides):
        path, value = parse_override(item)
        data = deep_merge(data, yaml11_booleans(apply_override({}, path, value), JobSpec))
        applied.append((".".join(path), item))
    if executor is not None:
        data["executor"] = executor
    return spec_from_dict(data, source=", ".join(names) or None, overrides=applied, home_elsewhere=home_elsewhere)


def yaml11_booleans(data: Any, model: type[BaseModel]) -> Any:
    """``data`` (read from YAML) with yes/no/on/off as the booleans YAML 1.1 made of them, but only
    in fields that are true/false (``recovery.health_check: off``, ``--set slurm.exclusive=yes``):
    there they can mean nothing else, and specs written for YAML 1.1 keep working. Everywhere else
    (keys, args, env, extra_sbatch) the loader's YAML 1.2 text stays text."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for name, field in model.model_fields.items():
        key = field.alias or name
        if key not in out:
            continue
        value, kind = out[key], field.annotation
        inner = [kind] if get_origin(kind) is None else list(get_args(kind))
        if set(inner) - {type(None)} == {bool} and isinstance(value, str) and value in YAML11_BOOLEANS:
            out[key] = YAML11_BOOLEANS[value]  # bool, or bool | None
            continue
        models = [t for t in inner if isinstance(t, type) and issubclass(t, BaseModel)]
        if len(models) != 1:
            continue
        if get_origin(kind) is list and isinstance(value, list):
            out[key] = [yaml11_booleans(item, models[0]) for item in value]
        else:
            out[key] = yaml11_booleans(value, models[0])
    return out


def spec_from_dict(data: dict[str, Any], source: str | None = None,
                   overrides: Sequence[tuple[str, str]] = (), home_elsewhere: bool = False) -> JobSpec:
    """Validate; each problem names where it came from: the override that set its field, if one
    did (``--set 'nodes=0'``), else the sources. ``home_elsewhere``: as for ``load_spec`` (the
    path fields' '~' kept, and not checked against this machine's users and disk)."""
    try:
        return JobSpec.model_validate(data, context={HOME_ELSEWHERE: True} if home_elsewhere else None)
    except ValidationError as exc:
        problems = located_problems(exc, data, JobSpec)
    blamed = [_override_for(path, overrides) for path, _ in problems]
    if not any(blamed):
        raise SpecError([line for _, line in problems], source=source)
    prefix = f"{source}: " if source else ""
    raise SpecError([f"--set {shown(item)}: {line}" if item else f"{prefix}{line}"
                     for (_, line), item in zip(problems, blamed)])


def _override_for(path: str, overrides: Sequence[tuple[str, str]]) -> str | None:
    """The last override that set ``path`` or a field around or inside it."""
    for set_path, item in reversed(overrides):
        if path and (path == set_path or path.startswith((set_path + ".", set_path + "["))
                     or set_path.startswith(path + ".")):
            return item
    return None


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())
