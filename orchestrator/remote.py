"""``orchestrator --remote HOST <command>``: operate a cluster from a laptop, over the system's OpenSSH.

Every command is one SSH session through a ControlMaster connection the user opened once
(``ssh -M``: it asks for the password or second factor then), run in ``BatchMode`` (no prompt can
hang a command; clusters that require 2FA work). When no master is up, the error gives the exact
``ssh -M`` command. What runs there is the orchestrator's own CLI (``remote.command``), given as
an argument vector: each word is quoted for the remote shell, and nothing of a spec travels on
a command line (``submit`` sends the resolved spec on stdin).

- ``submit`` validates the spec here, scans the project here (``orchestrator.snapshot``), and in
  the same session sends the manifest, receives the list of files the login node lacks, sends
  only those, and the login node (``remote_receive``) updates its checkout of the project and
  submits from it. The local copy can be deleted once ``submit`` returns.
- ``status``, ``list``, ``cancel``, ``stacks``, ``logs``: the remote command, its output here.
- ``logs -f`` and ``submit --wait/--follow`` survive a dropped connection: they wait for the
  master to come back (bounded), reconnect, and go on where the output stopped.
- ``report``: the text here, and the PNGs copied back into ``./<run>-report/``.

The user's defaults live in ``$ORCHESTRATOR_CONFIG`` (default
``${XDG_CONFIG_HOME:-~/.config}/orchestrator/config.yaml``)::

    remote:
      host: login.cluster.example          # an ssh destination or a Host of ~/.ssh/config
      ssh: [ssh]                           # the ssh command (add -F FILE, -p PORT...)
      control_path: ~/.ssh/orchestrator-%C # the master's socket (ssh's ControlPath tokens)
      command: [orchestrator]              # the orchestrator on the login node
      reconnect_s: 600                     # how long a follow waits for the connection to return
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Optional, Sequence

from orchestrator import __version__
from orchestrator.errors import OrchestratorError, UsageError

#: ssh's exit status when the connection (not the remote command) failed.
SSH_FAILED = 255
#: Exit status of a remote orchestrator whose version differs from the client's.
VERSION_MISMATCH = 3
PROTOCOL = 1
#: Commands that run on the login node under --remote; the others stay local (validate, plan) or
#: make no sense there (run, demo).
REMOTE_COMMANDS = ("submit", "status", "list", "logs", "stacks", "cancel", "report")


class RemoteError(OrchestratorError):
    """The login node could not be reached, or refused the command."""


@dataclass(frozen=True)
class RemoteSettings:
    """The ``remote:`` section of the user's config (a dataclass, not a pydantic model: every
    remote command pays for its import, and the fields are few)."""

    host: Optional[str] = None  # ssh destination: user@host, or a Host of ~/.ssh/config
    ssh: tuple[str, ...] = ("ssh",)  # the ssh command and its options
    control_path: str = "~/.ssh/orchestrator-%C"  # the ControlMaster socket (ssh tokens allowed)
    command: tuple[str, ...] = ("orchestrator",)  # the orchestrator's command on the login node
    reconnect_s: float = 600.0  # how long a follow waits for the connection to come back

    @classmethod
    def parse(cls, data: dict[str, Any]) -> RemoteSettings:
        """Checked field by field; raises ValueError("field: why")."""
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown setting (known: host, ssh, control_path, command, reconnect_s)")
        host = data.get("host")
        if host is not None:
            _check_host(host)
        words = {}
        for name in ("ssh", "command"):
            value = data.get(name, getattr(cls, name))
            if not isinstance(value, (list, tuple)) or not value or not all(isinstance(w, str) and w for w in value):
                raise ValueError(f"{name}: give a non-empty list of words, e.g. [{getattr(cls, name)[0]}]")
            words[name] = tuple(value)
        control = data.get("control_path", cls.control_path)
        if not isinstance(control, str) or not control:
            raise ValueError("control_path: give a path, e.g. ~/.ssh/orchestrator-%C")
        reconnect = data.get("reconnect_s", cls.reconnect_s)
        if isinstance(reconnect, bool) or not isinstance(reconnect, (int, float)) or not 0 <= reconnect <= 86400:
            raise ValueError("reconnect_s: give a number of seconds from 0 to 86400")
        return cls(host=host, ssh=words["ssh"], control_path=control, command=words["command"],
                   reconnect_s=float(reconnect))


def _check_host(host: Any) -> None:
    """Raise ValueError("host: why") unless ``host`` can only be read by ssh as its destination:
    an empty one would name nothing, one starting with '-' would be read as an option."""
    why = None
    if host == "":
        why = "it is empty"
    elif isinstance(host, str) and host.startswith("-"):
        why = "it starts with '-', which ssh would read as an option"
    if why is not None or not isinstance(host, str) or not re.fullmatch(r"[A-Za-z0-9_.@%:\[\]-]+", host):
        raise ValueError(f"host: {host!r} is not an ssh destination{f' ({why})' if why else ''}: give user@host or "
                         "a Host name of ~/.ssh/config")


def check_host(host: str) -> None:
    """Refuse ``--remote HOST`` at once when HOST names no login node: ``--remote ''`` would
    otherwise fall back to the config file or to running here, and ``--remote=-oX`` reach ssh
    as an option."""
    try:
        _check_host(host)
    except ValueError as exc:
        raise UsageError(f"--remote{str(exc)[len('host'):]} (or leave --remote out to use remote.host of "
                         f"{config_path()}, or give --local to run here)") from None


def config_path() -> Path:
    env = os.environ.get("ORCHESTRATOR_CONFIG")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "orchestrator" / "config.yaml"


def load_settings(host: Optional[str] = None) -> RemoteSettings:
    """The ``remote:`` section of the user's config file, with ``--remote HOST`` on top.

    The file is read as specs are (``loading.parse_text``): YAML 1.2's booleans, so an unquoted
    ``host: on`` or a command word ``off`` stays the text written (PyYAML's YAML 1.1 would make
    them True and False), and a setting given twice is refused rather than the last one winning."""
    from orchestrator.loading import parse_text

    path = config_path()
    data: dict[str, Any] = {}
    if path.is_file():
        try:
            loaded = parse_text(path.read_text(encoding="utf-8"), as_json=False) or {}
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise UsageError(f"cannot read the config file {path}: {exc}") from None
        if not isinstance(loaded, dict) or not isinstance(loaded.get("remote", {}), dict):
            raise UsageError(f"{path}: expected a mapping with a 'remote:' mapping in it")
        data = dict(loaded.get("remote") or {})
    if host is not None:
        data["host"] = host
    try:
        return RemoteSettings.parse(data)
    except ValueError as exc:
        where = "--remote" if host is not None and str(exc).startswith("host:") else f"{path}: remote."
        raise UsageError(f"{where}{str(exc) if where.endswith('.') else str(exc)[len('host'):]}") from None


class Ssh:
    """One login node, reached through the user's ControlMaster."""

    def __init__(self, settings: RemoteSettings) -> None:
        if not settings.host:
            raise UsageError("no remote host: pass --remote HOST, or set remote.host in " + str(config_path()))
        self.settings = settings
        self.host = settings.host
        self.control_path = os.path.expanduser(settings.control_path)

    def _base(self) -> list[str]:
        return [*self.settings.ssh, "-o", f"ControlPath={self.control_path}"]

    def open_command(self) -> str:
        """What the user runs once to open the master (it may ask for a password or a second factor)."""
        return shlex.join([*self._base(), "-M", "-o", "ControlPersist=yes", "-fN", "--", self.host])

    def master_up(self) -> bool:
        try:
            return subprocess.run([*self._base(), "-O", "check", "--", self.host], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=15).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def require_master(self) -> None:
        if not self.master_up():
            raise RemoteError(f"no SSH master connection to {self.host} is open; open one (once: it may ask for your "
                              f"password or second factor) with:\n  {self.open_command()}")

    def argv(self, remote_argv: Sequence[str]) -> list[str]:
        """The local ssh command that runs ``remote_argv`` there: BatchMode, through the master only,
        the remote words quoted one by one."""
        return [*self._base(), "-o", "BatchMode=yes", "-o", "ControlMaster=no", "-T", "--", self.host,
                shlex.join(list(remote_argv))]

    def orchestrator(self, args: Sequence[str]) -> list[str]:
        return self.argv([*self.settings.command, "--client-version", __version__, *args])

    def run(self, args: Sequence[str], stdin: Optional[bytes] = None, capture: bool = False) -> subprocess.CompletedProcess:
        self.require_master()
        out = subprocess.run(self.orchestrator(args), input=stdin, stdout=subprocess.PIPE if capture else None,
                             stdin=None if stdin is not None else subprocess.DEVNULL)
        self._check(out.returncode)
        return out

    def _check(self, code: int) -> None:
        if code == SSH_FAILED:
            raise RemoteError(f"the SSH connection to {self.host} failed (ssh's messages are above); check it with: "
                              f"{shlex.join([*self._base(), '-O', 'check', '--', self.host])}")

    # -- following, across dropped connections
    def follow(self, args: Sequence[str]) -> int:
        """Run a command whose output is a growing file's (``logs -f``), reconnecting when the
        connection drops and skipping what was already printed."""
        printed = 0
        failures = 0
        while True:
            self.require_master()
            proc = subprocess.Popen(self.orchestrator(args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
            skip = printed
            assert proc.stdout is not None
            while chunk := proc.stdout.read1(65536):  # type: ignore[attr-defined]
                if skip:
                    cut = min(skip, len(chunk))
                    chunk, skip = chunk[cut:], skip - cut
                if chunk:
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.buffer.flush()
                    printed += len(chunk)
            code = proc.wait()
            if code != SSH_FAILED:
                return code
            failures = self.after_failure(failures)

    def after_failure(self, failures: int, limit: int = 5) -> int:
        """A session ended with ssh's 255: wait for the master if it is gone; if it is up (the remote
        command itself died, or the login node refuses sessions), back off, and give up after
        ``limit`` in a row. Returns the new count."""
        if not self.master_up():
            self.wait_for_master()
            return 0
        failures += 1
        if failures >= limit:
            raise RemoteError(f"{limit} sessions in a row to {self.host} failed although the master connection is up "
                              "(ssh's messages are above); the job goes on there")
        time.sleep(min(2.0 ** failures, 30.0))
        return failures

    def wait_for_master(self) -> None:
        """The connection dropped: wait (bounded) for the master to be up again."""
        deadline = time.monotonic() + self.settings.reconnect_s
        if self.master_up():
            return
        print(f"[orchestrator] the connection to {self.host} dropped; waiting up to {self.settings.reconnect_s:.0f}s "
              f"for it to come back. If it does not by itself, reopen it with:\n  {self.open_command()}",
              file=sys.stderr, flush=True)
        while time.monotonic() < deadline:
            time.sleep(1.0)
            if self.master_up():
                print(f"[orchestrator] reconnected to {self.host}", file=sys.stderr, flush=True)
                return
        raise RemoteError(f"the connection to {self.host} did not come back within {self.settings.reconnect_s:.0f}s; "
                          f"the job goes on there: reopen the master ({self.open_command()}) and follow it again")


# ---- the commands --------------------------------------------------------------------------
def run_command(host: Optional[str], command: str, argv: Sequence[str], args: Any) -> int:
    """Carry out ``orchestrator --remote HOST <command> <argv...>``."""
    ssh = Ssh(load_settings(host))
    if command == "submit":
        return submit(ssh, args)
    if command == "logs" and getattr(args, "follow", False):
        return ssh.follow(argv)
    if command == "report":
        return report(ssh, args.run, argv)
    return ssh.run(argv).returncode


def submit(ssh: Ssh, args: Any) -> int:
    """Validate and scan here, ship what the login node lacks, submit there; then follow there."""
    from orchestrator.loading import load_spec

    spec = load_spec(*args.spec, overrides=args.overrides, executor=args.executor or "slurm")
    if spec.executor != "slurm":  # the login node refuses it too: it is shared, it only queues jobs
        raise UsageError(f"--remote submit queues the job on SLURM there, and --executor {spec.executor} would run it "
                         "on the login node itself (shared by everyone): drop --executor, or run it here without "
                         "--remote")
    header, sources = shipment(spec)
    ssh.require_master()
    proc = subprocess.Popen(ssh.orchestrator(["remote-receive"]), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(json.dumps(header).encode() + b"\n")
        proc.stdin.flush()
        answer = _read_message(proc.stdout, ssh)
        missing = answer.get("missing")
        if not isinstance(missing, list):
            raise RemoteError(f"the login node answered {answer!r}, not the list of missing files")
        sent = 0
        for sha in missing:
            path = sources.get(sha)
            if path is None:
                raise RemoteError(f"the login node asked for {sha}, which this project does not hold")
            data = Path(path).read_bytes()
            proc.stdin.write(f"{sha} {len(data)}\n".encode())
            proc.stdin.write(data)
            sent += len(data)
        proc.stdin.write(b"END\n")
        proc.stdin.close()
        result = _read_message(proc.stdout, ssh)
    except BrokenPipeError:  # the login node stopped reading: its reason is on its stdout
        result = _read_message(proc.stdout, ssh)
    code = proc.wait()
    ssh._check(code)
    if "submitted" not in result:
        return code or 1
    done = result["submitted"]
    print(f"submitted {done['run']} on {ssh.host}: job(s) {', '.join(done['jobs']) or '-'}; run folder "
          f"{done['run_dir']} (shipped {len(missing)} file(s), {sent} bytes)")
    if args.follow:  # once it left the queue (logs -f gives up on a log that does not start)
        from orchestrator.states import State

        _status_row(ssh, done["run"], until=lambda state: state != State.PENDING)
        ssh.follow(["logs", "-f", done["run"]])
    if args.follow or args.wait:
        return wait(ssh, done["run"])
    return 0


def wait(ssh: Ssh, run: str) -> int:
    """Wait for the run to end (surviving drops), then print its end as ``submit --wait`` does."""
    from orchestrator.states import State

    row = _status_row(ssh, run, until=lambda state: state.terminal)
    state = State(row["state"])
    print(f"{run}: {state}  (run folder {ssh.host}:{row.get('run_dir', '?')})")
    if state != State.COMPLETED and row.get("error"):
        print(row["error"], file=sys.stderr)
    return 0 if state == State.COMPLETED else 1


def _status_row(ssh: Ssh, run: str, until: Callable[[Any], bool], pacing: Any = None,
                sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> dict:
    """Poll the run's status there until ``until(state)``: each look is one SSH session and one
    scheduler query on the login node, so they are paced as every wait on SLURM is
    (``executors.slurm.SchedulerPacing``: 10 s, growing while the state stays the same, at most 60 s)."""
    from orchestrator.executors.slurm import SchedulerPacing
    from orchestrator.states import State

    pacing = pacing or SchedulerPacing()
    failures = 0
    while True:
        if not ssh.master_up():
            ssh.wait_for_master()
        out = subprocess.run(ssh.orchestrator(["status", "--json", run]), stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE)
        if out.returncode == SSH_FAILED:
            failures = ssh.after_failure(failures)
            continue
        failures = 0
        try:
            row = json.loads(out.stdout)[0]
            state = State(row["state"])
        except (ValueError, IndexError, KeyError, TypeError):
            raise RemoteError(f"could not read the status of {run} on {ssh.host}") from None
        if until(state):
            return row
        pacing.answered(clock(), state)
        sleep(pacing.wait_s(clock()))


def report(ssh: Ssh, run: str, argv: Sequence[str]) -> int:
    """The report's text from the login node, and its PNGs copied back (one more round trip)."""
    code = ssh.run(argv).returncode
    if code != 0:
        return code
    out = ssh.run(["remote-files", run, "report"], capture=True)
    target = Path.cwd() / f"{Path(run).name}-report"
    names = unpack_pngs(out.stdout, target)
    if names:
        print(f"copied {len(names)} plot(s) to {target}: {', '.join(names)}")
    return 0


def unpack_pngs(data: bytes, target: Path) -> list[str]:
    """Extract the PNGs of a tar stream into ``target`` (plain files with plain names only)."""
    import io

    names: list[str] = []
    if not data:
        return names
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar.getmembers():
            name = os.path.basename(member.name)
            if not member.isfile() or not name.endswith(".png") or name != member.name:
                continue
            source = tar.extractfile(member)
            if source is None:
                continue
            target.mkdir(parents=True, exist_ok=True)
            (target / name).write_bytes(source.read())
            names.append(name)
    return names


def _read_message(stream: IO[bytes], ssh: Ssh) -> dict:
    line = stream.readline()
    if not line:
        return {}
    try:
        message = json.loads(line)
    except ValueError:
        raise RemoteError(f"the login node answered {line[:200]!r}: is {shlex.join(ssh.settings.command)} the "
                          "orchestrator there? (remote.command in your config)") from None
    if "error" in message:
        raise RemoteError(message["error"])
    return message


def shipment(spec: Any) -> tuple[dict, dict[str, str]]:
    """What ``submit`` sends: the header (the resolved spec, the project's manifest and where the
    CLI was called from in it) and, by hash, the local file each blob comes from."""
    from orchestrator.snapshot import Snapshot, project_root, scan, write_index

    cwd = os.getcwd()
    data = spec.model_dump(mode="json", exclude_defaults=True)
    data["executor"] = spec.executor  # always said: the login node takes nothing but slurm, never a default
    root, how = project_root(spec.entrypoint, cwd)
    header: dict[str, Any] = {"protocol": PROTOCOL, "version": __version__, "spec": data, "files": {}, "cwd": "."}
    sources: dict[str, str] = {}
    if not spec.code.snapshot:
        raise UsageError("--remote submit ships the code snapshot, and this spec sets code.snapshot: false; remove "
                         "it (the login node then runs what you shipped), or submit on the login node itself")
    if root is None:  # a module of an installed package: nothing of the user's to ship
        return header, sources
    runs = os.path.abspath(os.path.expanduser(spec.runs_dir))
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "orchestrator", "ship")
    script = spec.entrypoint.endswith(".py") or ":" not in spec.entrypoint
    snap: Snapshot = scan(root, how, cache, ignore_file=spec.code.ignore_file, max_mb=spec.code.max_mb,
                          exclude=[runs], required=[os.path.abspath(spec.entrypoint)] if script else [],
                          include_patterns=spec.code.include, exclude_patterns=spec.code.exclude)
    write_index(snap)
    entries = {rel: e for rel, e in snap.entries.items() if e.link is None or not os.path.isabs(e.link)}
    for rel in sorted(set(snap.entries) - set(entries)):  # its target is on this machine, not the cluster
        print(f"[orchestrator] not shipped: {rel} is a link leading out of the project (to {snap.entries[rel].link}); "
              "on the login node, point to the cluster's copy from the spec or the script", file=sys.stderr)
    rel_cwd = os.path.relpath(cwd, root)
    if rel_cwd.startswith(os.pardir):
        raise UsageError(f"run 'orchestrator --remote ... submit' from inside the project ({root}): the login node "
                         "recreates it, and relative paths in the spec are read from where you are in it")
    if script and os.path.isabs(spec.entrypoint):
        data["entrypoint"] = os.path.relpath(spec.entrypoint, cwd)
    header.update(files={rel: e.to_json() for rel, e in entries.items()}, cwd=rel_cwd,
                  project=project_name(root), commit=snap.commit, diff=snap.diff)
    sources = {e.sha: os.path.join(root, rel) for rel, e in entries.items() if e.link is None}
    return header, sources


def project_name(root: str) -> str:
    """The login node's name for this project's checkout: the folder's name made a plain one
    (the login node accepts letters, digits, '_', '.', '-', not a leading '.' or '-'), then a
    hash of this host and the path, which keeps projects of one name apart."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(root).name).lstrip(".-")[:100]
    return f"{name or 'project'}-{_short(root)}"


def _short(text: str) -> str:
    import hashlib
    import socket

    return hashlib.sha256(f"{socket.gethostname()}:{text}".encode()).hexdigest()[:8]
