"""MkDocs hook: the spec and CLI references, generated from the code at every build.

- The spec reference (``manual/reference/spec.md``, at ``<!-- generated: spec reference -->``):
  every field of ``JobSpec``, nested ones by their path (``slurm.partition``, ``after[].run``),
  with its type, default, limits and description (the models' ``Field`` descriptions and
  docstrings, what ``orchestrator schema`` prints) and an example. An example is the value the
  shipped example specs give the field (orchestrator/examples/, jobs/examples/), else one written
  here, else one derived from the type; each is validated by the field's own model at build time,
  so an example that no longer validates fails the build (``--strict``).
- The CLI reference (``manual/reference/cli.md``, at ``<!-- generated: cli reference -->``): every
  subcommand of the parser ``orchestrator.cli.build_parser`` builds, its usage and each argument.
  The page's hand-written table of commands must name every subcommand: one it lacks is a warning.

Neither imports torch (orchestrator.spec and orchestrator.cli do not).
"""

from __future__ import annotations

import argparse
import logging
import re
import types
import typing
from pathlib import Path
from typing import Any, Iterator

import yaml

log = logging.getLogger("mkdocs.hooks.reference")

REPO = Path(__file__).resolve().parents[3]
SPEC_MARK = "<!-- generated: spec reference -->"
CLI_MARK = "<!-- generated: cli reference -->"
EXAMPLE_SPECS = sorted((REPO / "orchestrator" / "examples").glob("*.yaml")) + sorted(
    (REPO / "jobs" / "examples").glob("*.yaml"))

#: What an example needs beside it (a rule between fields), shown with it: field path -> its siblings.
EXAMPLE_COMPANIONS: dict[str, dict[str, Any]] = {
    "recovery.spares": {"max_restarts": 2},
}

#: Examples for the fields the shipped example specs leave out, and whose type alone says little.
#: Each is validated at build time by the model that declares the field.
EXAMPLES: dict[str, Any] = {
    "args": {"lr": 0.1, "amp": True},
    "extra_args": ["-v", "data/"],
    "sweep": {"lr": [0.1, 0.01], "batch-size": [32, 64]},
    "env": {"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "4"},
    "workdir": "~/experiments/digits",
    "runs_dir": "/shared/runs",
    "distributed.rendezvous_dir": "/shared/rendezvous",
    "distributed.interface": ["eth0", "ib0"],
    "distributed.port": 29500,
    "checkpoint.dir": "/shared/ckpt/my-job",
    "checkpoint.interval_steps": 500,
    "slurm.partition": "gpu,gpu-preempt",
    "slurm.account": "proj-7",
    "slurm.qos": "high",
    "slurm.reservation": "maint",
    "slurm.wckey": "experiments",
    "slurm.mem": "64G",
    "slurm.mem_per_cpu": "4G",
    "slurm.mem_per_gpu": "40G",
    "slurm.cpus_per_task": 8,
    "slurm.cpus_per_gpu": 8,
    "slurm.constraint": "a100&ib",
    "slurm.setup": ["module load cuda/12.4 nccl", "source /shared/envs/train/bin/activate"],
    "slurm.python": "/shared/envs/train/bin/python",
    "slurm.gpu_type": "a100",
    "slurm.nodelist": "gpu[01-04]",
    "slurm.exclude": "gpu07",
    "slurm.extra_sbatch": {"mail-type": "END"},
    "local.devices": [0, 1, 2, 3],
    "local.emulate_nodes": 2,
    "local.ranks_per_node": 2,
    "local.timeout_s": 3600,
    "watchdog.stall_s": 600,
    "recovery.max_restarts": 3,
    "recovery.spares": 1,
    "recovery.on": ["crash", "node_failure", "hang", "unhealthy", "straggler"],
    "recovery.node_check": ["/usr/local/bin/gpu-health", "--quick"],
    "code.include": ["vocab/*.tsv"],
    "code.exclude": ["data/", "*.ckpt"],
    "container.runtime": "pyxis",
    "container.image": "nvcr.io#nvidia/pytorch:24.05-py3",
    "container.mounts": ["/scratch/data:/data:ro"],
    "container.options": ["--no-home"],
    "after[].run": "prep-1a2b3c4d",
    "stop_grace_s": 60,
}


# ---- the spec reference ----------------------------------------------------------------------

def _models() -> tuple[type, type]:
    from pydantic import BaseModel

    from orchestrator.spec.models import JobSpec

    return JobSpec, BaseModel


def _is_model(tp: Any) -> bool:
    _, base = _models()
    return isinstance(tp, type) and issubclass(tp, base)


def _args(tp: Any) -> tuple[Any, ...]:
    return typing.get_args(tp)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _nested_model(tp: Any) -> tuple[type | None, bool]:
    """The model a field holds (itself, optional, or a list of it), and whether it is a list."""
    if _is_model(tp):
        return tp, False
    if _is_union(tp):
        models = [a for a in _args(tp) if _is_model(a)]
        if len(models) == 1:
            return models[0], False
    if typing.get_origin(tp) is list and _args(tp) and _is_model(_args(tp)[0]):
        return _args(tp)[0], True
    return None, False


def _type_name(tp: Any) -> str:
    """A field's type in the words of the YAML a user writes."""
    if tp is type(None):
        return "null"
    if tp is Any:
        return "any value"
    if tp is bool:
        return "true/false"
    if tp is int:
        return "integer"
    if tp is float:
        return "number"
    if tp is str:
        return "text"
    if _is_model(tp):
        return "mapping"
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " | ".join(yaml_inline(a) for a in _args(tp))
    if _is_union(tp):
        return " | ".join(_type_name(a) for a in _args(tp))
    if origin is list:
        inner = _type_name(_args(tp)[0] if _args(tp) else Any)
        return f"list of ({inner})" if " | " in inner else f"list of {inner}"
    if origin is dict:
        key, value = _args(tp) or (str, Any)
        return f"mapping of {_type_name(key)} to {_type_name(value)}"
    return getattr(tp, "__name__", str(tp))


def _limits(field: Any) -> str:
    words = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤", "min_length": "at least", "max_length": "at most"}
    found = []
    for meta in field.metadata:
        for attr, word in words.items():
            value = getattr(meta, attr, None)
            if value is not None:
                found.append(f"{word} {value:g}" if isinstance(value, float) else f"{word} {value}")
    return ", ".join(found)


class _Yaml12Dumper(yaml.SafeDumper):
    """YAML as the spec loader reads it: only true/false are booleans (YAML 1.2), so `on`, `off`,
    `yes` and `no` are written unquoted, as a user writes them (`recovery: {on: [crash]}`)."""


_Yaml12Dumper.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeDumper.yaml_implicit_resolvers.items()}
_Yaml12Dumper.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                    list("tTfF"))


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    """A list of plain values in one line (`on: [crash, hang]`), a list of mappings as a block."""
    flat = all(not isinstance(item, (list, dict)) and " " not in str(item) for item in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flat or None)


