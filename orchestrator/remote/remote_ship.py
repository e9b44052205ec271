"""What ``orchestrator --remote HOST submit`` (and ``plan``) ships, and the session that ships it:
the project scanned here as a code snapshot (``orchestrator.code.snapshot``; links leading out of the
project are not shipped), its manifest in the header with the resolved spec, the checkout's name
(this machine's client id and the project's path), then only the files the login node lacks
(``remote_receive`` is the other side; ``remote_protocol`` the rules it checks)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import IO, Any, Optional

from orchestrator import __version__
from orchestrator.core.errors import UsageError
from orchestrator.core.payload import is_script
from orchestrator.remote.remote_settings import RemoteError, RemoteSettings, client_id
from orchestrator.remote.remote_ssh import Ssh

#: The version of the submission protocol (``remote_protocol``); a login node speaking another refuses.
PROTOCOL = 1


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
    from orchestrator.code.snapshot import Snapshot, project_root, scan, write_index

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
    from orchestrator.code.snapshot_scan import stray_notes

    for note in stray_notes(spec.entrypoint, cwd):  # a stray record above the project: named, never obeyed
        print(f"[orchestrator] warning: {note}", file=sys.stderr)
    # The folder as the system names it, as os.getcwd() does: a project reached through a link
    # (macOS's /tmp and /var lead to /private/...) is still the folder the user is in.
    root = os.path.realpath(root)
    runs = os.path.abspath(os.path.expanduser(spec.runs_dir))
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "orchestrator", "ship")
    script = is_script(spec.entrypoint)
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
    if script and os.path.isabs(spec.entrypoint):  # its folder resolved as the cwd is; its own name kept
        folder, name = os.path.split(spec.entrypoint)
        data["entrypoint"] = os.path.relpath(os.path.join(os.path.realpath(folder), name), cwd)
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
