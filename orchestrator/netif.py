"""Which network interface a rank should use. Runs on the rank, at launch (not in planning).

Asked of the kernel directly (the interfaces' IPv4 addresses by ioctl, the route's source address
by a connected UDP socket, which sends nothing): no ``ip`` process per rank. What that cannot
settle (an address that is not an interface's primary one) is asked of ``ip``, as before.
"""

from __future__ import annotations

import os
import socket

_SIOCGIFADDR = 0x8915  # linux/sockios.h: an interface's (primary) IPv4 address


def interface_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def interface_for(master_addr: str) -> str:
    """The interface carrying this host's own address for the master, or the one routing to it."""
    try:
        ip = socket.gethostbyname(master_addr)
    except OSError as exc:
        raise RuntimeError(f"cannot resolve MASTER_ADDR {master_addr!r}: {exc}; check /etc/hosts or DNS on this node") from exc
    addresses = interface_addresses()
    own = [name for name, addr in addresses.items() if addr == ip and name != "lo"]
    if own:
        return own[0]
    source = route_source(ip)
    routed = [name for name, addr in addresses.items() if source is not None and addr == source]
    return routed[0] if routed else _interface_for_by_ip_command(master_addr, ip)


def interface_addresses() -> dict[str, str]:
    """Each interface's primary IPv4 address, in the kernel's index order (those without one are
    left out). Empty where the ioctl is not available."""
    try:
        import fcntl
        import struct
    except ImportError:
        return {}
    out: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            out[name] = socket.inet_ntoa(raw[20:24])
    return out


def route_source(ip: str) -> str | None:
    """The source address this host would use to reach ``ip`` (the kernel's route lookup), or None
    when no route leads there."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((ip, 9))
            return str(s.getsockname()[0])
        except OSError:
            return None


def _interface_for_by_ip_command(master_addr: str, ip: str) -> str:
    import subprocess

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
