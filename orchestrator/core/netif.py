"""Which network interface each backend of a rank uses, and why.

Two parts. The decision (``choose_interfaces``) is pure: from the spec's ``interface``, the job's
backend, the spec's ``env:``, the environment the ranks inherit, NCCL's own configuration files
(``read_nccl_conf``, the one place that reads them) and the route to the master, it says what
NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME each rank gets and why; ``plan`` and every rank call it,
so the plan's line and rows are what the ranks get. The route (``master_route``) runs on the
rank, at launch, and is asked of the kernel directly (the interfaces' IPv4 addresses by ioctl,
the route's source address by a connected UDP socket, which sends nothing): no ``ip`` process per
rank. What that cannot settle (an address that is not an interface's primary one) is asked of
``ip``, as before.
"""

from __future__ import annotations

import os

from orchestrator.core.lean_record import record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a rank imports this module)
if TYPE_CHECKING:
    from typing import Mapping, Optional, Sequence


_SIOCGIFADDR = 0x8915  # linux/sockios.h: an interface's (primary) IPv4 address


def interface_exists(name: str) -> bool:
    return bool(name) and "/" not in name and name not in {".", ".."} and os.path.exists(f"/sys/class/net/{name}")


def master_route(master_addr: str, peers: Sequence[str] = ()) -> Route:
    """The interface carrying this host's own address for the master, or the one routing to it.

    On the master's own node its name may resolve to a loopback address (Debian and Ubuntu write
    ``127.0.1.1 <hostname>`` into /etc/hosts), while the other nodes reach it over the network:
    loopback would then bind this node's ranks to ``lo`` and the others would never reach them.
    So when the master is loopback here and the job has other hosts (``peers``), the interface is
    the one that routes to the first of them that resolves to a network address."""
    import ipaddress
    import socket
    ip = _resolve(master_addr, "MASTER_ADDR")
    if ipaddress.ip_address(ip).is_loopback and peers:
        for peer in peers:
            try:
                peer_ip = socket.gethostbyname(peer)
            except OSError:
                continue
            if not ipaddress.ip_address(peer_ip).is_loopback:
                return Route(_interface_to(peer_ip, peer),
                             f"routes to {peer}: the master {master_addr} is {ip} (loopback) on this node")
        raise RuntimeError(
            f"MASTER_ADDR {master_addr} resolves to {ip} (loopback) on this node, and none of the job's other "
            f"hosts ({', '.join(peers[:4])}{', ...' if len(peers) > 4 else ''}) resolves to a network address "
            "here, so no interface reaches them; fix /etc/hosts or DNS on the nodes, or set distributed.interface")
    return Route(_interface_to(ip, master_addr), f"routes to the master {master_addr}")


def _resolve(host: str, what: str) -> str:
    import socket
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
    import socket
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
    import socket
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
    import socket
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


# ---- the decision: what each backend's variable gets, and why -----------------------------------
# NCCL picks its own socket interface well (ib* first, else any but lo and docker*), and sites
# tune it in /etc/nccl.conf; gloo has no such choice: without GLOO_SOCKET_IFNAME torch resolves
# the host's name, which Debian-style /etc/hosts maps to 127.0.1.1, and a multi-node gloo group
# then never connects. So ``auto`` names gloo's interface and leaves NCCL's to NCCL, and a value
# the user or the site set is never overridden unless the spec names an interface.

NCCL_IFNAME = "NCCL_SOCKET_IFNAME"
GLOO_IFNAME = "GLOO_SOCKET_IFNAME"
#: The site's NCCL configuration file, which NCCL reads on every node after the user's.
ETC_NCCL_CONF = "/etc/nccl.conf"
#: NCCL's configuration files hold a few lines; what lies past this is not read.
NCCL_CONF_MAX_BYTES = 1 << 16
NCCL_OWN_CHOICE = "NCCL_SOCKET_IFNAME is unset, so NCCL takes ib* first, else any interface but lo and docker*"


@record
class Route:
    """The interface this node's ranks reach the master on, and why it is that one (in ``plan``'s
    SLURM rows, the rule that finds it on each node). ``loopback_only``: every rank of the job
    runs on this machine and they meet at a loopback address by design (the local and debug
    executors), so NCCL is given this interface too. On SLURM it is never set, not even for a
    one-node job: NCCL never dials MASTER_ADDR (its bootstrap publishes its own address through
    torch's store), and any interface NCCL picks on the one node reaches that node's ranks."""

    interface: str
    why: str
    loopback_only: bool = False


