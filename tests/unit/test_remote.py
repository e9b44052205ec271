"""``--remote`` without a network: the settings, the ssh command line (every word reaches the remote
shell as one word), the CLI's own options stripped, and the login node's side of a submission
(refused paths, a checkout made exactly the shipped files)."""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.cli import _command_argv
from orchestrator.core.errors import UsageError
from orchestrator.remote import RemoteSettings, Ssh, load_settings, unpack_pngs
from orchestrator.remote.remote_checkout import update_checkout
from orchestrator.remote.remote_protocol import _header
from orchestrator.code.snapshot import SHIPPED_NAME

WORDS = st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=0,
                         max_size=12), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(WORDS)
def test_every_word_reaches_the_remote_shell_as_one_word(words: list[str]) -> None:
    """ssh hands its last argument to the user's shell: each word must arrive whole, whatever it holds."""
    argv = Ssh(RemoteSettings(host="login")).argv(["printf", "%s\\0", *words])
    assert argv[argv.index("--") + 1] == "login" and len(argv) == argv.index("--") + 3
    out = subprocess.run(["sh", "-c", argv[-1]], capture_output=True, check=True).stdout
    assert out.split(b"\0")[:-1] == [w.encode() for w in words]


def test_the_ssh_command_goes_through_the_master_in_batch_mode() -> None:
    ssh = Ssh(RemoteSettings(host="me@login", ssh=("ssh", "-F", "/cfg"), control_path="/s/%C"))
    argv = ssh.argv(["true"])
    assert argv[:3] == ["ssh", "-F", "/cfg"]
    assert "BatchMode=yes" in argv and "ControlMaster=no" in argv and "ControlPath=/s/%C" in argv
    assert "ssh -F /cfg -o ControlPath=/s/%C -M -o ControlPersist=yes -fN -- me@login" == ssh.open_command()


