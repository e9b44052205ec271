"""Spec files and ``--set`` overrides, turned into a JobSpec.

Precedence, lowest first (documented once, here and in docs/manual/specs.md):

1. the model's defaults;
2. each spec file, in the order given, deep-merged (later files win key by key);
3. each ``--set key.path=value``, in the order given (the value is read as a YAML scalar or
   flow list, so ``nodes=2`` is an int and ``distributed.interface=[eth0,ib0]`` a list; an
   empty value is empty text, as on a shell's command line: ``env.X=`` sets X to '');
4. ``--executor`` on the command line.

Errors name the file, the dotted key path and the fix, and raise ``SpecError`` (exit code 2).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, get_args, get_origin

from pydantic import BaseModel, ValidationError

from orchestrator.core.errors import SpecError, UsageError
from orchestrator.spec.models import HOME_ELSEWHERE, JobSpec, mark_validated
from orchestrator.spec.spec_data import located_problems, plain_data
from orchestrator.spec.validators import shown
from orchestrator.spec.yaml_text import (MAX_DEPTH, MAX_NODES, YAML11_BOOLEANS, SpecLoader,  # noqa: F401 (re-exported)
                                    parse_text)


#: Spec files larger than this are refused before they are read (a spec is a few KB).
MAX_FILE_BYTES = 1024 * 1024


def read_spec_file(path: str | Path) -> dict[str, Any]:
    """Read one YAML or JSON file into a mapping; errors name the file and the fix."""
    p = Path(path)
    source = str(path)
    if p.is_dir():
        raise SpecError([f"is a directory; give a spec file (YAML or JSON) such as {p / 'spec.yaml'}"], source=source)
    if not p.is_file():
        raise SpecError([f"file not found (looked at {p.resolve()})"], source=source)
    not_spec = not_a_spec(source)
    if not_spec:
        raise SpecError([not_spec], source=source)
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


def not_a_spec(path: str) -> str | None:
    """Why ``path`` is no spec file, judged by its suffix (a script given where its spec belongs,
    an easy slip: ``orchestrator run train.py``), or None. Said before parsing: a script read as
    YAML fails with a parse error that names neither the slip nor the fix."""
    suffix = Path(path).suffix.lower()
    if suffix in (".py", ".pyw"):
        return (f"is a Python script, not a job spec (YAML or JSON): write a spec with "
                f"`entrypoint: {path}` and run that (see docs/manual/specs.md)")
    if suffix == ".ipynb":
        return ("is a Jupyter notebook, not a job spec (YAML or JSON): export it as a script "
                f"(jupyter nbconvert --to script {path}), write a spec whose `entrypoint` is that "
                "script and run the spec (see docs/manual/specs.md)")
    return None


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
    did (``--set 'nodes=0'``), or else one that set another field the problem names, else the
    sources. ``home_elsewhere``: as for ``load_spec`` (the path fields' '~' kept, and not checked
    against this machine's users and disk)."""
    try:
        spec = JobSpec.model_validate(data, context={HOME_ELSEWHERE: True} if home_elsewhere else None)
        return spec if home_elsewhere else mark_validated(spec)  # one for another machine is checked there again
    except ValidationError as exc:
        problems = located_problems(exc, data, JobSpec)
    blamed = [_override_for(path, overrides) or _named_override(line, overrides) for path, line in problems]
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


def _named_override(line: str, overrides: Sequence[tuple[str, str]]) -> str | None:
    """The last override of a field (a dotted path) that a problem about another field names
    (``sweep.lr: also set in args (args.lr)``, with ``--set args.lr=0.5``)."""
    for set_path, item in reversed(overrides):
        if "." in set_path and re.search(rf"(?<![\w.]){re.escape(set_path)}(?![\w.])", line):
            return item
    return None