_Yaml12Dumper.add_representer(list, _represent_list)


def _dump(value: Any, flow: bool) -> str:
    return yaml.dump(value, Dumper=_Yaml12Dumper, default_flow_style=flow, width=100, sort_keys=False,
                     allow_unicode=True)


def yaml_inline(value: Any) -> str:
    """A value as YAML writes it in one line (flow style)."""
    text = _dump(value, True).replace("\n", " ").strip()
    return text[:-4].strip() if text.endswith("\n...") else text.removesuffix("...").strip()


def _yaml_block(path: list[str], value: Any) -> str:
    """``slurm.partition`` = gpu as the nested YAML a spec holds."""
    data: Any = value
    for part in reversed(path):
        data = {part: data}
    return _dump(_listify(data), False).rstrip("\n")


def _listify(data: Any) -> Any:
    if isinstance(data, dict):
        out = {}
        for key, value in data.items():
            if key.endswith("[]"):
                out[key[:-2]] = [_listify(value)]
            else:
                out[key] = _listify(value)
        return out
    return data


def _flatten(data: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every field path a spec file sets, with its value (a list of mappings: ``after[].run``)."""
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}{key}"
            yield path, value
            if isinstance(value, dict):
                yield from _flatten(value, path + ".")
            elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                for item in value:
                    yield from _flatten(item, path + "[].")


def _shipped_examples() -> dict[str, tuple[Any, str]]:
    from orchestrator.spec.loading import parse_text  # YAML as specs are read: `on:` is text

    found: dict[str, tuple[Any, str]] = {}
    for path in EXAMPLE_SPECS:
        data = parse_text(path.read_text(encoding="utf-8"), as_json=False)
        for field_path, value in _flatten(data):
            found.setdefault(field_path, (value, str(path.relative_to(REPO))))
    return found


def _derived_example(annotation: Any, default: Any) -> tuple[bool, Any]:
    """A value of the type other than the default, where the type says one."""
    if annotation is bool:
        return True, not default
    options = []
    for tp in (_args(annotation) if _is_union(annotation) else (annotation,)):
        if typing.get_origin(tp) is typing.Literal:
            options += list(_args(tp))
    others = [o for o in options if o != default]
    if others:
        return True, others[0]
    if default is not None and not isinstance(default, (dict, list)) and not _is_model(type(default)):
        return True, default
    return False, None


def _check_example(model: type, name: str, value: Any, required: dict[str, Any]) -> str | None:
    """None if ``model`` accepts the example (with its other required fields), else why not."""
    from pydantic import ValidationError

    data = dict(required)
    data[name] = value
    try:
        model.model_validate(data)
    except ValidationError as exc:
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
    except Exception as exc:  # the spec's own SpecError
        return str(exc) or type(exc).__name__
    return None


def spec_fields() -> Iterator[tuple[str, type, str, Any]]:
    """(path, the model declaring it, the field's name, the field) for every field, depth first."""
    spec, _ = _models()

    def walk(model: type, prefix: str) -> Iterator[tuple[str, type, str, Any]]:
        for name, field in model.model_fields.items():
            path = prefix + name
            yield path, model, name, field
            nested, is_list = _nested_model(field.annotation)
            if nested is not None:
                yield from walk(nested, path + ("[]." if is_list else "."))

    yield from walk(spec, "")


def _sections() -> list[tuple[str, type, str]]:
    """(heading, model, path prefix): the top level, then each nested model, depth first."""
    spec, _ = _models()
    out = [("Top-level fields", spec, "")]
    for path, _owner, _name, field in spec_fields():
        nested, is_list = _nested_model(field.annotation)
        if nested is not None:
            out.append((_section_heading(path), nested, path + ("[]." if is_list else ".")))
    return out


def prose(text: str) -> str:
    """Plain text (a description, a help line) as Markdown that shows it as written: outside
    `code`, '<' starts no HTML tag and '*' or '_' no emphasis."""
    pieces = re.split(r"(`[^`]*`)", text)
    for i in range(0, len(pieces), 2):
        pieces[i] = (pieces[i].replace("\\", "\\\\").replace("<", "&lt;").replace("*", "\\*")
                     .replace("_", "\\_"))
    return "".join(pieces)


def _section_heading(name: str) -> str:
    return f"The `{name}` section"


def _docstring(model: type) -> str:
    text = (model.__doc__ or "").strip()
    return re.sub(r"\s*\n\s*", " ", text.split("\n\n")[0])


def _default_text(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is PydanticUndefined:
        return "required"
    if _is_model(type(value)):
        return "each field's default (below)"
    return f"`{yaml_inline(value)}`"


def spec_reference() -> str:
    shipped = _shipped_examples()
    lines: list[str] = []
    problems: list[str] = []
    required_examples: dict[type, dict[str, Any]] = {}
    for path, model, name, field in spec_fields():
        if field.is_required() and path in shipped:
            required_examples.setdefault(model, {})[name] = shipped[path][0]
        elif field.is_required() and path in EXAMPLES:
            required_examples.setdefault(model, {})[name] = EXAMPLES[path]
    by_model: dict[str, list[tuple[str, type, str, Any]]] = {}
    for entry in spec_fields():
        path = entry[0]
        prefix = path.rsplit(".", 1)[0] + "." if "." in path else ""
        by_model.setdefault(prefix, []).append(entry)

    for heading, model, prefix in _sections():
        lines += [f"## {heading}", ""]
        doc = _docstring(model)
        if doc:
            lines += [prose(doc), ""]
        if prefix:
            lines += [f"Fields under `{prefix.rstrip('.')}` ({model.__name__}):", ""]
        for path, owner, name, field in by_model.get(prefix, []):
            nested, _ = _nested_model(field.annotation)
            facts = [f"**Type:** {_type_name(field.annotation)}", f"**Default:** {_default_text(field)}"]
            limits = _limits(field)
            if limits:
                facts.append(f"**Limits:** {limits}")
            lines += [f"### `{path}`", "", " · ".join(facts), ""]
            description = field.description or (_docstring(nested) if nested else "")
            if description:
                lines += [prose(description), ""]
            if nested is not None:
                lines += [f"Its fields: [below](#{_slug(_section_heading(path))}).", ""]
                continue
            source = ""
            if path in shipped:
                value, where = shipped[path]
                source = f"from `{where}`"
            elif path in EXAMPLES:
                value = EXAMPLES[path]
            else:
                known, value = _derived_example(field.annotation, field.get_default(call_default_factory=True)
                                                if not field.is_required() else None)
                if not known:
                    problems.append(f"{path}: no example (add one to EXAMPLES in {Path(__file__).name})")
                    continue
            companions = EXAMPLE_COMPANIONS.get(path, {})
            why = _check_example(owner, name, value, {**required_examples.get(owner, {}), **companions})
            if why is not None:
                problems.append(f"{path}: the example {yaml_inline(value)!r} does not validate: {why}")
            parent = path.split(".")[:-1]
            shown = {**companions, path.split(".")[-1]: value} if companions else None
            block = _yaml_block(parent, shown) if shown else _yaml_block(path.split("."), value)
            lines += ["Example" + (f" ({source}):" if source else ":"), "", "```yaml", block, "```", ""]
    for problem in problems:
        log.warning("spec reference: %s", problem)
    return "\n".join(lines)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading, as the site's toc makes it (mkdocs.yml: pymdownx.slugs)."""
    return re.sub(r"[^a-z0-9_ -]", "", heading.lower()).replace(" ", "-")


# ---- the CLI reference -----------------------------------------------------------------------

def _invocation(action: argparse.Action) -> str:
    formatter = argparse.HelpFormatter("orchestrator", width=200)
    return formatter._format_action_invocation(action)  # argparse's own "-f, --follow" / "--set KEY=VALUE"


#: What a positional argument without a help text of its own is: the words the parser uses for it
#: where it has one (``orchestrator sync``).
UNDOCUMENTED = {"run": "run id (or a unique prefix) or run folder"}


def _argument_rows(parser: argparse.ArgumentParser) -> list[str]:
    exclusive = {id(a): group for group in parser._mutually_exclusive_groups for a in group._group_actions}
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        what = prose(action.help or (UNDOCUMENTED.get(action.dest, "") if not action.option_strings else ""))
        notes = []
        if action.choices is not None and not isinstance(action.choices, dict):
            notes.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
        shown_default = action.default not in (None, False, [], argparse.SUPPRESS) and bool(action.option_strings)
        if shown_default and "default" not in what:
            default = " ".join(map(str, action.default)) if isinstance(action.default, list) else action.default
            notes.append(f"default `{default}`")
        if action.required and action.option_strings:
            notes.append("required")
        group = exclusive.get(id(action))
        if group is not None:
            names = [_option_name(a) for a in group._group_actions]
            if group.required:
                notes.append("give exactly one of " + ", ".join(f"`{n}`" for n in names))
            else:
                notes.append("not with " + ", ".join(f"`{n}`" for n in names if n != _option_name(action)))
        if notes:
            what = f"{what} ({'; '.join(notes)})" if what else "; ".join(notes)
        rows.append(f"| `{_invocation(action)}` | {(what or '-').replace('|', chr(92) + '|')} |")
    return rows


def _option_name(action: argparse.Action) -> str:
    return action.option_strings[-1] if action.option_strings else action.dest


def cli_commands() -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of every subcommand the CLI lists (its hidden ones left out)."""
    from orchestrator.cli import build_parser

    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    return [(name, helps[name], p) for name, p in sub.choices.items() if name in helps]


def cli_reference(hand_written: str) -> str:
    from orchestrator.cli import build_parser

    top = build_parser()
    lines = ["## Options of every command", "",
             "Given before the command (`orchestrator --remote HOST status`).", "",
             "| option | what it does |", "| --- | --- |", *_argument_rows(top), ""]
    for name, help_text, parser in cli_commands():
        if not re.search(rf"orchestrator (?:--remote HOST )?(?:[\w-]+/)*{re.escape(name)}\b", hand_written):
            log.warning("cli reference: the table of commands does not name 'orchestrator %s'", name)
        parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=100)
        usage = parser.format_usage().strip().removeprefix("usage: ")
        lines += [f"## `orchestrator {name}`", "", prose(help_text[0].upper() + help_text[1:]) + ".", "",
                  "```", usage, "```", ""]
        rows = _argument_rows(parser)
        if rows:
            lines += ["| argument | what it does |", "| --- | --- |", *rows, ""]
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if SPEC_MARK in markdown:
        markdown = markdown.replace(SPEC_MARK, spec_reference())
    if CLI_MARK in markdown:
        hand_written = markdown.split(CLI_MARK, 1)[0]
        markdown = markdown.replace(CLI_MARK, cli_reference(hand_written))
    return markdown