@record
class NcclConf:
    """NCCL's configuration files as NCCL reads them when it starts (``nccl_conf_paths``), each as
    its ``NAME=value`` lines. NCCL sets a name from them only where the environment has none
    (``setenv(name, value, 0)``): the environment wins, then the first file, then the first line."""

    files: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()

    def setting(self, name: str) -> tuple[str, str] | None:
        """(value, file) of the line NCCL applies for ``name``; None when no file sets it."""
        for path, lines in self.files:
            for key, value in lines:
                if key == name:
                    return value, path
        return None


def parse_nccl_conf(text: str) -> tuple[tuple[str, str], ...]:
    """The ``NAME=value`` lines of an NCCL configuration file, parsed as NCCL parses them: a line
    that starts with '#' or has no '=' is skipped; the name is what precedes the first '=', the
    value all that follows it. NCCL trims nothing, so ``NAME = v`` sets 'NAME ', which nothing reads."""
    out = []
    for line in text.split("\n"):
        if line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        out.append((name, value))
    return tuple(out)


def nccl_conf_paths(environ: Mapping[str, str], home: str | None, etc_path: str) -> list[str]:
    """The files NCCL reads, in its order: NCCL_CONF_FILE (when set and not empty) instead of the
    user's ``~/.nccl.conf``, then the site's (``etc_path``: ``/etc/nccl.conf``)."""
    user = environ.get("NCCL_CONF_FILE") or (os.path.join(home, ".nccl.conf") if home else None)
    return [path for path in (user, etc_path) if path]


def read_nccl_conf(environ: Mapping[str, str], etc_path: str | None = None, home: str | None = None) -> NcclConf:
    """NCCL's configuration files on this host, as NCCL will read them here (``nccl_conf_paths``;
    ``environ`` is the rank's, for NCCL_CONF_FILE). The one function that reads them. Unless
    given, ``etc_path`` is ``ETC_NCCL_CONF`` and ``home`` the user's home folder as NCCL finds it
    (the password database, not $HOME). A file that is missing or unreadable is skipped, as NCCL
    skips it."""
    files = []
    for path in nccl_conf_paths(environ, _home_dir() if home is None else home,
                                ETC_NCCL_CONF if etc_path is None else etc_path):
        try:
            with open(path, "rb") as fh:
                raw = fh.read(NCCL_CONF_MAX_BYTES)
        except OSError:
            continue
        files.append((path, parse_nccl_conf(raw.decode("utf-8", "replace"))))
    return NcclConf(tuple(files))


def _home_dir() -> str | None:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_dir
    except (ImportError, KeyError):
        return None


@record
class SocketInterface:
    """One backend's socket interface: its variable, the value the job sets (None: the variable
    is left as the environment or the site's file has it, or unset), the interface the backend
    will use (None: the library's own choice), and why."""

    variable: str
    value: Optional[str]
    uses: Optional[str]
    why: str


@record
class InterfaceChoice:
    """What NCCL and gloo use on a rank, and why (``choose_interfaces``)."""

    backend: str
    nccl: SocketInterface
    gloo: SocketInterface

    def environ(self) -> dict[str, str]:
        """The variables the job sets on the rank: none for a backend left to its own choice or
        to the value the user or the site set."""
        return {c.variable: c.value for c in (self.nccl, self.gloo) if c.value is not None}

    def line(self) -> str:
        """``plan``'s line: the job's backend first, then the other one (torch's gloo side groups
        in an nccl job; NCCL groups a gloo job's script might make)."""
        nccl = f"NCCL chooses ({self.nccl.why})" if self.nccl.uses is None else \
            f"NCCL: {_shown(self.nccl.uses)} ({self.nccl.why})"
        gloo = _shown(self.gloo.uses) if self.gloo.uses is not None else \
            "the address this host's name resolves to, torch's default"
        if self.backend == "gloo":
            return f"interface: gloo: {gloo} ({self.gloo.why}) · if the script makes NCCL groups, {nccl}"
        return f"interface: {nccl} · gloo (CPU side groups): {gloo} ({self.gloo.why})"


