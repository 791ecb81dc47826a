"""multimodal.sources / netfetch: http(s) media URLs behind their guards.

Network: loopback only. Addresses that must be refused are refused before any connection is
attempted (the connecting function is replaced by one that fails the test)."""
from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.web import Application, RequestHandler

from mindie_service.errors import MediaError
from mindie_service.netguard import FetchPolicy
from multimodal import MediaPolicy, fetch_media, refusal_reason
from multimodal import sources
from tests.media_helpers import PNG, netfetch, refused, run

# ---------------------------------------------------------------------------------------------
# http(s) URLs (a loopback tornado server)


RELEASE = "release"  # settings key for an asyncio.Event the slow handler waits on


class ImageHandler(RequestHandler):
    def get(self) -> None:
        self.set_header("Content-Type", "image/png")
        self.write(PNG)


class HostEchoHandler(RequestHandler):
    def get(self) -> None:
        self.application.settings["seen_hosts"].append(self.request.host)
        self.write(PNG)


class RedirectHandler(RequestHandler):
    def get(self) -> None:
        self.redirect("/img.png")


class NotFoundHandler(RequestHandler):
    def get(self) -> None:
        self.set_status(404)
        self.write("nope")


class BigHandler(RequestHandler):
    """Content-Length over the cap."""

    def get(self) -> None:
        self.write(PNG + b"\0" * 200_000)


class ChunkedBigHandler(RequestHandler):
    """No Content-Length: chunked, each piece under the cap, the total over it."""

    async def get(self) -> None:
        self.write(PNG)
        await self.flush()
        for _ in range(20):
            self.write(b"\0" * 16_000)
            await self.flush()


class SlowHandler(RequestHandler):
    """Sends the start of a body, then stalls past the read timeout."""

    async def get(self) -> None:
        self.set_header("Content-Length", str(len(PNG) + 10))
        self.write(PNG)
        await self.flush()
        try:
            await asyncio.wait_for(self.application.settings[RELEASE].wait(), 10)
        except asyncio.TimeoutError:
            pass
        self.write(b"\0" * 10)


async def with_server(body: Callable[[str, dict[str, Any]], Awaitable[Any]]) -> Any:
    settings: dict[str, Any] = {RELEASE: asyncio.Event(), "seen_hosts": []}
    app = Application([
        (r"/img.png", ImageHandler),
        (r"/echo.png", HostEchoHandler),
        (r"/redirect", RedirectHandler),
        (r"/missing", NotFoundHandler),
        (r"/big", BigHandler),
        (r"/chunked-big", ChunkedBigHandler),
        (r"/slow", SlowHandler),
    ], **settings)
    server = HTTPServer(app)
    [sock] = bind_sockets(0, "127.0.0.1", family=socket.AF_INET)
    server.add_sockets([sock])
    port = sock.getsockname()[1]
    try:
        return await body(f"http://127.0.0.1:{port}", settings)
    finally:
        settings[RELEASE].set()
        server.stop()
        await server.close_all_connections()


LOOPBACK_OK = MediaPolicy(FetchPolicy(allow_private_urls=True, connect_timeout=2.0, read_timeout=2.0),
                          max_image_bytes=64_000)


def http_case(path: str, policy: MediaPolicy = LOOPBACK_OK, kind: str = "image"
              ) -> bytes | MediaError:
    async def body(base: str, _: dict[str, Any]) -> bytes | MediaError:
        try:
            return await fetch_media(base + path, kind, 1, policy)  # type: ignore[arg-type]
        except MediaError as e:
            return e

    return run(with_server(body))


def test_http_fetch_from_loopback_when_private_urls_allowed() -> None:
    assert http_case("/img.png") == PNG


def test_http_loopback_refused_by_default() -> None:
    err = http_case("/img.png", MediaPolicy())
    assert isinstance(err, MediaError) and err.status == 403
    assert "loopback" in err.message and "inputs[1] (image_url)" in err.message


@pytest.fixture()
def no_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    async def boom(*args: Any, **kwargs: Any) -> bytes:
        raise AssertionError("a connection was attempted")

    monkeypatch.setattr(sources, "http_get", boom)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("url, reason", [
    ("http://127.0.0.1/x.png", "loopback"),
    ("http://169.254.169.254/latest/meta-data/", "cloud metadata"),
    ("http://10.0.0.1/x.png", "private"),
    ("http://192.168.1.7:8080/x.png", "private"),
    ("http://100.64.0.9/x.png", "non-public"),
    ("http://0.0.0.0/x.png", "unspecified"),
    ("http://224.0.0.1/x.png", "multicast"),
    ("https://[::1]/x.png", "loopback"),
    ("http://[fd00:ec2::254]/x.png", "cloud metadata"),
    ("http://[::ffff:127.0.0.1]/x.png", "loopback"),
    ("http://[fe80::1]/x.png", "link-local"),
])
def test_private_addresses_refused_before_connecting(no_connect: None, url: str,
                                                      reason: str) -> None:
    err = refused(url, MediaPolicy())
    assert err.status == 403 and reason in err.message


