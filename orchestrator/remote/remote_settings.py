"""The user's ``remote:`` settings for ``orchestrator --remote HOST`` (see ``orchestrator.remote``):
read from ``$ORCHESTRATOR_CONFIG`` (default ``${XDG_CONFIG_HOME:-~/.config}/orchestrator/config.yaml``),
checked field by field, with ``--remote HOST`` on top; and this machine's client id, which names
its checkouts on the login node and is kept beside the config file."""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from orchestrator.core.errors import OrchestratorError, UsageError

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

    The file is read as specs are (``yaml_text.parse_text``, which imports no pydantic): YAML 1.2's booleans, so an unquoted
    ``host: on`` or a command word ``off`` stays the text written (PyYAML's YAML 1.1 would make
    them True and False), and a setting given twice is refused rather than the last one winning."""
    from orchestrator.spec.yaml_text import parse_text

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
