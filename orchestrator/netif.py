"""Which network interface a rank should use. Runs on the rank, at launch (not in planning).

Asked of the kernel directly (the interfaces' IPv4 addresses by ioctl, the route's source address
by a connected UDP socket, which sends nothing): no ``ip`` process per rank. What that cannot
settle (an address that is not an interface's primary one) is asked of ``ip``, as before.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import Sequence

_SIOCGIFADDR = 0x8915  # linux/sockios.h: an interface's (primary) IPv4 address


def interface_exists(name: str) -> bool:
    return bool(name) and "/" not in name and name not in {".", ".."} and os.path.exists(f"/sys/class/net/{name}")


def interface_for(master_addr: str, peers: Sequence[str] = ()) -> str:
    """The interface carrying this host's own address for the master, or the one routing to it.

    On the master's own node its name may resolve to a loopback address (Debian and Ubuntu write
    ``127.0.1.1 <hostname>`` into /etc/hosts), while the other nodes reach it over the network:
    loopback would then bind this node's ranks to ``lo`` and the others would never reach them.
    So when the master is loopback here and the job has other hosts (``peers``), the interface is
    the one that routes to the first of them that resolves to a network address."""
    ip = _resolve(master_addr, "MASTER_ADDR")
    if ipaddress.ip_address(ip).is_loopback and peers:
        for peer in peers:
            try:
                peer_ip = socket.gethostbyname(peer)
            except OSError:
                continue
            if not ipaddress.ip_address(peer_ip).is_loopback:
                return _interface_to(peer_ip, peer)
        raise RuntimeError(
            f"MASTER_ADDR {master_addr} resolves to {ip} (loopback) on this node, and none of the job's other "
            f"hosts ({', '.join(peers[:4])}{', ...' if len(peers) > 4 else ''}) resolves to a network address "
            "here, so no interface reaches them; fix /etc/hosts or DNS on the nodes, or set distributed.interface")
    return _interface_to(ip, master_addr)


def _resolve(host: str, what: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        raise RuntimeError(f"cannot resolve {what} {host!r}: {exc}; check /etc/hosts or DNS on this node") from exc


def _interface_to(ip: str, host: str) -> str:
    """The interface carrying ``ip`` as this host's own address, else the one routing to it."""
    addresses = interface_addresses()
    own = [name for name, addr in addresses.items() if addr == ip and name != "lo"]
    if own:
        return own[0]
    source = route_source(ip)
    routed = [name for name, addr in addresses.items() if source is not None and addr == source]
    return routed[0] if routed else _interface_for_by_ip_command(host, ip)


def expand_names(setting: str) -> list[str]:
    """Interface names as this node has them, from a ``distributed.interface`` setting in the form
    NCCL_SOCKET_IFNAME takes: comma-separated prefixes (``eth``: every interface whose name
    starts so; an exact name matches itself), or ``=`` first for exact names only. gloo takes
    exact names only, so each rank is given these. Raises RuntimeError naming what is missing and
    what the node has."""
    exact = setting.startswith("=")
    have = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []
    out: list[str] = []
    missing = []
    for name in filter(None, (setting[1:] if exact else setting).split(",")):
        found = [name] if interface_exists(name) else [] if exact else [n for n in have if n.startswith(name)]
        if not found:
            missing.append(name)
        out += [n for n in found if n not in out]
    if missing or not out:
        raise RuntimeError(
            f"interface {', '.join(missing) or setting} does not exist on {socket.gethostname()} (it has: "
            f"{', '.join(have)}); fix distributed.interface (names, a prefix such as 'eth', or '=' first for exact "
            "names) or use 'auto'")
    return out


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
