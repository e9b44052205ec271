"""The rank's interface choice, asked of the kernel, against the ``ip`` command it replaced.

Both run for real on this machine: every interface address, and generated IPv4 addresses (on
this host's subnets, routed through its default route, unroutable), must get the same answer.
"""

from __future__ import annotations

import ipaddress
import socket
import os
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core import netif

pytestmark = pytest.mark.skipif(shutil.which("ip") is None or not os.path.isdir("/sys/class/net"),
                                reason="needs Linux and the ip command to compare with")


def _by_ip_command(ip: str) -> str | None:
    try:
        return netif._interface_for_by_ip_command(ip, ip)
    except RuntimeError:
        return None


def _fast(ip: str) -> str | None:
    try:
        return netif.master_route(ip).interface
    except RuntimeError:
        return None


def test_every_address_of_this_host_maps_to_its_interface() -> None:
    addresses = netif.interface_addresses()
    assert addresses.get("lo") == "127.0.0.1", addresses
    for name, addr in addresses.items():
        assert _fast(addr) == _by_ip_command(addr) == name


def _networks() -> list[ipaddress.IPv4Network]:
    out = []
    for line in os.popen("ip -o -4 addr show").read().splitlines():
        parts = line.split()
        out.append(ipaddress.IPv4Network(parts[3], strict=False))
    return out


@settings(max_examples=150, deadline=None, derandomize=os.environ.get("CI") == "true")
@given(st.data())
def test_generated_addresses_get_the_interface_ip_route_names(data: st.DataObject) -> None:
    nets = _networks()
    nearby = st.sampled_from(nets).flatmap(
        lambda n: st.integers(0, n.num_addresses - 1).map(lambda i: str(n.network_address + i)))
    anywhere = st.integers(1, 2**32 - 2).map(lambda i: str(ipaddress.IPv4Address(i)))
    ip = data.draw(st.one_of(nearby, anywhere.filter(lambda a: not ipaddress.IPv4Address(a).is_multicast)))
    assert _fast(ip) == _by_ip_command(ip), ip


# ---- the master's own name resolving to loopback (Debian's "127.0.1.1 <hostname>") ----------


def _network_interface() -> tuple[str, str]:
    """A non-loopback interface of this host and its address (the deploy cluster's nodes have eth0)."""
    found = [(n, a) for n, a in netif.interface_addresses().items() if not a.startswith("127.")]
    if not found:
        pytest.skip("this host has no network interface besides lo")
    return found[0]


def _hosts(monkeypatch: pytest.MonkeyPatch, table: dict[str, str]) -> None:
    def resolve(name: str) -> str:
        if name in table:
            return table[name]
        raise OSError(f"unknown host {name}")

    monkeypatch.setattr(socket, "gethostbyname", resolve)


def test_a_master_that_is_loopback_here_uses_the_interface_that_reaches_the_other_nodes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    name, addr = _network_interface()
    _hosts(monkeypatch, {"node1": "127.0.1.1", "node2": addr, "gone": "127.0.0.1"})
    # one node: loopback is right; several: never loopback, the peers' interface
    assert netif.master_route("node1").interface == "lo"
    assert netif.master_route("node1", ["node2"]).interface == name
    assert netif.master_route("node1", ["unknown", "gone", "node2"]).interface == name  # the first that resolves elsewhere
    # on the other nodes the master is a network address: unchanged
    assert netif.master_route("node2", ["node1"]).interface == name


def test_a_master_that_is_loopback_with_no_reachable_peer_is_refused_with_the_fix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _hosts(monkeypatch, {"node1": "127.0.1.1", "node2": "127.0.1.1"})
    with pytest.raises(RuntimeError, match=r"127\.0\.1\.1 \(loopback\).*set distributed.interface"):
        netif.master_route("node1", ["node2", "node3"])


# ---- the forms NCCL_SOCKET_IFNAME takes, made into names gloo takes --------------------------


def test_prefixes_and_exact_names_expand_to_this_nodes_interfaces() -> None:
    have = sorted(os.listdir("/sys/class/net"))
    assert netif.expand_names("lo") == ["lo"]
    assert netif.expand_names("=lo") == ["lo"]
    name = have[0]
    assert netif.expand_names(name[:1]) == [n for n in have if n.startswith(name[:1])]
    with pytest.raises(RuntimeError, match="does not exist"):
        netif.expand_names("=" + name[:-1] if len(name) > 1 else "=" + name + "x")


@settings(max_examples=150, deadline=None, derandomize=os.environ.get("CI") == "true")
@given(st.lists(st.text(alphabet="abcdefghilmnorstuvwxyz0123456789_.-", min_size=1, max_size=15), min_size=1,
                max_size=4), st.booleans())
def test_generated_settings_expand_to_existing_names_or_name_the_fix(names: list[str], exact: bool) -> None:
    setting = ("=" if exact else "") + ",".join(names)
    have = set(os.listdir("/sys/class/net"))
    try:
        out = netif.expand_names(setting)
    except RuntimeError as exc:
        assert "distributed.interface" in str(exc) and "it has:" in str(exc)
        assert any((n not in have) if exact else not any(h.startswith(n) for h in have) for n in names)
        return
    assert out and set(out) <= have and len(out) == len(set(out))
    for n in names:
        assert n in out if exact else any(o.startswith(n) for o in out)
