"""Where a tenant's webhook may point: never at the portal's own machine or network.

A webhook URL is a tenant's request that the portal, from inside its network, send a signed POST
somewhere. Its host is refused when it is, or resolves to, an address that is not global: loopback,
private, link-local (cloud metadata), shared, reserved, unspecified or multicast, however written
(``127.1``, ``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``0``, ``[::ffff:127.0.0.1]``, an IPv4
address inside a 6to4, Teredo or NAT64 one) and ``localhost`` with its subdomains.

The name is resolved once per delivery (`resolve`) and the connection goes to an address that
resolution gave and the check passed (apps/alerts/delivery.py), so a name that answers otherwise
the second time (DNS rebinding) cannot lead the POST elsewhere.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class Refused(Exception):
    """The webhook's target is an address this rule may not reach."""


def literal_address(host: str) -> IPAddress | None:
    """The address `host` names when it is written as one, in any form the system's resolver reads
    as an address (IPv4's shorthand, decimal, octal and hex included), else None (a name)."""
    host = host.strip("[]").split("%", 1)[0]
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except (OSError, ValueError):
        return None


def not_global(ip: IPAddress) -> bool:
    """Whether a tenant's webhook may not reach the address: anything but a global unicast one,
    judged on the IPv4 address inside an IPv6 one that carries it."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if inner is None and ip in _NAT64:
            inner = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if inner is not None and not_global(inner):
            return True
    return not ip.is_global or ip.is_multicast


def loopback_name(host: str) -> bool:
    """``localhost`` and its subdomains, which resolvers answer with loopback by themselves."""
    name = host.rstrip(".").lower()
    return name == "localhost" or name.endswith(".localhost")


def resolve(host: str, port: int) -> list[Any]:
    """Every address `host` resolves to, in the resolver's order, each once (one resolution)."""
    addresses: list[Any] = []
    for family, _, _, _, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        if family in (socket.AF_INET, socket.AF_INET6) and sockaddr[0] not in addresses:
            addresses.append(sockaddr[0])
    return addresses


def check_addresses(host: str, addresses: list[Any]) -> None:
    """Raise `Refused` unless every address is global and `host` is no loopback name."""
    if loopback_name(host) or not addresses:
        raise Refused("refused address")
    for address in addresses:
        ip = ipaddress.ip_address(str(address).split("%", 1)[0])
        if not_global(ip):
            raise Refused("refused address")