def test_refusal_reason_allows_public_addresses() -> None:
    assert refusal_reason("93.184.216.34") is None
    assert refusal_reason("2606:2800:220:1:248:1893:25c8:1946") is None
    assert refusal_reason("169.254.169.254") == "a cloud metadata"


def test_host_allow_list(no_connect: None) -> None:
    policy = MediaPolicy(FetchPolicy(allowed_hosts=("media.example.com", ".cdn.example.org")))
    err = refused("http://evil.example.net/a.png", policy)
    assert err.status == 403 and "allowed hosts" in err.message
    assert policy.fetch.host_allowed("media.example.com")
    assert policy.fetch.host_allowed("img.cdn.example.org")
    assert not policy.fetch.host_allowed("cdn.example.org.evil.net")
    assert not policy.fetch.host_allowed("xmedia.example.com")


def test_allowed_host_still_needs_a_public_address(no_connect: None) -> None:
    policy = MediaPolicy(FetchPolicy(allowed_hosts=("127.0.0.1",)))
    assert refused("http://127.0.0.1/a.png", policy).status == 403


def test_url_shape_checks(no_connect: None) -> None:
    policy = MediaPolicy(FetchPolicy(max_url_len=100))
    assert "over the limit" in refused("http://93.184.216.34/" + "a" * 100, policy).message
    assert "credentials" in refused("http://user:pw@93.184.216.34/a.png", policy).message
    assert refused("http://93.184.216.34/a b.png", policy).status == 422
    assert refused("http:///a.png", policy).status == 422


def test_connection_goes_to_the_checked_address_keeping_the_host_header() -> None:
    async def body(base: str, settings: dict[str, Any]) -> bytes:
        port = int(base.rsplit(":", 1)[1])
        url = f"http://media.invalid:{port}/echo.png"
        data = await netfetch.http_get(url, "media.invalid", [(socket.AF_INET, "127.0.0.1")],
                                      "image", 0, LOOPBACK_OK, None)
        assert settings["seen_hosts"] == [f"media.invalid:{port}"]
        return data

    assert run(with_server(body)) == PNG


def test_pinned_resolver_refuses_any_other_host() -> None:
    resolver = netfetch._PinnedResolver(host="media.invalid",
                                       addresses=[(socket.AF_INET, "127.0.0.1")])
    assert run(resolver.resolve("media.invalid", 80)) == [(socket.AF_INET, ("127.0.0.1", 80))]
    with pytest.raises(OSError):
        run(resolver.resolve("other.invalid", 80))


def test_redirect_is_refused() -> None:
    err = http_case("/redirect")
    assert isinstance(err, MediaError) and err.status == 422
    assert "redirects are not followed" in err.message and "302" in err.message


def test_non_200_is_refused_with_its_status() -> None:
    err = http_case("/missing")
    assert isinstance(err, MediaError) and "HTTP 404" in err.message


def test_content_length_over_cap_is_refused() -> None:
    err = http_case("/big")
    assert isinstance(err, MediaError) and err.status == 413
    assert "Content-Length" in err.message


def test_chunked_body_over_cap_is_refused_while_streaming() -> None:
    err = http_case("/chunked-big")
    assert isinstance(err, MediaError) and err.status == 413
    assert "body is over" in err.message


RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def raw_server_refusal(handle: RawHandler) -> MediaError:
    """The MediaError of fetching an image from a raw asyncio server that answers with ``handle`` (for
    responses the test HTTP server cannot produce)."""
    async def main() -> MediaError:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            with pytest.raises(MediaError) as info:
                await fetch_media(f"http://127.0.0.1:{port}/x", "image", 0, LOOPBACK_OK)
            return info.value
        finally:
            server.close()

    return run(main())


def test_body_without_length_read_until_close_over_cap_is_refused() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + PNG)
        try:
            for _ in range(50):
                writer.write(b"\0" * 16_000)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        writer.close()

    assert raw_server_refusal(handle).status == 413


def test_too_many_response_headers_is_refused() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        headers = b"".join(b"X-H%d: v\r\n" % i for i in range(200))
        writer.write(b"HTTP/1.1 200 OK\r\n" + headers
                     + b"Content-Length: %d\r\n\r\n" % len(PNG) + PNG)
        await writer.drain()
        writer.close()

    assert "headers" in raw_server_refusal(handle).message


def test_slow_body_past_read_timeout_is_refused() -> None:
    policy = MediaPolicy(FetchPolicy(allow_private_urls=True, connect_timeout=0.3, read_timeout=0.3))
    err = http_case("/slow", policy)
    assert isinstance(err, MediaError) and err.status == 408
    assert "timed out" in err.message


def test_wrong_format_over_http_is_refused() -> None:
    err = http_case("/img.png", kind="video")
    assert isinstance(err, MediaError) and err.status == 415 and "PNG image" in err.message
