"""The rank's interface choice, asked of the kernel, against the ``ip`` command it replaced.

Both run for real on this machine: every interface address, and generated IPv4 addresses (on
this host's subnets, routed through its default route, unroutable), must get the same answer.
"""

from __future__ import annotations

import ipaddress
import os
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import netif

pytestmark = pytest.mark.skipif(shutil.which("ip") is None or not os.path.isdir("/sys/class/net"),
                                reason="needs Linux and the ip command to compare with")


def _by_ip_command(ip: str) -> str | None:
    try:
        return netif._interface_for_by_ip_command(ip, ip)
    except RuntimeError:
        return None


def _fast(ip: str) -> str | None:
    try:
        return netif.interface_for(ip)
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
