"""The SSH side of ``orchestrator --remote HOST`` (see ``orchestrator.remote``): one login node
reached through the user's ControlMaster, every command one ``BatchMode`` session with its words
quoted for the remote shell, and following a growing output across dropped connections."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from typing import Optional, Sequence

from orchestrator import __version__
from orchestrator.core.errors import VERSION_MISMATCH, UsageError  # noqa: F401  (VERSION_MISMATCH: re-exported)
from orchestrator.remote.remote_settings import RemoteError, RemoteSettings, config_path

#: ssh's exit status when the connection (not the remote command) failed.
SSH_FAILED = 255


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
