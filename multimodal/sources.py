"""Media reference -> raw bytes, from one of three sources, each behind its own guard.

- server-local path (``/abs/path`` or ``file:///abs/path``): only inside the allowed folders
  after symlinks are resolved; ``..`` (plain or percent-encoded) and ``file://host/`` refused;
  size checked with stat before reading; read in a thread.
- ``data:`` URI (base64): size checked on the encoded length before decoding.
- http(s) URL: length and host allow-list checked; the host is resolved once and every address
  checked against the private-address block; the connection goes to the checked address (no
  second lookup, so no DNS rebinding); no redirects; connect and read timeouts; the byte cap is
  enforced while the body streams in, and the format is sniffed from the first bytes.

Every failure is a ``MediaError`` with a 4xx status whose message names the part:
403 refused source, 404 missing local file, 408 timed out, 413 over a cap, 415 unsupported
format, 422 anything else (malformed reference, upstream error)."""
from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import logging
import os
import re
import socket
import stat
from typing import Any
from urllib.parse import unquote, urlsplit

from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.httputil import HTTPInputError
from tornado.netutil import Resolver
from tornado.simple_httpclient import HTTPTimeoutError, SimpleAsyncHTTPClient

from mindie_service.errors import MediaError

from .policy import MediaKind, MediaPolicy, where
from .sniff import SNIFF_BYTES, require_format

logger = logging.getLogger(__name__)

USER_AGENT = "mindie-service-media/0.1"

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
# Data URIs above this many characters are decoded in a thread, not on the IO loop.
_INLINE_B64_CHARS = 256 * 1024
_READ_BLOCK = 1024 * 1024

# Cloud instance-metadata endpoints (AWS/GCP/Azure/OpenStack, AWS IPv6, AWS ECS, Alibaba).
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "fd00:ec2::254", "169.254.170.2", "100.100.100.200")
)


def _mb(n: int) -> str:
    mb = 1024 * 1024
    return f"{n // mb} MB" if n % mb == 0 else f"{n} bytes"


