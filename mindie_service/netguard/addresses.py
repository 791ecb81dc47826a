"""One DNS lookup whose every address is checked: the private-address block against server-side request
forgery. The addresses returned are the only ones a guarded fetch ever connects to (no second lookup, so
no DNS rebinding)."""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from typing import Any

from mindie_service.errors import MediaError

logger = logging.getLogger(__name__)

Address = tuple[int, str]  # (socket family, IP literal)

# Cloud instance-metadata endpoints (AWS/GCP/Azure/OpenStack, AWS IPv6, AWS ECS, Alibaba).
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "fd00:ec2::254", "169.254.170.2", "100.100.100.200")
)


def _embedded(addr: Any) -> list[Any]:
    """The IPv4 addresses an IPv6 address carries (mapped, 6to4, Teredo, NAT64): they name the real target."""
    if addr.version != 6:
        return []
    found = []
    if addr.ipv4_mapped is not None:
        found.append(addr.ipv4_mapped)
    if addr.sixtofour is not None:
        found.append(addr.sixtofour)
    if addr.teredo is not None:
        found.extend(addr.teredo)
    if addr in ipaddress.ip_network("64:ff9b::/96"):  # NAT64
        found.append(ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF))
    return found


def refusal_reason(ip: str) -> str | None:
    """Why connecting to ``ip`` is refused when private addresses are not allowed, or None."""
    addr: Any = ipaddress.ip_address(ip)
    for a in [*_embedded(addr), addr]:
        if a in METADATA_ADDRESSES:
            return "a cloud metadata"
        if a.is_loopback:
            return "a loopback"
        if a.is_unspecified:
            return "an unspecified"
        if a.is_link_local:
            return "a link-local"
        if a.is_multicast:
            return "a multicast"
        if a.is_private:
            return "a private"
        if a.is_reserved:
            return "a reserved"
        if not a.is_global:
            return "a non-public"
    return None


async def _lookup(host: str, port: int, timeout: float, label: str) -> list[Address]:
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.run_in_executor(None, socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM), timeout)
    except asyncio.TimeoutError:
        raise MediaError(f"{label}: resolving the URL host timed out", 408) from None
    except (OSError, UnicodeError):
        raise MediaError(f"{label}: the URL host {host!r} could not be resolved", 422) from None
    addresses: list[Address] = []
    for family, _, _, _, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        item = (int(family), str(sockaddr[0]).split("%", 1)[0])
        if item not in addresses:
            addresses.append(item)
    if not addresses:
        raise MediaError(f"{label}: the URL host {host!r} has no IP address", 422)
    return addresses


async def resolve_checked(host: str, port: int, *, allow_private: bool, timeout: float,
                          label: str) -> list[Address]:
    """Resolve ``host`` once (an IP literal as itself); unless ``allow_private``, every address must pass
    ``refusal_reason`` (403 naming the address otherwise). ``label`` starts every error message."""
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        family = socket.AF_INET6 if literal.version == 6 else socket.AF_INET
        addresses = [(int(family), str(literal))]
    else:
        addresses = await _lookup(host, port, timeout, label)
    if not allow_private:
        for _, ip in addresses:
            reason = refusal_reason(ip)
            if reason is not None:
                logger.info("%s: refused URL host resolving to %s address", label, reason)
                raise MediaError(
                    f"{label}: the URL host {host!r} resolves to {reason} address ({ip}); such addresses are refused",
                    403)
    return addresses
