"""``orchestrator --remote HOST <command>``: operate a cluster from a laptop, over the system's OpenSSH.

Every command is one SSH session through a ControlMaster connection the user opened once
(``ssh -M``: it asks for the password or second factor then), run in ``BatchMode`` (no prompt can
hang a command; clusters that require 2FA work). When no master is up, the error gives the exact
``ssh -M`` command. What runs there is the orchestrator's own CLI (``remote.command``), given as
an argument vector: each word is quoted for the remote shell, and nothing of a spec travels on
a command line (``submit`` sends the resolved spec on stdin).

- ``submit`` validates the spec here, scans the project here (``orchestrator.code.snapshot``), and in
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

The parts: ``remote_settings`` (the config, the client id), ``remote_ssh`` (the connection),
``remote_ship`` (what is shipped, and the session that ships it); this module carries out each
command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from orchestrator.core.errors import UsageError
from orchestrator.remote.remote_settings import (CLIENT_ID_FILE, RemoteError, RemoteSettings, check_host, client_id,
                                          config_path, load_settings)
from orchestrator.remote.remote_ship import PROTOCOL, exchange, legacy_project_name, project_name, shipment
from orchestrator.remote.remote_ssh import SSH_FAILED, VERSION_MISMATCH, Ssh

__all__ = ["CLIENT_ID_FILE", "PROTOCOL", "REMOTE_COMMANDS", "SSH_FAILED", "VERSION_MISMATCH", "RemoteError",
           "RemoteSettings", "Ssh", "check_host", "client_id", "config_path", "exchange", "legacy_project_name",
           "load_settings", "plan", "plan_host", "project_name", "remote_spec", "report", "run_command", "shipment",
           "submit", "unpack_pngs", "wait"]

#: Commands that run on the login node under --remote (plan: only a SLURM plan, ``plan_host``); the
#: others stay local (validate) or make no sense there (run, demo).
REMOTE_COMMANDS = ("submit", "plan", "status", "top", "list", "logs", "stacks", "cancel", "report", "gc")


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
    from orchestrator.spec.loading import load_spec

    spec = load_spec(*args.spec, overrides=args.overrides, executor=args.executor or "slurm", home_elsewhere=True)
    if not spec.runs_on.scheduled:  # the login node refuses it too: it is shared, it only queues jobs
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
        from orchestrator.core.states import State

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
        from orchestrator.backends import backend

        return host if backend(args.executor).scheduled else None
    from orchestrator.spec.loading import load_spec

    spec = load_spec(*args.spec, overrides=args.overrides, home_elsewhere=True)
    return host if spec.runs_on.scheduled else None


def wait(ssh: Ssh, run: str) -> int:
    """Wait for the run to end (surviving drops), then print its end as ``submit --wait`` does."""
    from orchestrator.core.states import State

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
    from orchestrator.core.states import State
    from orchestrator.executors.scheduler_pacing import SchedulerPacing

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
