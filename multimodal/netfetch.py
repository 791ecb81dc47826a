"""http(s) media URLs: the host allow-list, one DNS lookup whose every address is checked against the
private-address block, a connection pinned to the checked address (no second lookup, so no DNS
rebinding), no redirects, connect and read timeouts, and the byte cap enforced while the body
streams in. Every failure is a ``MediaError`` (4xx) naming the part."""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from typing import Any
from urllib.parse import urlsplit

from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.httputil import HTTPInputError
from tornado.netutil import Resolver
from tornado.simple_httpclient import HTTPTimeoutError, SimpleAsyncHTTPClient

from mindie_service.errors import MediaError

from .budget import ByteBudget, mb as _mb
from .policy import MediaKind, MediaPolicy, where
from .sniff import SNIFF_BYTES, require_format
from .spool import MediaBytes, Spooler

logger = logging.getLogger(__name__)

USER_AGENT = "mindie-service-media/0.1"

# Cloud instance-metadata endpoints (AWS/GCP/Azure/OpenStack, AWS IPv6, AWS ECS, Alibaba).
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "fd00:ec2::254", "169.254.170.2", "100.100.100.200")
)


def refusal_reason(ip: str) -> str | None:
    """Why connecting to ``ip`` is refused when private URLs are not allowed, or None."""
    addr: Any = ipaddress.ip_address(ip)
    embedded = []
    if addr.version == 6:
        if addr.ipv4_mapped is not None:
            embedded.append(addr.ipv4_mapped)
        if addr.sixtofour is not None:
            embedded.append(addr.sixtofour)
        if addr.teredo is not None:
            embedded.extend(addr.teredo)
        if addr in ipaddress.ip_network("64:ff9b::/96"):  # NAT64
            embedded.append(ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF))
    for a in [*embedded, addr]:  # the embedded IPv4 address names the real target
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


async def resolve_checked(host: str, port: int, kind: MediaKind, index: int,
                          policy: MediaPolicy) -> list[tuple[int, str]]:
    """Resolve ``host`` once; every address must pass the private-address block (unless
    allowed). Returns ``[(family, ip)]`` to connect to: the only addresses ever used."""
    w = where(index, kind)
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        family = socket.AF_INET6 if literal.version == 6 else socket.AF_INET
        addresses = [(int(family), str(literal))]
    else:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.run_in_executor(None, socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM),
                policy.connect_timeout,
            )
        except asyncio.TimeoutError:
            raise MediaError(f"{w}: resolving the URL host timed out", 408) from None
        except (OSError, UnicodeError):
            raise MediaError(f"{w}: the URL host {host!r} could not be resolved", 422) from None
        addresses = []
        for family, _, _, _, sockaddr in infos:
            if family not in (socket.AF_INET, socket.AF_INET6):
                continue
            item = (int(family), str(sockaddr[0]).split("%", 1)[0])
            if item not in addresses:
                addresses.append(item)
        if not addresses:
            raise MediaError(f"{w}: the URL host {host!r} has no IP address", 422)
    if not policy.allow_private_urls:
        for _, ip in addresses:
            reason = refusal_reason(ip)
            if reason is not None:
                logger.info("inputs[%d]: refused URL host resolving to %s address", index, reason)
                raise MediaError(
                    f"{w}: the URL host {host!r} resolves to {reason} address ({ip}); "
                    "such addresses are refused",
                    403,
                )
    return addresses


class _PinnedResolver(Resolver):
    """Answers only for the one host already resolved and checked, with its checked addresses."""

    def initialize(self, host: str, addresses: list[tuple[int, str]]) -> None:  # type: ignore[override]
        self._host = host.lower()
        self._addresses = addresses

    async def resolve(  # type: ignore[override]
        self, host: str, port: int, family: socket.AddressFamily = socket.AF_UNSPEC
    ) -> list[tuple[int, Any]]:
        if host.lower() != self._host:
            raise OSError(f"refusing to resolve unexpected host {host!r}")
        found = [(fam, (ip, port)) for fam, ip in self._addresses
                 if family == socket.AF_UNSPEC or fam == family]
        if not found:
            raise OSError("no checked address of the requested family")
        return found


