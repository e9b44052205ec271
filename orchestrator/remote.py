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
      allow_runs_in_home: false            # a relative runs_dir may land in your home there
      client_id: null                      # this machine's id there (default: made once, kept
                                           # in client-id beside this file)

A spec sent with ``--remote`` means the cluster's paths: '~' in its path fields
(``spec.HOME_PATH_FIELDS``) stays as written and the login node expands it for the login user.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import secrets
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
#: Commands that run on the login node under --remote (plan: only a SLURM plan, ``plan_host``); the
#: others stay local (validate) or make no sense there (run, demo).
REMOTE_COMMANDS = ("submit", "plan", "status", "list", "logs", "stacks", "cancel", "report")
#: The file beside the config file that keeps this machine's client id (``client_id``).
CLIENT_ID_FILE = "client-id"
_CLIENT_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


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
    #: A relative runs_dir (the default 'runs' too) lands in the login node's checkout, under the
    #: login user's home: refused unless this is true (homes are small; see remote_receive).
    allow_runs_in_home: bool = False
    #: This machine's id on the login node (its checkouts are named by it); None: made once and
    #: kept beside the config file (``client_id``).
    client_id: Optional[str] = None

    @classmethod
    def parse(cls, data: dict[str, Any]) -> RemoteSettings:
        """Checked field by field; raises ValueError("field: why")."""
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown setting (known: {', '.join(known)})")
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
        allow = data.get("allow_runs_in_home", cls.allow_runs_in_home)
        if not isinstance(allow, bool):
            raise ValueError(f"allow_runs_in_home: give true or false, not {allow!r}")
        client = data.get("client_id")
        if client is not None and (not isinstance(client, str) or not _CLIENT_ID.fullmatch(client)):
            raise ValueError(f"client_id: {client!r} is not an id: give 1 to 64 letters, digits, '_', '.' or '-' "
                             "(or leave it out: one is made once and kept beside this file)")
        return cls(host=host, ssh=words["ssh"], control_path=control, command=words["command"],
                   reconnect_s=float(reconnect), allow_runs_in_home=allow, client_id=client)


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
    if command == "plan":
        return plan(ssh, args)
    if command == "logs" and getattr(args, "follow", False):
        return ssh.follow(argv)
    if command == "report":
        return report(ssh, args.run, argv)
    return ssh.run(argv).returncode


def remote_spec(args: Any, command: str) -> Any:
    """The spec as the login node will read it: validated here, with '~' in its path fields kept
    as written (``spec.HOME_PATH_FIELDS``: the login node expands it for the login user, so
    ``checkpoint.dir: ~/ckpt`` is the cluster's home, not this machine's), and SLURM's."""
    from orchestrator.loading import load_spec

    spec = load_spec(*args.spec, overrides=args.overrides, executor=args.executor or "slurm", home_elsewhere=True)
    if spec.executor != "slurm":  # the login node refuses it too: it is shared, it only queues jobs
        if command == "plan":
            raise UsageError(f"--remote plan shows the cluster's plan of a SLURM job, and --executor {spec.executor} "
                             "runs on this machine: drop --remote (or give --local) to plan it here")
        raise UsageError(f"--remote submit queues the job on SLURM there, and --executor {spec.executor} would run it "
                         "on the login node itself (shared by everyone): drop --executor, or run it here without "
                         "--remote")
    return spec


def submit(ssh: Ssh, args: Any) -> int:
    """Validate and scan here, ship what the login node lacks, submit there; then follow there."""
    header, sources = shipment(remote_spec(args, "submit"), ssh.settings)
    result, shipped, sent, code = exchange(ssh, header, sources)
    if "submitted" not in result:
        return code or 1
    done = result["submitted"]
    print(f"submitted {done['run']} on {ssh.host}: job(s) {', '.join(done['jobs']) or '-'}; run folder "
          f"{done['run_dir']} (shipped {shipped} file(s), {sent} bytes)")
    if args.follow:  # once it left the queue (logs -f gives up on a log that does not start)
        from orchestrator.states import State

        _status_row(ssh, done["run"], until=lambda state: state != State.PENDING)
        ssh.follow(["logs", "-f", done["run"]])
    if args.follow or args.wait:
        return wait(ssh, done["run"])
    return 0


def plan(ssh: Ssh, args: Any) -> int:
    """``plan`` as the login node makes it: its interpreter, its paths (its home for '~', the
    checkout for relative ones), the code snapshot it would freeze, and whether a submission would
    resume a run there. The project is shipped as for ``submit`` (the login node's checkout is
    updated: the plan reads the entrypoint and the snapshot there); nothing is submitted."""
    header, sources = shipment(remote_spec(args, "plan"), ssh.settings)
    header["plan"] = {"json": bool(args.json), "node": args.node, "rank": args.rank}
    result, _, _, code = exchange(ssh, header, sources)
    planned = result.get("planned")
    if not isinstance(planned, dict) or not isinstance(planned.get("text"), str):
        return code or 1
    sys.stdout.write(planned["text"])
    sys.stdout.flush()
    for line in planned.get("warnings") or []:
        print(f"warning: {line}", file=sys.stderr)
    return 0