class ByteBudget:
    """Raw bytes all media parts of one request may take together (``max_request_bytes``).
    One per request; shared by its concurrent fetches (all on the IO loop thread)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int, index: int, kind: MediaKind) -> None:
        self.used += n
        if self.used > self.limit:
            raise MediaError(
                f"{where(index, kind)}: the request's media exceed the per-request total of "
                f"{_mb(self.limit)}", 413)


async def fetch_media(
    ref: str,
    kind: MediaKind,
    index: int,
    policy: MediaPolicy,
    *,
    budget: ByteBudget | None = None,
) -> bytes:
    """The raw bytes ``ref`` names, checked against ``policy`` and sniffed to be an accepted
    format for ``kind``. Raises MediaError (4xx) naming ``inputs[index]``."""
    w = where(index, kind)
    if not isinstance(ref, str) or not ref:
        raise MediaError(f"{w}: the reference must be a non-empty string", 422)
    if "\x00" in ref:
        raise MediaError(f"{w}: the reference contains a NUL character", 422)
    m = _SCHEME_RE.match(ref)
    scheme = m.group(1).lower() if m else None
    if scheme in ("http", "https"):
        data = await _fetch_url(ref, kind, index, policy, budget)
    elif scheme == "data":
        data = await _decode_data_uri(ref, kind, index, policy, budget)
    elif scheme == "file" or scheme is None:
        data = await _read_local(ref, scheme == "file", kind, index, policy, budget)
    else:
        raise MediaError(
            f"{w}: unsupported source scheme {scheme!r} "
            "(use a server-local path, a data: URI or an http(s) URL)",
            422,
        )
    require_format(data, kind, index)
    return data


# ---------------------------------------------------------------------------------------------
# Local paths


def _has_dotdot(path: str) -> bool:
    return any(part == ".." for part in re.split(r"[/\\]", path))


def _inside(path: str, root: str) -> bool:
    if path == root:
        return True
    prefix = root if root.endswith(os.sep) else root + os.sep
    return path.startswith(prefix)


def local_path_of(ref: str, is_file_uri: bool, kind: MediaKind, index: int,
                  policy: MediaPolicy) -> str:
    """The filesystem path ``ref`` names, after the lexical checks (no ``..``, plain or
    percent-encoded; no ``file://host``; absolute). The folder check comes after realpath."""
    w = where(index, kind)
    if not policy.allowed_local_paths:
        raise MediaError(f"{w}: server-local paths are not allowed (no allowed folder is set)",
                         403)
    raw = ref
    if is_file_uri:
        parts = urlsplit(ref)
        if parts.netloc:
            raise MediaError(f"{w}: file URIs naming a host (file://host/...) are refused", 403)
        if parts.query or parts.fragment:
            raise MediaError(f"{w}: file URIs may not carry a query or fragment", 422)
        raw = parts.path
    if _has_dotdot(raw):
        raise MediaError(f"{w}: '..' path components are refused", 403)
    decoded = raw
    for _ in range(4):  # catches double encoding (%252e%252e) too
        nxt = unquote(decoded)
        if nxt == decoded:
            break
        decoded = nxt
    if _has_dotdot(decoded):
        raise MediaError(f"{w}: percent-encoded path traversal ('%2e%2e') is refused", 403)
    path = unquote(raw) if is_file_uri else raw
    if "\x00" in path:
        raise MediaError(f"{w}: the path contains a NUL character", 422)
    if not os.path.isabs(path):
        raise MediaError(f"{w}: a server-local path must be absolute", 422)
    return path


def _read_local_file(path: str, kind: MediaKind, index: int, policy: MediaPolicy) -> bytes:
    """Runs in a thread: realpath, folder check, stat, size cap, open, same-file check, read."""
    w = where(index, kind)
    real = os.path.realpath(path)
    roots = [os.path.realpath(r) for r in policy.allowed_local_paths]
    if not any(_inside(real, root) for root in roots):
        raise MediaError(f"{w}: the path is outside the allowed folders", 403)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise MediaError(f"{w}: file not found", 404) from None
    except OSError as e:
        raise MediaError(f"{w}: the file cannot be read ({e.strerror})", 403) from None
    if not stat.S_ISREG(st.st_mode):
        raise MediaError(f"{w}: not a regular file", 422)
    cap = policy.max_bytes(kind)
    if st.st_size > cap:
        raise MediaError(
            f"{w}: the file is {st.st_size} bytes, over the {kind} cap of {_mb(cap)}", 413)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(real, flags)
    except OSError as e:
        raise MediaError(f"{w}: the file cannot be read ({e.strerror})", 403) from None
    try:
        fst = os.fstat(fd)
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(fst.st_mode):
            raise MediaError(f"{w}: the file changed while it was being opened", 403)
        chunks: list[bytes] = []
        total = 0
        while True:
            block = os.read(fd, min(_READ_BLOCK, cap + 1 - total))
            if not block:
                break
            chunks.append(block)
            total += len(block)
            if total > cap:
                raise MediaError(f"{w}: the file is over the {kind} cap of {_mb(cap)}", 413)
        return b"".join(chunks)
    finally:
        os.close(fd)


async def _read_local(ref: str, is_file_uri: bool, kind: MediaKind, index: int,
                      policy: MediaPolicy, budget: ByteBudget | None) -> bytes:
    path = local_path_of(ref, is_file_uri, kind, index, policy)
    loop = asyncio.get_running_loop()
    data = await loop.run_in_executor(None, _read_local_file, path, kind, index, policy)
    if budget is not None:
        budget.take(len(data), index, kind)
    logger.debug("inputs[%d]: read %d bytes from a local file", index, len(data))
    return data


# ---------------------------------------------------------------------------------------------
# data: URIs


def _data_type_ok(mediatype: str, kind: MediaKind) -> bool:
    if kind == "image":
        return mediatype in ("image/jpeg", "image/jpg", "image/png")
    return mediatype.startswith(f"{kind}/") and len(mediatype) > len(kind) + 1


def _b64decode(payload: str) -> bytes:
    if len(payload) % 4:
        payload += "=" * (-len(payload) % 4)
    return base64.b64decode(payload, validate=True)


async def _decode_data_uri(ref: str, kind: MediaKind, index: int, policy: MediaPolicy,
                           budget: ByteBudget | None) -> bytes:
    w = where(index, kind)
    header, sep, payload = ref[5:].partition(",")
    if not sep:
        raise MediaError(f"{w}: malformed data: URI (no ',' before the data)", 422)
    params = [p.strip().lower() for p in header.split(";")]
    mediatype, flags = params[0], params[1:]
    if "base64" not in flags:
        raise MediaError(f"{w}: a data: URI must be base64-encoded (';base64,')", 422)
    if not _data_type_ok(mediatype, kind):
        accepted = "image/jpeg or image/png" if kind == "image" else f"{kind}/*"
        raise MediaError(
            f"{w}: data: URI media type {mediatype or '(none)'!r} is not accepted here "
            f"(expected {accepted})",
            415,
        )
    cap = policy.max_bytes(kind)
    decoded_len = len(payload) * 3 // 4  # an upper bound, known before decoding anything
    if decoded_len > cap:
        raise MediaError(
            f"{w}: the base64 data decodes to about {decoded_len} bytes, over the {kind} cap "
            f"of {_mb(cap)}",
            413,
        )
    if budget is not None:
        budget.take(decoded_len, index, kind)
    try:
        if len(payload) > _INLINE_B64_CHARS:
            loop = asyncio.get_running_loop()
            data = await loop.run_in_executor(None, _b64decode, payload)
        else:
            data = _b64decode(payload)
    except (binascii.Error, ValueError):
        raise MediaError(f"{w}: the data: URI is not valid base64", 422) from None
    if not data:
        raise MediaError(f"{w}: the data: URI is empty", 422)
    return data


# ---------------------------------------------------------------------------------------------
# http(s) URLs


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
                 budget: ByteBudget | None) -> None:
        self.kind = kind
        self.index = index
        self.policy = policy
        self.budget = budget
        self.cap = policy.max_bytes(kind)
        self.where = where(index, kind)
        self.code: int | None = None
        self.header_count = 0
        self.body = bytearray()
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
        if len(self.body) + len(chunk) > self.cap:
            self.fail(MediaError(
                f"{self.where}: the response body is over the {self.kind} cap of "
                f"{_mb(self.cap)}", 413))
        try:
            if self.budget is not None:
                self.budget.take(len(chunk), self.index, self.kind)
            self.body += chunk
            if not self.sniffed and len(self.body) >= SNIFF_BYTES:
                self.sniffed = True
                require_format(bytes(self.body[:SNIFF_BYTES]), self.kind, self.index)
        except MediaError as e:
            self.fail(e)