class _Download:
    """Header and body callbacks for one fetch: status, header count, Content-Length and byte
    caps, early format sniff. A refusal is recorded and the connection aborted by raising
    HTTPInputError (tornado closes the connection quietly)."""

    def __init__(self, kind: MediaKind, index: int, policy: MediaPolicy,
                 budget: ByteBudget | None, spool_threshold: int | None = None) -> None:
        self.kind = kind
        self.index = index
        self.policy = policy
        self.budget = budget
        self.cap = policy.max_bytes(kind)
        self.where = where(index, kind)
        self.code: int | None = None
        self.header_count = 0
        self.body = Spooler(spool_threshold, policy.spool_dir)  # a large video goes to a temporary file
        self.sniffed = False
        self.failure: MediaError | None = None

    def fail(self, error: MediaError) -> None:
        if self.failure is None:
            self.failure = error
        raise HTTPInputError(f"media fetch aborted: {error.message}")

    def on_header(self, line: str) -> None:
        if self.failure is not None:
            raise HTTPInputError("media fetch aborted")
        if self.code is None:
            try:
                self.code = int(line.split()[1])
            except (IndexError, ValueError):
                self.fail(MediaError(f"{self.where}: malformed HTTP status line", 422))
                return
            if 300 <= self.code < 400:
                self.fail(MediaError(
                    f"{self.where}: the URL answered with a redirect (HTTP {self.code}); "
                    "redirects are not followed", 422))
            elif self.code >= 200 and self.code != 200:
                self.fail(MediaError(
                    f"{self.where}: the URL answered HTTP {self.code}, not 200", 422))
            return
        if line in ("\r\n", "\n"):
            if self.code is not None and self.code < 200:  # an interim 1xx: a real status follows
                self.code = None
                self.header_count = 0
            return
        self.header_count += 1
        if self.header_count > self.policy.max_response_headers:
            self.fail(MediaError(
                f"{self.where}: the response has more than "
                f"{self.policy.max_response_headers} headers", 422))
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            try:
                length = int(value.strip().split(",")[0])
            except ValueError:
                self.fail(MediaError(f"{self.where}: malformed Content-Length", 422))
                return
            if length > self.cap:
                self.fail(MediaError(
                    f"{self.where}: Content-Length {length} is over the {self.kind} cap "
                    f"of {_mb(self.cap)}", 413))

    def on_chunk(self, chunk: bytes) -> None:
        if self.failure is not None:
            raise HTTPInputError("media fetch aborted")
        if self.body.size + len(chunk) > self.cap:
            self.fail(MediaError(
                f"{self.where}: the response body is over the {self.kind} cap of "
                f"{_mb(self.cap)}", 413))
        try:
            if self.budget is not None:
                self.budget.take(len(chunk), self.index, self.kind)
            self.body.write(chunk)
            if not self.sniffed and self.body.size >= SNIFF_BYTES:
                self.sniffed = True
                require_format(self.body.head(), self.kind, self.index)
        except MediaError as e:
            self.fail(e)


