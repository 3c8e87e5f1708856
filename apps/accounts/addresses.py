"""The address of the client behind a request, read through the proxies the portal trusts.

Every request of the embedded portal reaches the web process from 127.0.0.1: the notebook proxy
(configurable-http-proxy) sits in front of it, and workloads on the machine call it on loopback. The
proxy appends the address it was reached from to ``X-Forwarded-For`` (``"<earlier hops>,<peer>"``,
as http-proxy's ``xfwd`` writes it). The header is read only when the request's own peer is one
of ``PORTAL_TRUSTED_PROXIES``, and then from the right: each hop a trusted proxy wrote is skipped,
and the first address no trusted proxy vouches for is the client. Whatever a client wrote into the
header itself lies to the left of that and is never believed.

An address that is itself a trusted proxy (a request made on the proxy's own machine, or one that
came with no forwarded header) is *shared*: it stands for whoever is on that machine, not for one
client, and the sign-in limits never count it as one (apps/accounts/throttle.py).
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from django.conf import settings
from django.http import HttpRequest

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_address(text: str) -> IPAddress | None:
    """An address as a proxy writes it (``1.2.3.4``, ``1.2.3.4:5``, ``::1``, ``[::1]:5``), with an
    IPv4 address mapped into IPv6 (``::ffff:1.2.3.4``, what a dual-stack socket reports) as IPv4;
    None for anything else."""
    text = text.strip()
    if text.startswith("[") and "]" in text:
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@lru_cache(maxsize=8)
def _networks(entries: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)


def is_trusted_proxy(address: IPAddress | None) -> bool:
    """Whether `address` is one of ``PORTAL_TRUSTED_PROXIES``."""
    if address is None:
        return False
    return any(address in network for network in _networks(tuple(settings.PORTAL_TRUSTED_PROXIES)))


def _client(request: HttpRequest) -> IPAddress | None:
    peer = parse_address(str(request.META.get("REMOTE_ADDR") or ""))
    if not is_trusted_proxy(peer):
        return peer  # a direct client (or none known): a forwarded header is its own to forge
    forwarded = str(request.META.get("HTTP_X_FORWARDED_FOR") or "")
    hops = [hop for hop in forwarded.split(",") if hop.strip()]
    address = peer
    for hop in reversed(hops):
        address = parse_address(hop)
        if not is_trusted_proxy(address):
            return address  # the first hop no trusted proxy vouches for; None if it is not an address
    return address  # every hop a trusted proxy: the request was made on the proxy's own machine


def client_address(request: HttpRequest | None) -> str | None:
    """The client's address (see the module's docstring); None where it cannot be told."""
    address = _client(request) if request is not None else None
    return str(address) if address is not None else None


def distinct_client_address(request: HttpRequest | None) -> str | None:
    """The client's address where it stands for one client: None for a trusted proxy's own (shared)
    address or one that cannot be told."""
    address = _client(request) if request is not None else None
    return None if address is None or is_trusted_proxy(address) else str(address)