async def _fetch_url(ref: str, kind: MediaKind, index: int, policy: MediaPolicy,
                     budget: ByteBudget | None) -> bytes:
    w = where(index, kind)
    if len(ref) > policy.max_url_len:
        raise MediaError(
            f"{w}: the URL is {len(ref)} characters, over the limit of {policy.max_url_len}", 422)
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F or c == "\\" for c in ref):
        raise MediaError(f"{w}: the URL contains whitespace, control characters or '\\'", 422)
    if not ref.isascii():
        raise MediaError(f"{w}: the URL must be ASCII (percent-encode or punycode it)", 422)
    parts = urlsplit(ref)
    scheme = parts.scheme.lower()
    if "@" in parts.netloc:
        raise MediaError(f"{w}: credentials in URLs are not allowed", 422)
    host = parts.hostname
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
    return await http_get(ref, host, addresses, kind, index, policy, budget)


async def http_get(url: str, host: str, addresses: list[tuple[int, str]], kind: MediaKind,
                   index: int, policy: MediaPolicy, budget: ByteBudget | None) -> bytes:
    """GET ``url`` connecting only to ``addresses`` (already checked), Host header and TLS SNI
    still ``host``. No redirects, caps enforced while streaming."""
    w = where(index, kind)
    download = _Download(kind, index, policy, budget)
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
    logger.debug("inputs[%d]: fetched %d bytes over http", index, len(download.body))
    return bytes(download.body)


def _describe(e: BaseException) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