async def _fetch_url(ref: str, kind: MediaKind, index: int, policy: MediaPolicy,
                     budget: ByteBudget | None) -> MediaBytes:
    w = where(index, kind)
    if len(ref) > policy.max_url_len:
        raise MediaError(
            f"{w}: the URL is {len(ref)} characters, over the limit of {policy.max_url_len}", 422)
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F or c == "\\" for c in ref):
        raise MediaError(f"{w}: the URL contains whitespace, control characters or '\\'", 422)
    if not ref.isascii():
        raise MediaError(f"{w}: the URL must be ASCII (percent-encode or punycode it)", 422)
    try:
        parts = urlsplit(ref)  # ValueError for a malformed IPv6 literal such as http://[::1/x.png
        host = parts.hostname
    except ValueError:
        raise MediaError(f"{w}: the URL is malformed (its host cannot be parsed)", 422) from None
    scheme = parts.scheme.lower()
    if "@" in parts.netloc:
        raise MediaError(f"{w}: credentials in URLs are not allowed", 422)
    if not host:
        raise MediaError(f"{w}: the URL has no host", 422)
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise MediaError(f"{w}: the URL has an invalid port", 422) from None
    if not policy.host_allowed(host):
        logger.info("inputs[%d]: refused URL host not in the allow-list", index)
        raise MediaError(f"{w}: the URL host {host!r} is not in the allowed hosts", 403)
    addresses = await resolve_checked(host, port, kind, index, policy)
    return await http_get_media(ref, host, addresses, kind, index, policy, budget)


async def http_get(url: str, host: str, addresses: list[tuple[int, str]], kind: MediaKind,
                   index: int, policy: MediaPolicy, budget: ByteBudget | None) -> bytes:
    """``http_get_media``'s body as bytes, held in memory."""
    with await http_get_media(url, host, addresses, kind, index, policy, budget, spool=False) as blob:
        assert blob.data is not None
        return blob.data


async def http_get_media(url: str, host: str, addresses: list[tuple[int, str]], kind: MediaKind, index: int,
                         policy: MediaPolicy, budget: ByteBudget | None, *, spool: bool = True) -> MediaBytes:
    """GET ``url`` connecting only to ``addresses`` (already checked), Host header and TLS SNI
    still ``host``. No redirects, caps enforced while streaming; a large video is spooled to a temporary
    file as it arrives (``spool``)."""
    w = where(index, kind)
    download = _Download(kind, index, policy, budget, policy.spool_threshold(kind) if spool else None)
    try:
        return await _get(url, host, addresses, index, policy, download, w)
    except BaseException:  # failed, refused or cancelled: a spooled file goes at once
        download.body.discard()
        raise


async def _get(url: str, host: str, addresses: list[tuple[int, str]], index: int, policy: MediaPolicy,
               download: _Download, w: str) -> MediaBytes:
    client = SimpleAsyncHTTPClient(
        force_instance=True,
        resolver=_PinnedResolver(host=host, addresses=addresses),
        max_clients=1,
        max_header_size=policy.max_header_bytes,
        # Our streaming callback enforces the real cap (so the reason is known); this only
        # keeps tornado's own limit out of the way.
        max_body_size=1 << 62,
    )
    request = HTTPRequest(
        url,
        method="GET",
        headers={"Accept": "*/*", "User-Agent": USER_AGENT},
        follow_redirects=False,
        connect_timeout=policy.connect_timeout,
        request_timeout=policy.connect_timeout + policy.read_timeout,
        decompress_response=False,
        header_callback=download.on_header,
        streaming_callback=download.on_chunk,
        validate_cert=True,
    )
    try:
        response = await client.fetch(request, raise_error=False)
    except HTTPTimeoutError:
        if download.failure is not None:
            raise download.failure from None
        logger.info("inputs[%d]: URL fetch timed out", index)
        raise MediaError(
            f"{w}: fetching the URL timed out (connect {policy.connect_timeout:g} s, "
            f"read {policy.read_timeout:g} s)", 408) from None
    except (HTTPClientError, OSError, HTTPInputError, ValueError) as e:
        if download.failure is not None:
            raise download.failure from None
        logger.info("inputs[%d]: URL fetch failed: %s", index, type(e).__name__)
        raise MediaError(f"{w}: fetching the URL failed ({_describe(e)})", 422) from None
    finally:
        client.close()
    if download.failure is not None:
        raise download.failure
    if response.code != 200:
        raise MediaError(f"{w}: the URL answered HTTP {response.code}, not 200", 422)
    logger.debug("inputs[%d]: fetched %d bytes over http", index, download.body.size)
    return download.body.finish()


def _describe(e: BaseException) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
