"""Which network interface a rank should use. Runs on the rank, at launch (not in planning)."""

from __future__ import annotations

import os
import socket
import subprocess


def interface_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def interface_for(master_addr: str) -> str:
    """The interface carrying this host's own address for the master, or the one routing to it."""
    try:
        ip = socket.gethostbyname(master_addr)
    except OSError as exc:
        raise RuntimeError(f"cannot resolve MASTER_ADDR {master_addr!r}: {exc}; check /etc/hosts or DNS on this node") from exc
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[3].split("/")[0] == ip and parts[1] != "lo":
            return parts[1]
    route = subprocess.run(["ip", "-o", "route", "get", ip], capture_output=True, text=True, check=False).stdout.split()
    if "dev" in route:
        return route[route.index("dev") + 1]
    raise RuntimeError(f"no interface routes to MASTER_ADDR {master_addr} ({ip}); set distributed.interface")


def check_interfaces(names: list[str], host: str) -> None:
    missing = [n for n in names if not n.startswith("^") and not interface_exists(n)]
    if missing:
        have = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []
        raise RuntimeError(
            f"interface {', '.join(missing)} does not exist on {host} (it has: {', '.join(have)}); "
            "fix distributed.interface or use 'auto'"
        )
