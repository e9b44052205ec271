"""What the user reads and may paste back: suggested commands quoted for a shell, the entrypoint
that mixes the two forms refused at validation, an empty ``--set`` value read as empty text,
the quoting hint shown for the command line too, and ``plan``'s argv quoted as the ranks get it."""

from __future__ import annotations

import io
import shlex
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.core import ownership, shell_words
from orchestrator.core.errors import SpecError, SubmissionError
from orchestrator.spec.loading import load_spec, parse_override

BASE = {"name": "t", "entrypoint": "jobs.train:main"}


def _problem(*overrides: str, base: dict | None = None) -> str:
    with pytest.raises(SpecError) as caught:
        load_spec(base or BASE, overrides=list(overrides))
    return str(caught.value)


def _suggested(message: str, verb: str) -> list[str]:
    """The words of the command the message suggests after ``with ``, as a shell splits them."""
    quoted = message.split(f"orchestrator {verb} ", 1)[1]
    mark = message[message.index(f"orchestrator {verb} ") - 1]
    return shlex.split(f"orchestrator {verb} " + quoted.split(mark + " ", 1)[0].rstrip(mark))


# ---- BUG 6: a suggested command can be pasted, whatever the run folder's path ----------------------
@pytest.mark.parametrize("folder", ["my proj", "ünï 'q' #proj"])
def test_a_live_attempt_suggests_commands_that_paste_back_to_its_folder(tmp_path: Path, folder: str) -> None:
    run_dir = tmp_path / folder / "runs" / "longjob-2dc2d49a"
    run_dir.mkdir(parents=True)
    with ownership.take(run_dir):
        with pytest.raises(SubmissionError) as caught:
            ownership.take(run_dir)
    message = str(caught.value)
    assert _suggested(message, "status") == ["orchestrator", "status", str(run_dir)]
    assert _suggested(message, "cancel") == ["orchestrator", "cancel", str(run_dir)]


def test_a_plain_path_reads_as_before(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "x-1"
    run_dir.mkdir(parents=True)
    with ownership.take(run_dir):
        with pytest.raises(SubmissionError) as caught:
            ownership.take(run_dir)
    assert f"follow it with 'orchestrator status {run_dir}' or stop it with 'orchestrator cancel {run_dir}'" \
        in str(caught.value)


@pytest.mark.parametrize("words, shown", [
    (("orchestrator", "logs", "x-1", "--rank", 1), "'orchestrator logs x-1 --rank 1'"),
    (("orchestrator", "status", "/a b/x"), "\"orchestrator status '/a b/x'\""),
    (("orchestrator", "status", "/a'b/x"), "`orchestrator status '/a'\"'\"'b/x'`"),
])
def test_a_quoted_command_is_set_off_by_a_quote_it_does_not_hold(words: tuple, shown: str) -> None:
    assert shell_words.quoted_command(*words) == shown
    assert shlex.split(shell_words.command_line(*words)) == [str(w) for w in words]


# ---- BUG 7: 'train.py:main' mixes the two entrypoint forms -----------------------------------------
@pytest.mark.parametrize("entrypoint, script, module", [
    ("train.py:main", "train.py", "train:main"),
    ("./sub/train.py:main", "./sub/train.py", "sub.train:main"),
    ("/abs/my dir/train.py:run", "/abs/my dir/train.py", "package.module:run"),
])
def test_a_script_with_a_function_is_refused_naming_both_forms(entrypoint: str, script: str, module: str) -> None:
    problem = _problem(base={"name": "t", "entrypoint": entrypoint})
    assert (f"entrypoint: {entrypoint!r} mixes the two forms: a script runs as a whole ({script!r}), a function "
            f"is named by its module ({module!r})") in problem


def test_both_forms_alone_and_a_folder_with_a_colon_stay_accepted(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a:b").mkdir()
    for script in ("train.py", "a:b/train.py"):
        (tmp_path / script).write_text("print(1)\n")
    for entrypoint in ("train.py", "./a:b/train.py", "a:b/train.py", "jobs.train:main", "pkg.py_tools:main"):
        assert load_spec({"name": "t", "entrypoint": entrypoint}).entrypoint == entrypoint


# ---- --set: an empty value is empty text; the quoting hint shows the command-line form too --------
def test_an_empty_set_value_is_empty_text_and_a_null_is_refused_with_both_quoted_forms() -> None:
    """``--set env.X=`` is X='' as on a shell's command line; ``args.lr: null`` in a file (or
    ``--set args.lr=null``) is refused, naming how to quote an empty text in either place."""
    assert parse_override("args.lr=") == (["args", "lr"], "")
    assert parse_override("args.lr=''") == (["args", "lr"], "")
    assert load_spec(BASE, overrides=["args.lr="]).args == {"lr": ""}
    assert load_spec(BASE, overrides=["env.FOO="]).env == {"FOO": ""}
    null = _problem("args.lr=null")
    assert "args.lr is null (empty)" in null and """--set "args.lr=''" on the command line""" in null
    assert "None" not in _problem("runs_dir=null")


@pytest.mark.parametrize("item, yaml_form, set_form", [
    ("env.FOO=1", "FOO: '1' in YAML", """--set "env.FOO='1'" on the command line"""),
    ("env.FOO=true", "FOO: 'true' in YAML", """--set "env.FOO='true'" on the command line"""),
    ("env.FOO=null", "FOO: '' in YAML", """--set "env.FOO=''" on the command line"""),
    ("args.day=2024-01-01", "day: '2024-01-01' in YAML", """--set "args.day='2024-01-01'" on the command line"""),
])
def test_the_quoting_hint_shows_the_file_and_the_command_line_forms(item: str, yaml_form: str, set_form: str) -> None:
    problem = _problem(item)
    assert yaml_form in problem and set_form in problem
    fixed = set_form.split('"')[1]  # what the shell hands over for the suggested --set
    load_spec(BASE, overrides=[fixed])


# ---- plan shows the argv the ranks get, one shell word per argument ---------------------------------
def test_plan_quotes_the_command_line_and_the_sweep_args(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.front.display import print_plan
    from orchestrator.plan import plan

    monkeypatch.chdir(tmp_path)
    spec = load_spec({**BASE, "extra_args": ["-v", "posA", "pos B"], "sweep": {"bs": [1, "a b"]},
                      "code": {"snapshot": False}})
    buf = io.StringIO()
    print_plan(plan(spec, "local"), Console(file=buf, width=400))
    out = buf.getvalue()
    assert "entrypoint: jobs.train:main -v posA 'pos B'" in out
    assert "--bs 'a b' -v posA 'pos B'" in out


# ---- a problem of two fields blames the --set that set the other one ---------------------------------
def test_a_sweep_key_also_set_in_args_by_set_blames_the_set(tmp_path: Path) -> None:
    spec = tmp_path / "sweep.yaml"
    spec.write_text("name: t\nentrypoint: jobs.train:main\nsweep: {lr: [0.1, 0.2]}\n")
    with pytest.raises(SpecError) as caught:
        load_spec(spec, overrides=["args.lr=0.5"])
    assert str(caught.value).splitlines()[-1].strip() == (
        "--set 'args.lr=0.5': sweep.lr: also set in args (args.lr); the sweep overrides it per point, so remove "
        "args.lr")
