"""Hostile input the CLI's generated tests do not reach: the Python API (JobSpec objects changed
after validation, mappings with odd keys, odd arguments), YAML merge keys, Unicode classes,
the rank API's number types, ``report`` on damaged metrics and the debug executor's cleanup.

Each wrong input must end in one OrchestratorError naming the field and the fix: never a
traceback, never a hang. Where a class of input is involved it is generated (hypothesis).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import threading
import time
import unicodedata
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator import api
from orchestrator.core.errors import OrchestratorError, SpecError, UsageError
from orchestrator.spec.loading import MAX_DEPTH, MAX_NODES, SpecLoader, load_spec, parse_text
from orchestrator.plan import plan
from orchestrator.core.records import RunRecord, register
from orchestrator.spec.models import JobSpec
from orchestrator.spec.validators import NAME_MAX, NUMERIC_ENV, shown
from tests.unit.test_hostile_input import assert_clean_outcome, cli, field_value, hostile_text

EXAMPLES = int(os.environ.get("ORCH_HYPOTHESIS_EXAMPLES", "150"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=os.environ.get("CI") == "true",
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])
FEW = settings(SETTINGS, max_examples=max(10, EXAMPLES // 5))

BASE: dict[str, Any] = {"name": "probe", "entrypoint": "jobs.train:main", "runs_dir": "/srv/orch-hostile-api"}
TOP_FIELDS = ["name", "entrypoint", "args", "extra_args", "nodes", "gpus_per_node", "cpu_ranks_per_node", "strategy",
              "distributed", "checkpoint", "slurm", "local", "sweep", "env", "workdir", "watchdog", "executor",
              "runs_dir"]


def _problems(exc: SpecError, prefix: str) -> list[str]:
    return [p.removeprefix(prefix) for p in exc.problems]


def _one_error_line(exc: BaseException) -> None:
    """An OrchestratorError whose message is the project's format: a header and one line per problem,
    none of them echoing a value whole or an escape sequence."""
    assert isinstance(exc, OrchestratorError), f"{type(exc).__name__}: {exc}"
    for line in str(exc).splitlines():
        assert len(line) < 2000 and "\x1b" not in line


# ---- 1. the Python API validates every JobSpec it is given ------------------------------------------
@SETTINGS
@given(updates=st.dictionaries(st.sampled_from(TOP_FIELDS), field_value, min_size=1, max_size=3))
def test_a_jobspec_changed_with_model_copy_is_validated_again(updates: dict[str, Any]) -> None:
    """``model_copy(update=...)`` skips validation; the API does not: planning the copy gives exactly
    what planning the same fields as a mapping gives (the same spec, or the same problems)."""
    copied = JobSpec(**BASE).model_copy(update=updates)
    try:
        expected: Any = load_spec({**BASE, **updates})
    except SpecError as exc:
        expected = _problems(exc, "<mapping>: ")
    try:
        got: Any = api.as_spec(copied)
    except SpecError as exc:
        got = _problems(exc, "<JobSpec>: ")
    assert got == expected


@pytest.mark.parametrize("update, field", [
    ({"name": "../x"}, "name"),
    ({"name": "a\nb"}, "name"),
    ({"extra_args": ["ok", "x\n#SBATCH --wrap=id"]}, "extra_args"),
    ({"nodes": 1000, "cpu_ranks_per_node": 100}, "nodes"),
    ({"local": {"emulate_nodes": 100, "ranks_per_node": 1000}}, "local"),
    ({"nodes": "2"}, "nodes"),
    ({"nodes": True}, "nodes"),
    ({"no_such_field": 1}, "no_such_field"),
])
def test_run_submit_and_plan_refuse_an_unchecked_copy_before_anything_happens(
        tmp_path: Path, update: dict[str, Any], field: str) -> None:
    spec = JobSpec(**{**BASE, "runs_dir": str(tmp_path / "runs")})
    for executor in ("local", "slurm"):
        copied = spec.model_copy(update={**update, "executor": executor})
        for call in (lambda: api.plan_for(copied), lambda: api.run(copied, wait=False),
                     lambda: api.submit(copied)):
            with pytest.raises(SpecError) as info:
                call()
            assert f"<JobSpec>: {field}" in str(info.value)
            _one_error_line(info.value)
    assert not (tmp_path / "runs").exists(), "something was written for a refused spec"


def test_nested_models_changed_with_model_copy_are_validated_too() -> None:
    spec = JobSpec(**BASE)
    slurm = spec.slurm.model_copy(update={"extra_sbatch": {"comment": "a\nb"}, "python": "--overlap"})
    with pytest.raises(SpecError, match="slurm.extra_sbatch") as info:
        api.plan_for(spec.model_copy(update={"slurm": slurm, "executor": "slurm"}))
    assert "slurm.python" in str(info.value)


@SETTINGS
@given(fields=st.dictionaries(st.sampled_from(TOP_FIELDS), field_value, max_size=3))
def test_constructing_a_jobspec_raises_spec_error_with_load_specs_lines(fields: dict[str, Any]) -> None:
    """``JobSpec(nodes='2')`` raises the project's SpecError (not pydantic's ValidationError), with
    the very lines load_spec gives for the same fields."""
    data = {**BASE, **fields}
    try:
        expected = load_spec(data)
    except SpecError as exc:
        with pytest.raises(SpecError) as info:
            JobSpec(**data)
        assert info.value.problems == _problems(exc, "<mapping>: ")
        _one_error_line(info.value)
        return
    assert JobSpec(**data) == expected


def test_constructing_with_odd_keys_or_objects_names_them() -> None:
    with pytest.raises(SpecError, match=r"nodes: Input should be a valid integer, got text '2'"):
        JobSpec(**{**BASE, "nodes": "2"})
    with pytest.raises(SpecError, match=r"args: the key False is the boolean False, not text"):
        JobSpec(**{**BASE, "args": {False: 1}})
    with pytest.raises(SpecError, match=r"args.x: a spec mapping holds a object object"):
        JobSpec(**{**BASE, "args": {"x": object()}})
    from orchestrator.spec.models import SlurmSpec

    with pytest.raises(SpecError, match=r"partition: .* is not a safe slurm.partition name"):
        SlurmSpec(partition="a;b")


# ---- 2. YAML merge keys and aliases are counted before anything expands ------------------------
MERGE_BOMB = "\n".join(
    ["a: &a {" + ", ".join(f"k{i}: 0" for i in range(10)) + "}"]
    + [f"{n}: &{n} {{<<: [{', '.join(['*' + p] * 10)}]}}" for p, n in zip("abcdefgh", "bcdefghi")]
) + "\n"


def test_the_merge_key_bomb_is_refused_quickly(tmp_path: Path) -> None:
    assert len(MERGE_BOMB.encode()) < 700
    path = tmp_path / "bomb.yaml"
    path.write_text(MERGE_BOMB)
    code, _, err, seconds = cli("validate", str(path))
    assert_clean_outcome(code, err, seconds)
    assert code == 2 and "merge keys" in err and seconds < 2


def _chain(levels: int, fan: int, width: int, merge: bool) -> str:
    """``levels`` anchors, each using the previous one ``fan`` times (through a merge key or as
    aliases in a list); the first holds ``width`` values."""
    lines = ["l0: &l0 {" + ", ".join(f"k{i}: {i}" for i in range(width)) + "}"]
    for level in range(1, levels):
        uses = ", ".join([f"*l{level - 1}"] * fan)
        body = f"{{<<: [{uses}], own{level}: 1}}" if merge else f"[{uses}]"
        lines.append(f"l{level}: &l{level} {body}")
    return "\n".join(lines) + "\n"


@SETTINGS
@given(levels=st.integers(1, 12), fan=st.integers(1, 12), width=st.integers(1, 10), merge=st.booleans())
def test_generated_alias_and_merge_chains_are_bounded(levels: int, fan: int, width: int, merge: bool) -> None:
    start = time.monotonic()
    expanded = 2 * width * fan ** (levels - 1)  # the values of the last level alone, expanded
    small = 4 * (width + 2) * (fan + 1) ** levels < MAX_NODES  # everything, generously counted
    try:
        parse_text(_chain(levels, fan, width, merge), as_json=False)
        refused = ""
    except ValueError as exc:
        refused = str(exc)
    assert time.monotonic() - start < 2
    if expanded > MAX_NODES:
        assert "holds more than" in refused or "nested" in refused
    if small and levels < MAX_DEPTH - 2:
        assert not refused


def test_an_alias_cycle_and_a_deep_alias_chain_are_refused() -> None:
    with pytest.raises(ValueError, match="refers to a value that contains it"):
        parse_text("a: &a [1, *a]\n", as_json=False)
    deep = "\n".join(["x0: &x0 [1]"] + [f"x{i}: &x{i} [*x{i - 1}]" for i in range(1, 200)]) + "\n"
    with pytest.raises(ValueError, match="nested more than"):
        parse_text(deep, as_json=False)


# ---- 3. load_spec with odd mappings and odd overrides ----------------------------------------
odd_keys = st.one_of(st.integers(-5, 5), st.booleans(), st.none(), st.floats(allow_nan=False),
                     st.tuples(st.integers(0, 3), st.text(max_size=2)), st.binary(max_size=3), st.frozensets(st.integers(0, 2)))


@SETTINGS
@given(keys=st.lists(st.one_of(st.text(alphabet="abc", min_size=1, max_size=3), odd_keys), min_size=1, max_size=4),
       where=st.sampled_from(["args", "env", "sweep", "slurm.extra_sbatch", "distributed", ""]))
def test_non_text_keys_in_a_mapping_are_refused_naming_the_key(keys: list[Any], where: str) -> None:
    inner: dict[Any, Any] = {}
    for k in keys:
        inner.setdefault(k, [1] if where == "sweep" else "1")
    data: dict[Any, Any] = dict(BASE)
    target = data
    for part in [p for p in where.split(".") if p]:
        target = target.setdefault(part, {})
    target.update(inner)
    bad = [k for k in inner if not isinstance(k, str)]
    try:
        load_spec(data)
    except SpecError as exc:
        _one_error_line(exc)
        if bad:
            assert f"the key {shown(bad[0])}" in str(exc) and "not text" in str(exc)
        return
    except UsageError as exc:  # only for what is not spec data at all
        pytest.fail(f"UsageError for keys {keys!r}: {exc}")
    assert not bad, f"{bad} were accepted (turned into text)"


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1000, 100_000])
def test_a_deep_mapping_is_refused_without_recursion_error(depth: int) -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(depth):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(SpecError, match=f"nested more than {MAX_DEPTH} levels"):
        load_spec({**BASE, "args": deep})
    cycle: dict[str, Any] = {}
    cycle["self"] = cycle
    with pytest.raises(SpecError, match="nested more than"):
        load_spec({**BASE, "args": cycle})


def test_a_mapping_that_shares_one_object_many_times_is_bounded() -> None:
    shared = {f"k{i}": "v" for i in range(1000)}
    start = time.monotonic()
    with pytest.raises(SpecError, match=f"more than {MAX_NODES} values"):
        load_spec({**BASE, "sweep": {"x": [shared] * 1000}})
    assert time.monotonic() - start < 2


@SETTINGS
@given(overrides=st.one_of(st.none(), st.integers(), st.text(max_size=5), st.binary(max_size=5),
                           st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
                           st.lists(st.one_of(st.integers(), st.none(), st.binary(max_size=2)), min_size=1, max_size=2)))
def test_odd_overrides_are_a_usage_error(overrides: Any) -> None:
    with pytest.raises(UsageError, match="overrides|override is"):
        load_spec(BASE, overrides=overrides)


def test_numbers_of_any_type_in_a_mapping_are_numbers() -> None:
    np = pytest.importorskip("numpy")
    spec = load_spec({**BASE, "nodes": np.int64(2), "args": {"lr": np.float32(0.5), "f": Fraction(1, 4)}})
    assert spec.nodes == 2 and type(spec.nodes) is int and spec.args == {"lr": 0.5, "f": 0.25}
    with pytest.raises(UsageError, match="Decimal"):
        load_spec({**BASE, "args": {"lr": Decimal("0.1")}})


# ---- 4. numbers in env that str.isdigit() accepts and int() does not -------------------------
non_ascii_digit = st.characters(categories=["Nd", "No", "Nl"]).filter(lambda c: not c.isascii())


@SETTINGS
@given(name=st.sampled_from(sorted(NUMERIC_ENV)),
       value=st.lists(st.one_of(non_ascii_digit, st.sampled_from(list("0123456789,"))), min_size=1, max_size=6)
       .map("".join))
def test_env_numbers_the_orchestrator_reads_are_ascii(name: str, value: str) -> None:
    try:
        spec = load_spec({**BASE, "env": {name: value}})
    except SpecError as exc:
        assert f"env: {name} is" in str(exc) and "ASCII digits" in str(exc)
        return
    for part in value.split(","):  # what the launcher and orchestrator.node.malloc do with it
        assert part.isascii() and part.isdigit() and int(part) >= 0
    assert plan(spec).payload.env[name] == value


def test_superscript_two_is_refused_where_read_as_a_number_and_kept_elsewhere() -> None:
    for name in NUMERIC_ENV:
        with pytest.raises(SpecError, match=f"{name} is '²'"):
            load_spec({**BASE, "env": {name: "²"}})
    assert load_spec({**BASE, "env": {"MY_LABEL": "²"}}).env == {"MY_LABEL": "²"}


# ---- 5. every bidirectional control and invisible format character ------------------------------
BIDI_CLASSES = {"LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI"}
BIDI_CONTROLS = sorted({c for c in map(chr, range(sys.maxunicode + 1)) if unicodedata.bidirectional(c) in BIDI_CLASSES}
                       | {"\u061c", "\u200e", "\u200f"})
TEXT_FIELDS = [("args", "x"), ("extra_args", 0), ("env", "X"), ("slurm", "setup", 0), ("checkpoint", "dir"),
               ("workdir",), ("name",), ("slurm", "extra_sbatch", "comment")]


def _with_text(path: tuple[Any, ...], text: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(BASE))
    node: Any = data
    for part, nxt in zip(path, path[1:]):
        node = node.setdefault(part, [] if isinstance(nxt, int) else {})
    if isinstance(path[-1], int):
        node.append(text)
    else:
        node[path[-1]] = text
    return data


def test_the_bidi_controls_are_the_ones_of_the_red_team_report() -> None:
    expected = {"\u061c", "\u200e", "\u200f", *map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A))}
    assert expected <= set(BIDI_CONTROLS)


@pytest.mark.parametrize("ch", BIDI_CONTROLS, ids=lambda c: f"U+{ord(c):04X}")
def test_every_bidi_control_is_refused(ch: str) -> None:
    with pytest.raises(SpecError, match=f"bidirectional control U\\+{ord(ch):04X}"):
        load_spec(_with_text(("args", "x"), f"abc{ch}def"))


@SETTINGS
@given(ch=st.characters(categories=["Cf", "Cc", "Zl", "Zp"]), before=st.text(st.characters(categories=["L", "N"]),
                                                                             max_size=4),
       path=st.sampled_from(TEXT_FIELDS))
def test_every_format_or_control_character_is_refused_in_every_text_field(ch: str, before: str,
                                                                           path: tuple[Any, ...]) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(_with_text(path, f"a{before}{ch}b"))
    assert f"U+{ord(ch):04X}" in str(info.value) or "contains a" in str(info.value) or "contains an" in str(info.value)
    _one_error_line(info.value)


# ---- 6. slurm.python is never an srun option -----------------------------------------------------
@SETTINGS
@given(python=st.one_of(st.text(max_size=12).map(lambda t: "-" + t), hostile_text))
def test_slurm_python_never_starts_with_a_dash(python: str) -> None:
    try:
        spec = load_spec({**BASE, "executor": "slurm", "slurm": {"python": python}})
    except SpecError as exc:
        assert "slurm.python" in str(exc)
        return
    assert not python.startswith("-")
    payload = plan(spec).payload
    from orchestrator.core.interpreter import BOOTSTRAP

    assert payload.python == python
    assert payload.srun[payload.srun.index(BOOTSTRAP) - 3] == python  # python -u -c BOOTSTRAP


# ---- 7. '~' in paths is expanded, or refused ----------------------------------------------------
@SETTINGS
@given(rest=st.text(st.characters(categories=["L", "N"]), max_size=10))
def test_home_in_paths_is_expanded_and_the_plan_shows_it(rest: str) -> None:
    written = f"~/{rest}"
    spec = load_spec({**BASE, "workdir": written, "checkpoint": {"dir": written},
                      "distributed": {"init_method": "file", "rendezvous_dir": written}})
    real = os.path.expanduser(written)
    assert not real.startswith("~")
    assert spec.workdir == spec.checkpoint.dir == spec.distributed.rendezvous_dir == real
    payload = plan(spec).payload
    assert payload.workdir == os.path.abspath(real)
    assert payload.checkpoint.dir == os.path.abspath(real)
    assert payload.rendezvous_dir == os.path.abspath(real)


def _base_with(field: str, value: object) -> dict:
    """A copy of BASE with the dotted ``field`` set to ``value``."""
    data = json.loads(json.dumps(BASE))
    *parents, last = field.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return data


@pytest.mark.parametrize("field", ["workdir", "runs_dir", "checkpoint.dir", "distributed.rendezvous_dir"])
def test_home_of_an_unknown_user_is_refused(field: str) -> None:
    with pytest.raises(SpecError, match=f"{field}: .*names no user on this machine"):
        load_spec(_base_with(field, "~no-such-user-orch-test/x"))


# ---- 8. YAML keys that are not text say what was written -----------------------------------------
# yes/no/on/off are text: the spec loader reads booleans as YAML 1.2 does (tests/unit/test_yaml_booleans.py).
YAML_WORDS = ["true", "False", "TRUE", "1", "0x1f", "1.5", "1_000", ".inf", "~", "null", "2001-01-01", "017", "1:30"]
assert not any(isinstance(next(iter(yaml.load(f"{w}: 1", SpecLoader))), str) for w in YAML_WORDS)  # none is text


@SETTINGS
@given(word=st.sampled_from(YAML_WORDS), where=st.sampled_from(["args", "env", "slurm.extra_sbatch", "sweep", ""]))
def test_yaml_keys_that_are_not_text_show_what_was_written(tmp_path_factory: pytest.TempPathFactory, word: str,
                                                            where: str) -> None:
    value = "[1]" if where == "sweep" else "true"
    lines = ["name: a", "entrypoint: jobs.train:main"]
    if where:
        *parents, last = where.split(".")
        for depth, part in enumerate([*parents, last]):
            lines.append("  " * depth + f"{part}:")
        lines.append("  " * len(where.split(".")) + f"{word}: {value}")
    else:
        lines.append(f"{word}: {value}")
    path = tmp_path_factory.mktemp("yamlkey") / "spec.yaml"
    path.write_text("\n".join(lines) + "\n")
    code, _, err, seconds = cli("validate", str(path))
    assert_clean_outcome(code, err, seconds)
    assert code == 2
    assert f"the key {word!r}" in err and "quote it" in err, err
    if where:
        assert f"{where}: the key" in err
    if isinstance(next(iter(yaml.load(f"{word}: 1", SpecLoader))), bool):
        assert "boolean" in err and "true/false" in err


def test_args_false_is_reported_as_written(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("name: a\nentrypoint: jobs.train:main\nargs: {False: true}\n")
    code, _, err, _ = cli("validate", str(path))
    assert code == 2 and "args: the key 'False' became the boolean False" in err and "args[0]" not in err


# ---- 9. an override that cannot apply is blamed, not the file ---------------------------------------
@SETTINGS
@given(field=st.sampled_from(["extra_args", "slurm.setup", "args.x", "distributed.interface", "env"]),
       index=st.one_of(st.integers(0, 99).map(lambda i: f"[{i}]"), st.sampled_from(["[]", "[x]", "]", "["])),
       value=st.sampled_from(["x", "1", "[a]"]))
def test_list_item_overrides_name_the_override(tmp_path_factory: pytest.TempPathFactory, field: str, index: str,
                                               value: str) -> None:
    path = tmp_path_factory.mktemp("ov") / "base.yaml"
    path.write_text("name: a\nentrypoint: jobs.train:main\n")
    item = f"{field}{index}={value}"
    code, _, err, seconds = cli("validate", str(path), "--set", item)
    assert_clean_outcome(code, err, seconds)
    assert code == 2 and f"--set {item!r}" in err and str(path) not in err, err


@pytest.mark.parametrize("item, field", [("nodes=0", "nodes"), ("slurm.time=soon", "slurm.time"),
                                         ("distributed.port=80", "distributed.port"), ("args={a: [[1]]}", "args"),
                                         ("nodes=4096", "nodes")])
def test_a_bad_override_is_named_as_the_source(tmp_path: Path, item: str, field: str) -> None:
    path = tmp_path / "base.yaml"
    path.write_text("name: a\nentrypoint: jobs.train:main\ncpu_ranks_per_node: 32\nnodes: 2\n")
    code, _, err, _ = cli("validate", str(path), "--set", item)
    assert code == 2 and f"--set {item!r}: {field}" in err, err
    with pytest.raises(SpecError, match=re.escape(f"--set {item!r}: {field}")):
        load_spec(path, overrides=[item])


# ---- 10. Run.wait's timeout ------------------------------------------------------------------------
def _fake_run(tmp_path: Path, state: str) -> api.Run:
    run_dir = tmp_path / "runs" / "fake-0123abcd"
    (run_dir / "logs").mkdir(parents=True)
    rec = RunRecord(run_id="fake-0123abcd", run_dir=str(run_dir), executor="local", state=state, world_size=1)
    rec.save()
    register(rec)
    return api.Run.get(str(run_dir))


@pytest.mark.parametrize("timeout", [math.nan, -1, -0.001, -math.inf, "10", True, [1], Decimal("1"), 1j])
def test_wait_refuses_a_timeout_that_is_not_seconds(tmp_path: Path, timeout: Any) -> None:
    run = _fake_run(tmp_path, "COMPLETED")
    outcome: list[Any] = []

    def call() -> None:
        try:
            outcome.append(run.wait(timeout=timeout))
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion below
            outcome.append(exc)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(5)
    assert outcome, f"wait(timeout={timeout!r}) did not return"
    assert isinstance(outcome[0], UsageError), outcome[0]
    assert "timeout" in str(outcome[0]) and len(str(outcome[0]).splitlines()) == 1


@pytest.mark.parametrize("timeout", [math.inf, None, 0, 0.5, Fraction(1, 2)])
def test_wait_takes_any_real_number_of_seconds_and_inf_is_no_limit(tmp_path: Path, timeout: Any) -> None:
    assert _fake_run(tmp_path, "COMPLETED").wait(timeout=timeout) == "COMPLETED"


def test_wait_with_an_infinite_timeout_waits(tmp_path: Path) -> None:
    from orchestrator.core import procs

    run_dir = tmp_path / "runs" / "fake-0123abcd"
    run_dir.mkdir(parents=True)
    rec = RunRecord(run_id="fake-0123abcd", run_dir=str(run_dir), executor="local", state="RUNNING", world_size=1,
                    supervisor_pid=os.getpid(), supervisor_start=procs.start_time(os.getpid()))
    rec.save()
    register(rec)
    run = api.Run.get(str(run_dir))
    timer = threading.Timer(0.6, lambda: RunRecord.load(run_dir).update(state="COMPLETED"))
    timer.start()
    try:
        assert run.wait(timeout=math.inf) == "COMPLETED"
    finally:
        timer.cancel()


# ---- 11. the rank API takes numpy's numbers ------------------------------------------------------
@FEW
@given(data=st.data())
def test_heartbeat_and_metrics_take_any_number_type(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    np = pytest.importorskip("numpy")
    import jobs
    from jobs.metrics import MetricsWriter
    from orchestrator.core.progress import read_progress

    ints = [int, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
    reals = ints + [float, np.float16, np.float32, np.float64, Fraction]
    step_type, total_type = data.draw(st.sampled_from(ints)), data.draw(st.sampled_from(ints + [np.float64, float]))
    samples_type = data.draw(st.sampled_from(reals))
    step = data.draw(st.integers(0, 100))
    run_dir = tmp_path_factory.mktemp("rank")
    saved = os.environ.get("ORCH_RUN_DIR")
    os.environ["ORCH_RUN_DIR"] = str(run_dir)
    try:
        assert jobs.heartbeat(step_type(step), total=total_type(step), samples=samples_type(8)) is True
        with MetricsWriter(run_dir, rank=0) as metrics:
            metrics.train(step_type(step), np.float32(0.25))
            metrics.evaluation(step_type(1), step_type(step), np.float64(0.5), np.float16(1.0))
            metrics.throughput(step_type(1), samples_type(8), np.float64(2.0))
    finally:
        if saved is None:
            os.environ.pop("ORCH_RUN_DIR", None)
        else:
            os.environ["ORCH_RUN_DIR"] = saved
    report = read_progress(run_dir, 1)[0]
    assert report is not None and report.step == step and report.total == step
    from orchestrator.front.report import read_metrics

    assert [m["kind"] for m in read_metrics(run_dir)] == ["train", "eval", "throughput"]


@pytest.mark.parametrize("bad, error", [("3", TypeError), (None, TypeError), (1.5, ValueError), (math.nan, ValueError)])
def test_heartbeat_refuses_what_is_not_a_step_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: Any,
                                                    error: type) -> None:
    import jobs

    monkeypatch.setenv("ORCH_RUN_DIR", str(tmp_path))
    with pytest.raises(error, match="heartbeat: step"):
        jobs.heartbeat(bad)


# ---- 12. report on metrics it cannot read --------------------------------------------------------------
def _run_with_metrics(tmp_path: Path) -> Path:
    run_dir = tmp_path / "runs" / "rep-0123abcd"
    (run_dir / "metrics").mkdir(parents=True)
    RunRecord(run_id="rep-0123abcd", run_dir=str(run_dir), executor="local", state="COMPLETED", world_size=1).save()
    return run_dir


def _report_fails_in_one_line(run_dir: Path, *expected: str) -> None:
    code, _, err, _ = cli("report", str(run_dir))
    assert code != 0 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    for text in expected:
        assert text in err, err


def test_report_on_a_binary_metrics_file(tmp_path: Path) -> None:
    run_dir = _run_with_metrics(tmp_path)
    (run_dir / "metrics" / "rank-0.jsonl").write_bytes(b"\xff\xfe\x00garbage\x80")
    _report_fails_in_one_line(run_dir, "rank-0.jsonl", "not UTF-8")


def test_report_on_a_directory_where_a_metrics_file_should_be(tmp_path: Path) -> None:
    run_dir = _run_with_metrics(tmp_path)
    (run_dir / "metrics" / "rank-0.jsonl").mkdir()
    _report_fails_in_one_line(run_dir, "rank-0.jsonl")
    with pytest.raises(OrchestratorError, match="rank-0.jsonl is a directory, not a metrics file"):
        api.Run.get(str(run_dir)).report()


def test_report_on_a_fifo_where_a_metrics_file_should_be_does_not_hang(tmp_path: Path) -> None:
    run_dir = _run_with_metrics(tmp_path)
    os.mkfifo(run_dir / "metrics" / "rank-0.jsonl")
    outcome: list[BaseException | str] = []

    def call() -> None:
        try:
            outcome.append(api.Run.get(str(run_dir)).report())
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion below
            outcome.append(exc)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(5)
    assert outcome, "report() blocked on a FIFO"
    assert isinstance(outcome[0], OrchestratorError) and "not a regular file" in str(outcome[0])


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any file")
def test_report_on_an_unreadable_metrics_file(tmp_path: Path) -> None:
    run_dir = _run_with_metrics(tmp_path)
    path = run_dir / "metrics" / "rank-0.jsonl"
    path.write_text('{"kind": "train", "step": 1, "loss": 0.5}\n')
    path.chmod(0)
    try:
        _report_fails_in_one_line(run_dir, "rank-0.jsonl", "cannot be read")
    finally:
        path.chmod(0o600)


def test_report_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = _run_with_metrics(tmp_path)
    (run_dir / "metrics" / "rank-0.jsonl").write_text('{"kind": "train", "step": 1, "loss": 0.5}\n')
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    _report_fails_in_one_line(run_dir, "pip install matplotlib")


json_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=4)),
                           lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(st.sampled_from(
                                                       ["kind", "step", "loss", "epoch", "accuracy", "rank", "samples",
                                                        "seconds", "samples_per_s"]), inner, max_size=6)),
                           max_leaves=8)
record_kinds = st.fixed_dictionaries({"kind": st.sampled_from(["train", "eval", "throughput", "x"])},
                                     optional={k: st.one_of(st.integers(-3, 3), st.floats(), st.text(max_size=2),
                                                            st.none())
                                               for k in ["step", "loss", "epoch", "accuracy", "rank", "samples",
                                                         "seconds", "samples_per_s"]})


@FEW
@given(lines=st.lists(st.one_of(json_values.map(json.dumps), record_kinds.map(json.dumps), st.text(max_size=20)),
                      max_size=6),
       raw=st.binary(max_size=40))
def test_report_on_generated_metrics_never_raises_a_traceback(tmp_path_factory: pytest.TempPathFactory,
                                                               lines: list[str], raw: bytes) -> None:
    pytest.importorskip("matplotlib")
    run_dir = _run_with_metrics(tmp_path_factory.mktemp("rep"))
    (run_dir / "metrics" / "rank-0.jsonl").write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
    (run_dir / "metrics" / "rank-1.jsonl").write_bytes(raw)
    code, _, err, _ = cli("report", str(run_dir))
    assert "Traceback" not in err
    assert code == 0 or len(err.strip().splitlines()) == 1, err


# ---- 13. names longer than a file name can be ------------------------------------------------------
@SETTINGS
@given(length=st.integers(1, 600), char=st.sampled_from(["a", "é", "名"]), form=st.sampled_from(["module", "script"]))
def test_entrypoint_names_must_fit_the_filesystem(tmp_path_factory: pytest.TempPathFactory, length: int, char: str,
                                                   form: str) -> None:
    if form == "module":
        name = "a" * length
        entry = f"pkg.{name}:main"
        fits = length + 3 <= NAME_MAX
    else:
        name = char * length + ".py"
        entry = f"./{name}"
        fits = len(name.encode()) <= NAME_MAX
    tmp = tmp_path_factory.mktemp("entry")
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump({**BASE, "entrypoint": entry}, allow_unicode=True), encoding="utf-8")
    for command in ("validate", "plan"):
        code, _, err, seconds = cli(command, str(path))
        assert_clean_outcome(code, err, seconds)
        if not fits:
            assert code == 2 and "entrypoint" in err and str(NAME_MAX) in err, err
        elif form == "module":
            assert code == 0, err


@pytest.mark.parametrize("field", ["workdir", "runs_dir", "checkpoint.dir", "distributed.rendezvous_dir"])
def test_path_fields_must_fit_the_filesystem(field: str) -> None:
    with pytest.raises(SpecError, match=f"{field}: .*at most {NAME_MAX} bytes"):
        load_spec(_base_with(field, "/tmp/" + "x" * (NAME_MAX + 1) + "/y"))


# ---- 14. the debug executor leaves its caller as it found it ---------------------------------------
PROBE = '''
import os, sys

def main(argv):
    os.environ["PROBE_SET_BY_ENTRYPOINT"] = "1"
    os.environ.pop("PROBE_REMOVED_BY_ENTRYPOINT", None)
    os.environ["HOME_WAS"] = os.environ.get("HOME", "")
    os.chdir("/")
    how = argv[0]
    if how == "raise":
        raise RuntimeError("boom")
    if how == "exit3":
        sys.exit(3)
    if how == "exit0":
        sys.exit(0)
    if how == "interrupt":
        raise KeyboardInterrupt
    return {"how": how}
'''


@pytest.mark.parametrize("how", ["return", "raise", "exit3", "exit0", "interrupt"])
def test_a_debug_run_restores_the_working_directory_and_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        how: str) -> None:
    module = f"orch_debug_probe_{how}"
    (tmp_path / f"{module}.py").write_text(PROBE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PROBE_REMOVED_BY_ENTRYPOINT", "still here")
    monkeypatch.setenv("RANK", "caller's own")  # a rank variable the run overrides
    spec = {**BASE, "name": f"dbg-{how}", "entrypoint": f"{module}:main", "executor": "debug",
            "runs_dir": str(tmp_path / "runs"), "workdir": str(tmp_path / "wd"), "extra_args": [how]}
    env_before, cwd_before, path_before = dict(os.environ), os.getcwd(), list(sys.path)
    try:
        run = api.run(spec)
        assert run.state == ("FAILED" if how == "raise" else "COMPLETED")
    except SystemExit as exc:
        assert how == "exit3" and exc.code == 3
    except KeyboardInterrupt:
        assert how == "interrupt"
    finally:
        sys.modules.pop(module, None)
    assert os.getcwd() == cwd_before
    added = sorted(set(os.environ) - set(env_before))
    removed = sorted(set(env_before) - set(os.environ))
    changed = sorted(k for k in env_before if k in os.environ and os.environ[k] != env_before[k])
    assert (added, removed, changed) == ([], [], []), "the debug run changed the caller's environment"
    assert sys.path == path_before