@pytest.mark.parametrize("host", ["-oProxyCommand=sh", "a b", "x;y", "$(id)", "login\n"])
def test_a_host_that_is_not_an_ssh_destination_is_refused(host: str, monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    monkeypatch.setenv("ORCHESTRATOR_CONFIG", str(tmp_path / "none.yaml"))
    with pytest.raises(UsageError, match="--remote: .* is not an ssh destination"):
        load_settings(host)


def test_the_config_file_is_read_and_its_mistakes_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.yaml"
    monkeypatch.setenv("ORCHESTRATOR_CONFIG", str(config))
    config.write_text("remote:\n  host: login\n  command: [/opt/venv/bin/orchestrator]\n  reconnect_s: 5\n")
    assert load_settings() == RemoteSettings(host="login", command=("/opt/venv/bin/orchestrator",), reconnect_s=5.0)
    assert load_settings("other").host == "other"
    config.write_text("remote:\n  host: login\n  comand: [x]\n")
    with pytest.raises(UsageError, match=r"remote\.comand: unknown setting"):
        load_settings()
    config.write_text("remote:\n  ssh: []\n")
    with pytest.raises(UsageError, match=r"remote\.ssh: give a non-empty list"):
        load_settings()


def test_the_config_file_has_yaml_1_2_booleans_and_no_key_twice(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """As specs are read (loading.SpecLoader): an unquoted on/off/yes/no is the word written, a
    real host name or command word here; YAML 1.1 (yaml.safe_load) made them True/False, refused."""
    config = tmp_path / "config.yaml"
    monkeypatch.setenv("ORCHESTRATOR_CONFIG", str(config))
    config.write_text("remote:\n  host: on\n  command: [orchestrator-wrapper, --color, off]\n  ssh: [ssh, -o, yes]\n")
    assert load_settings() == RemoteSettings(host="on", command=("orchestrator-wrapper", "--color", "off"),
                                             ssh=("ssh", "-o", "yes"))
    config.write_text("remote:\n  host: login\n  host: other\n")
    with pytest.raises(UsageError, match=r"cannot read the config file .*config\.yaml: .*'host' appears twice"):
        load_settings()


def test_list_with_a_config_file_reads_it_without_pydantic(tmp_path: Path) -> None:
    """``orchestrator list`` reads the config file (is remote.host set?) as specs are read, YAML
    1.2 and no key twice, but through ``yaml_text`` alone: the spec's models (pydantic, ~0.2 s
    of every such command) are never imported for it."""
    import os
    import sys

    config = tmp_path / "config.yaml"
    config.write_text("remote:\n  allow_runs_in_home: false\n")
    code = ("import sys\nfrom orchestrator.cli import main\nrc = main(['list'])\n"
            "print('RC', rc, 'HEAVY', sorted({m.split('.')[0] for m in sys.modules} & {'pydantic', 'torch'}))\n")
    env = {**os.environ, "ORCHESTRATOR_CONFIG": str(config), "ORCHESTRATOR_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip().endswith("RC 0 HEAVY []"), out.stdout + out.stderr


def test_the_login_node_gets_the_command_without_the_global_options() -> None:
    assert _command_argv(["--remote", "login", "status", "--json", "r1"]) == ["status", "--json", "r1"]
    assert _command_argv(["--remote=login", "--local", "logs", "-f", "r"]) == ["logs", "-f", "r"]
    assert _command_argv(["submit", "spec.yaml", "--set", "a=--remote"]) == ["submit", "spec.yaml", "--set", "a=--remote"]


def _entry(data: bytes, mode: str = "0o644") -> list:
    return [hashlib.sha256(data).hexdigest(), len(data), mode]


@pytest.mark.parametrize("path", ["../x.py", "/etc/passwd", "a/../../b", "a//b", "./a", ""])
def test_a_shipped_path_outside_the_project_is_refused(path: str) -> None:
    header = {"protocol": 1, "spec": {}, "project": "p-1", "cwd": ".", "files": {path: _entry(b"x")}}
    with pytest.raises(UsageError, match="refusing the shipped path|malformed"):
        _header(json.dumps(header).encode())


def test_a_checkout_becomes_exactly_what_was_shipped_and_keeps_what_jobs_wrote(tmp_path: Path) -> None:
    blobs, checkout = tmp_path / "blobs", tmp_path / "checkout"
    checkout.mkdir()

    def blob(data: bytes) -> list:
        entry = _entry(data)
        (blobs / entry[0][:2]).mkdir(parents=True, exist_ok=True)
        (blobs / entry[0][:2] / entry[0]).write_bytes(data)
        return entry

    update_checkout(checkout, {"train.py": blob(b"v1"), "old.py": blob(b"old")}, blobs, "abc", "")
    (checkout / "outputs.txt").write_text("written by a job")
    update_checkout(checkout, {"train.py": blob(b"v2"), "pkg/new.py": blob(b"new")}, blobs, None, "")
    assert (checkout / "train.py").read_bytes() == b"v2" and (checkout / "pkg" / "new.py").read_bytes() == b"new"
    assert not (checkout / "old.py").exists() and (checkout / "outputs.txt").exists()
    shipped = json.loads((checkout / SHIPPED_NAME).read_text())
    assert sorted(shipped["files"]) == ["pkg/new.py", "train.py"]


def test_only_plain_png_files_are_unpacked(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:") as tar:
        for name, data in (("loss.png", b"png"), ("../evil.png", b"x"), ("sub/a.png", b"y"), ("notes.txt", b"z")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert unpack_pngs(buffer.getvalue(), tmp_path / "out") == ["loss.png"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["loss.png"]


def _blob(blobs: Path, data: bytes) -> list:
    entry = _entry(data)
    (blobs / entry[0][:2]).mkdir(parents=True, exist_ok=True)
    (blobs / entry[0][:2] / entry[0]).write_bytes(data)
    return entry


def test_a_folder_in_the_checkout_is_never_removed_for_a_shipped_file(tmp_path: Path) -> None:
    """runs/ on the laptop became a link (git tracks it): the checkout's runs/ holds every cluster run."""
    blobs, checkout = tmp_path / "blobs", tmp_path / "checkout"
    (checkout / "runs" / "r1").mkdir(parents=True)
    (checkout / "runs" / "r1" / "ckpt.pt").write_text("precious")
    link = [hashlib.sha256(b"/mnt/ext/runs").hexdigest(), 0, "0o777", "/mnt/ext/runs"]
    with pytest.raises(UsageError, match="is a folder in the login node's checkout"):
        update_checkout(checkout, {"train.py": _blob(blobs, b"x"), "runs": link}, blobs, None, "")
    assert (checkout / "runs" / "r1" / "ckpt.pt").read_text() == "precious"


def test_nothing_is_written_or_removed_through_a_link_leading_out_of_the_checkout(tmp_path: Path) -> None:
    blobs, checkout, outside = tmp_path / "blobs", tmp_path / "checkout", tmp_path / "outside"
    outside.mkdir()
    (outside / "prep.py").write_text("someone else's")
    checkout.mkdir()
    update_checkout(checkout, {"data/prep.py": _blob(blobs, b"v1")}, blobs, None, "")
    # data/ became a link to a folder outside: the old data/prep.py is not removed through it
    (checkout / "data" / "prep.py").unlink()
    (checkout / "data").rmdir()
    (checkout / "data").symlink_to(outside)
    link = [hashlib.sha256(str(outside).encode()).hexdigest(), 0, "0o777", str(outside)]
    update_checkout(checkout, {"data": link}, blobs, None, "")
    assert (outside / "prep.py").read_text() == "someone else's"
    with pytest.raises(UsageError, match="link leading out"):
        update_checkout(checkout, {"data/new.py": _blob(blobs, b"n")}, blobs, None, "")
    assert not (outside / "new.py").exists()


def test_a_login_node_of_another_version_says_so_before_parsing(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import VERSION_MISMATCH, main

    assert main(["--client-version", "9.9.9", "submit", "--an-option-from-the-future", "x"]) == VERSION_MISMATCH
    assert "install the same version on both" in capsys.readouterr().err


def test_options_are_never_abbreviated() -> None:
    from orchestrator.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--rem", "login", "status"])


def test_remote_and_local_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import main

    assert main(["--remote", "login", "--local", "status"]) == 2
    assert "contradict" in capsys.readouterr().err


def test_an_empty_report_stream_unpacks_nothing(tmp_path: Path) -> None:
    assert unpack_pngs(b"", tmp_path / "out") == []


# ---- the client id: the login node's checkout keyed by this machine, never by its host name ----------
def test_the_client_id_is_made_once_beside_the_config_and_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.remote import CLIENT_ID_FILE, client_id

    monkeypatch.setenv("ORCHESTRATOR_CONFIG", str(tmp_path / "cfg" / "config.yaml"))
    first = client_id(RemoteSettings(host="login"))
    assert re.fullmatch(r"[0-9a-f]{32}", first)
    assert (tmp_path / "cfg" / CLIENT_ID_FILE).read_text().strip() == first
    assert client_id(RemoteSettings(host="login")) == first
    assert client_id(RemoteSettings(host="login", client_id="my-laptop.2")) == "my-laptop.2"  # the config's wins


def test_first_submissions_at_once_agree_on_one_client_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.remote import client_id

    monkeypatch.setenv("ORCHESTRATOR_CONFIG", str(tmp_path / "config.yaml"))
    barrier = threading.Barrier(8)

    def one() -> str:
        barrier.wait()
        return client_id(RemoteSettings(host="login"))

    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(lambda _: one(), range(8)))
    assert len(ids) == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["client-id"]


def test_a_damaged_client_id_file_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.remote import client_id

    monkeypatch.setenv("ORCHESTRATOR_CONFIG", str(tmp_path / "config.yaml"))
    (tmp_path / "client-id").write_text("not an id: spaces\n")
    with pytest.raises(UsageError, match=r"client-id holds no client id .*put back the id .*or remove the file"):
        client_id(RemoteSettings(host="login"))
    config = tmp_path / "config.yaml"
    config.write_text("remote:\n  client_id: 'a b'\n")
    with pytest.raises(UsageError, match=r"remote\.client_id: 'a b' is not an id"):
        load_settings()


def test_the_checkout_name_stays_when_the_host_name_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """macOS renames the machine on another network: the checkout (and a relative runs_dir in it)
    must stay, so the next submit resumes instead of starting over. The older, host-named key is
    still sent, for the login node to find a checkout an older version made."""
    import socket

    from orchestrator.remote import legacy_project_name, project_name

    monkeypatch.setattr(socket, "gethostname", lambda: "alices-mbp.home")
    name, old = project_name("/Users/alice/proj", "c0ffee"), legacy_project_name("/Users/alice/proj")
    monkeypatch.setattr(socket, "gethostname", lambda: "alices-mbp.eduroam.example.org")
    assert project_name("/Users/alice/proj", "c0ffee") == name
    assert legacy_project_name("/Users/alice/proj") != old
    assert name.startswith("proj-") and old.startswith("proj-") and name != old
    assert project_name("/Users/alice/proj", "other-laptop") != name
    assert project_name("/Users/alice/other/proj", "c0ffee") != name


# ---- plan: the cluster's plan is made there ---------------------------------------------------------------
def _plan_args(tmp_path: Path, executor: str | None = None, remote: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(spec=[str(tmp_path / "spec.yaml")], overrides=[], executor=executor, remote=remote,
                           local=False, json=False, node=None, rank=None)


@pytest.mark.parametrize("spec_executor,flag,configured,expected", [
    ("slurm", None, True, "login"),      # a SLURM plan is the cluster's
    ("local", None, True, None),         # a local plan stays here
    ("local", "slurm", True, "login"),
    ("slurm", "local", True, None),
    ("slurm", None, False, None),        # no login node configured: here, as before
])
def test_plan_goes_to_the_login_node_for_a_slurm_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      spec_executor: str, flag: str | None, configured: bool,
                                                      expected: str | None) -> None:
    from orchestrator.remote import plan_host

    config = tmp_path / "config.yaml"
    monkeypatch.setenv("ORCHESTRATOR_CONFIG", str(config))
    if configured:
        config.write_text("remote:\n  host: login\n")
    (tmp_path / "spec.yaml").write_text(f"name: p\nentrypoint: jobs.train:main\nexecutor: {spec_executor}\n"
                                        "checkpoint: {dir: ~someone-only-on-the-cluster/x}\n")
    assert plan_host(_plan_args(tmp_path, flag)) == expected
    assert plan_host(_plan_args(tmp_path, flag, remote="other")) == "other"  # --remote HOST: always there


def test_plan_with_local_or_on_the_login_node_itself_stays_here(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.cli import _remote_target, build_parser

    config = tmp_path / "config.yaml"
    monkeypatch.setenv("ORCHESTRATOR_CONFIG", str(config))
    config.write_text("remote:\n  host: login\n")
    (tmp_path / "spec.yaml").write_text("name: p\nentrypoint: jobs.train:main\nexecutor: slurm\n")
    spec = str(tmp_path / "spec.yaml")
    assert _remote_target(build_parser().parse_args(["plan", spec])) == "login"
    assert _remote_target(build_parser().parse_args(["--local", "plan", spec])) is None
    assert _remote_target(build_parser().parse_args(["--client-version", "x", "plan", spec])) is None
    assert _remote_target(build_parser().parse_args(["plan", spec, "--executor", "local"])) is None


def test_a_remote_plan_of_a_local_run_is_refused_before_connecting(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from unittest import mock

    from orchestrator import remote

    (tmp_path / "spec.yaml").write_text("name: p\nentrypoint: jobs.train:main\n")
    monkeypatch.chdir(tmp_path)
    ssh = mock.Mock(spec=remote.Ssh)
    with pytest.raises(UsageError, match="--remote plan shows the cluster's plan of a SLURM job, and --executor "
                                         "local runs on this machine"):
        remote.plan(ssh, _plan_args(tmp_path, "local", remote="login"))
    assert ssh.mock_calls == []