def exchange(ssh: Ssh, header: dict, sources: dict[str, str]) -> tuple[dict, int, int, int]:
    """One ``remote-receive`` session: the header, then the files the login node asks for, then
    its answer. Returns (the answer, files sent, bytes sent, ssh's exit status); an ``error``
    answer raises RemoteError with the login node's line."""
    ssh.require_master()
    proc = subprocess.Popen(ssh.orchestrator(["remote-receive"]), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    missing: list = []
    sent = 0
    try:
        proc.stdin.write(json.dumps(header).encode() + b"\n")
        proc.stdin.flush()
        answer = _read_message(proc.stdout, ssh)
        missing = answer.get("missing")  # type: ignore[assignment]
        if not isinstance(missing, list):
            raise RemoteError(f"the login node answered {answer!r}, not the list of missing files")
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
    return result, len(missing), sent, code


def plan_host(args: Any) -> Optional[str]:
    """Where ``plan`` is made: on the login node with ``--remote HOST``; with ``remote.host`` in
    the config, there too for a SLURM plan (the spec's executor, or ``--executor slurm``), which
    only the cluster can make (its interpreter, its home, its checkout); a local plan stays here."""
    if args.remote:
        return str(args.remote)
    if not config_path().is_file():
        return None
    host = load_settings().host
    if not host:
        return None
    if args.executor is not None:
        return host if args.executor == "slurm" else None
    from orchestrator.loading import load_spec

    spec = load_spec(*args.spec, overrides=args.overrides, home_elsewhere=True)
    return host if spec.executor == "slurm" else None


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


def shipment(spec: Any, settings: Optional[RemoteSettings] = None) -> tuple[dict, dict[str, str]]:
    """What ``submit`` and ``plan`` send: the header (the resolved spec, '~' kept as written in its
    path fields; the project's manifest and where the CLI was called from in it; the checkout's
    name, and the name an older version gave it; whether a relative runs_dir may land in the login
    user's home) and, by hash, the local file each blob comes from."""
    from orchestrator.snapshot import Snapshot, project_root, scan, write_index

    settings = settings or RemoteSettings()
    cwd = os.getcwd()
    data = spec.model_dump(mode="json", exclude_defaults=True)
    data["executor"] = spec.executor  # always said: the login node takes nothing but slurm, never a default
    root, how = project_root(spec.entrypoint, cwd)
    header: dict[str, Any] = {"protocol": PROTOCOL, "version": __version__, "spec": data, "files": {}, "cwd": ".",
                              "allow_runs_in_home": settings.allow_runs_in_home}
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
                  project=project_name(root, client_id(settings)), legacy_project=legacy_project_name(root),
                  commit=snap.commit, diff=snap.diff)
    sources = {e.sha: os.path.join(root, rel) for rel, e in entries.items() if e.link is None}
    return header, sources


def project_name(root: str, client: str) -> str:
    """The login node's name for this project's checkout: the folder's name made a plain one
    (the login node accepts letters, digits, '_', '.', '-', not a leading '.' or '-'), then a
    hash of this machine's client id (``client_id``) and the path, which keeps projects of one
    name apart and stays the same on every network (never the host name)."""
    return f"{_plain_name(root)}-{hashlib.sha256(f'client:{client}:{root}'.encode()).hexdigest()[:8]}"


def legacy_project_name(root: str) -> str:
    """The name versions before the client id gave the checkout (a hash of the host name and the
    path): the login node adopts that checkout once, when it holds no checkout of the new name,
    so runs under a relative runs_dir there resume (``remote_receive.checkout_name``)."""
    import socket

    return f"{_plain_name(root)}-{hashlib.sha256(f'{socket.gethostname()}:{root}'.encode()).hexdigest()[:8]}"


def _plain_name(root: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(root).name).lstrip(".-")[:100]
    return name or "project"


def client_id(settings: RemoteSettings) -> str:
    """This machine's id on the login node: ``remote.client_id`` when the config sets it, else a
    random one made the first time and kept in ``client-id`` beside the config file.

    The login node names the project's checkout by it, and a relative runs_dir lives in that
    checkout, so it must never change by itself: a host name does (macOS renames the machine on
    another network), and a new checkout made the next submit start training over instead of
    resuming. Two first submissions at once agree on one id (the file is linked into place only
    if absent)."""
    if settings.client_id:
        return settings.client_id
    path = config_path().with_name(CLIENT_ID_FILE)
    for _ in range(2):
        try:
            text = path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            _make_client_id(path)
            continue
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read this machine's client id in {path} ({exc}): fix its permissions, or set "
                             "remote.client_id in the config file") from None
        if not _CLIENT_ID.fullmatch(text):
            raise UsageError(f"{path} holds no client id (1 to 64 letters, digits, '_', '.', '-'): put back the id it "
                             "held (the login node names your checkouts by it: remote/projects/<project>-<hash>), or "
                             "remove the file for a new id (later submissions then use new checkouts there)")
        return text
    raise UsageError(f"the client id file {path} vanished while it was made: submit again")


def _make_client_id(path: Path) -> None:
    """Write a new random id to ``path`` unless another process wrote one first (a temporary
    file linked into place: ``link`` fails on an existing name, so the first id made wins)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{CLIENT_ID_FILE}-{os.getpid()}-{secrets.token_hex(4)}")
        tmp.write_text(secrets.token_hex(16) + "\n", encoding="ascii")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot keep this machine's client id in {path} ({exc}): make {path.parent} writable, or "
                         "set remote.client_id in the config file") from None