def choose_interfaces(setting: str | None, backend: str, spec_env: Mapping[str, str], inherited: Mapping[str, str],
                      nccl_conf: NcclConf, route: Route | None) -> InterfaceChoice:
    """NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME for one rank, with the reason for each. Pure.

    ``setting``: ``distributed.interface``: None or 'auto'; else the names as this node has them
    (``expand_names``; in ``plan``, as the spec writes them) or an NCCL exclusion ('^docker0').
    ``spec_env``: the spec's ``env:``, whose values ranks get as written. ``inherited``: the
    environment the ranks inherit. ``route``: for 'auto', the interface that reaches the master.

    A variable ``env:`` sets always wins. A named interface sets both (gloo's not for an
    exclusion, which gloo cannot take), over the user's and the site's values: the spec said so.
    Under 'auto' a value from the environment (or, for NCCL, its configuration files) is kept;
    otherwise gloo gets the route, and NCCL is left to choose, unless every rank meets over
    loopback (``Route.loopback_only``), where NCCL gets that interface too."""
    auto = setting in (None, "auto")
    if auto and route is None:
        raise ValueError("distributed.interface 'auto' needs the route to the master (netif.master_route)")
    named = None if auto else str(setting)
    return InterfaceChoice(backend=backend, nccl=_nccl_interface(named, spec_env, inherited, nccl_conf, route),
                           gloo=_gloo_interface(named, spec_env, inherited, route))


def _nccl_interface(named: str | None, spec_env: Mapping[str, str], inherited: Mapping[str, str],
                    conf: NcclConf, route: Route | None) -> SocketInterface:
    if NCCL_IFNAME in spec_env:
        value = spec_env[NCCL_IFNAME]
        over = "; it wins over distributed.interface" if named is not None else ""
        return SocketInterface(NCCL_IFNAME, None, value, f"env: sets {NCCL_IFNAME}={_shown(value)}{over}")
    theirs = _set_for_nccl(inherited, conf)
    if named is not None:
        over = f"; over {NCCL_IFNAME}={_shown(theirs[0])} from {theirs[1]}" if theirs else ""
        return SocketInterface(NCCL_IFNAME, named, named, f"distributed.interface{over}")
    if theirs:
        return SocketInterface(NCCL_IFNAME, None, theirs[0],
                               f"auto keeps it: {theirs[1]} sets {NCCL_IFNAME}={_shown(theirs[0])}")
    assert route is not None
    if route.loopback_only:
        return SocketInterface(NCCL_IFNAME, route.interface, route.interface, route.why)
    return SocketInterface(NCCL_IFNAME, None, None, f"auto: {NCCL_OWN_CHOICE}")


def _set_for_nccl(inherited: Mapping[str, str], conf: NcclConf) -> tuple[str, str] | None:
    """(value, where) of an NCCL_SOCKET_IFNAME the user or the site set: the environment's (even
    empty: NCCL's files cannot replace it), else the configuration file NCCL applies."""
    if NCCL_IFNAME in inherited:
        return inherited[NCCL_IFNAME], "your environment"
    return conf.setting(NCCL_IFNAME)


def _gloo_interface(named: str | None, spec_env: Mapping[str, str], inherited: Mapping[str, str],
                    route: Route | None) -> SocketInterface:
    if GLOO_IFNAME in spec_env:
        value = spec_env[GLOO_IFNAME]
        over = "; it wins over distributed.interface" if named is not None else ""
        return SocketInterface(GLOO_IFNAME, None, value, f"env: sets {GLOO_IFNAME}={_shown(value)}{over}")
    theirs = inherited.get(GLOO_IFNAME)
    if named is not None and not named.startswith("^"):
        over = f"; over {GLOO_IFNAME}={_shown(theirs)} from your environment" if theirs is not None else ""
        return SocketInterface(GLOO_IFNAME, named, named, f"distributed.interface{over}")
    if theirs is not None:
        return SocketInterface(GLOO_IFNAME, None, theirs, f"your environment sets {GLOO_IFNAME}={_shown(theirs)}")
    if named is not None:
        return SocketInterface(GLOO_IFNAME, None, None,
                               f"distributed.interface {named} is an NCCL exclusion, which gloo cannot take: name "
                               f"the interface: export {GLOO_IFNAME}=<name> if the script makes gloo groups")
    assert route is not None
    return SocketInterface(GLOO_IFNAME, route.interface, route.interface, route.why)


def _shown(value: str) -> str:
    return value if value else "''"
