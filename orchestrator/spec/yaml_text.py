"""What users write as YAML or JSON (spec files, pipeline files, ``--set`` values, the user's
config file), read into plain data: YAML 1.2's booleans, no key given twice, no NaN in JSON, and
bounds on size and depth checked before aliases and merge keys expand (an alias bomb is refused
in a few lines). PyYAML and the standard library only, so that reading the config file
(``remote_settings``) costs no pydantic; ``loading`` turns the data into a JobSpec.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from orchestrator.spec.validators import shown

#: A parsed spec may hold at most this many values (counting each use of a YAML alias, and
#: each pair a YAML merge key ``<<`` copies in) ...
MAX_NODES = 100_000
#: ... nested at most this deep.
MAX_DEPTH = 32


def at(path: str) -> str:
    if len(path) > 120:
        path = f"{path[:100]}... ({path.count('.') + path.count('[')} levels)"
    return f"{path}: " if path else ""


def join(path: str, key: Any) -> str:
    """``path.key``, with a key that is long or not printable shown as its (shortened) repr."""
    key = str(key)
    key = key if len(key) <= 40 and key.isprintable() and key.strip() == key and key else shown(key, 40)
    return f"{path}.{key}" if path else key


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
            key = self.construct_object(key_node, deep=deep)
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
        raise ValueError(" ".join(str(exc).split())) from None
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


#: What YAML made of an unquoted key that is not text, by the tag it resolved to (booleans: below).
_KEY_BECAME = {"int": "became a number, not text", "float": "became a number, not text",
               "null": "became null (nothing), not text", "timestamp": "became a date, not text"}


def _check_yaml_key(node: yaml.Node, path: str) -> None:
    """A mapping key must be text. YAML reads some unquoted keys as other things (true, numbers,
    null, dates): say what the user wrote and what it became."""
    if node.tag == _YAML_STR:
        return
    if not isinstance(node, yaml.ScalarNode):
        kind = "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"
        raise ValueError(f"{at(path)}a key is {kind}; keys are text (names)")
    written, kind = node.value, node.tag.rsplit(":", 1)[-1]
    why = _KEY_BECAME.get(kind) or f"is tagged {shown(node.tag)}, not text"
    if kind == "bool":
        why = (f"became the boolean {SpecLoader.bool_values.get(written.lower())}, because YAML reads true/false "
               "unquoted as booleans")
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
