"""API keys and routes per plane, on the real Tornado applications (server/app.make_app, one per listener as
server/main.py builds them) in this process, on the StandardMock engine: every key of a plane is accepted (not
only the last), a key of another plane is refused (a management key is not a business key), a 401 never
quotes the key it refuses, every stored hash is compared in constant time (hmac.compare_digest), and the
lifecycle routes answer 403 on the business port while the management port serves them. The slow twin,
with a server process, is tests/integration/test_control_plane.py."""
from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

import tornado.httpserver
import tornado.testing
from tornado.httpclient import HTTPResponse
from tornado.web import Application

from mindie_service.server import auth
from mindie_service.server.app import MANAGEMENT_ONLY, make_app
from tests.inprocess import InProcessServer

BIZ = ("biz-key-first-0001", "biz-key-second-002", "biz-key-third-0003")
ADMIN = ("admin-key-first-01", "admin-key-second-2")
METRICS = "metrics-key-000001"
FILE_KEY = "file-key-abcdefgh01"
GENERATE = {"inputs": "hello", "parameters": {"max_new_tokens": 2}}


class PlanesServer(InProcessServer):
    """The business plane on the test case's port, the management and metrics planes on ports of their own
    (their apps share the context and the key ring, as server/main.py's listeners do)."""

    server: dict[str, Any] = {}

    def get_app(self) -> Application:
        super().get_app()  # the context and its engine (its app of all three planes is not used)
        ring = auth.Auth(self.ctx.settings)
        self.ports: dict[str, int] = {}
        self.extra: list[tornado.httpserver.HTTPServer] = []
        for plane in ("management", "metrics"):
            sock, port = tornado.testing.bind_unused_port()
            srv = tornado.httpserver.HTTPServer(make_app(self.ctx, (plane,), ring))
            srv.add_sockets([sock])
            self.extra.append(srv)
            self.ports[plane] = port
        return make_app(self.ctx, ("business",), ring)

    def tearDown(self) -> None:
        for srv in self.extra:
            srv.stop()
        super().tearDown()

    def call(self, plane: str, method: str, path: str, key: str | None = None, body: Any = None) -> HTTPResponse:
        port = self.get_http_port() if plane == "business" else self.ports[plane]
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        data = json.dumps(body if body is not None else {}) if method in ("POST", "PUT") else None
        return self.fetch(f"http://127.0.0.1:{port}{path}", method=method, headers=headers, body=data,
                          raise_error=False, allow_nonstandard_methods=True)


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class TestKeysPerPlane(PlanesServer):
    server = {"businessApiKeys": list(BIZ), "managementApiKeys": list(ADMIN)}

    def get_app(self) -> Application:
        self._keys = tempfile.TemporaryDirectory()
        keys = Path(self._keys.name) / "keys.txt"  # the apiKeyFile: hashes only
        keys.write_text(f"business sha256:{_digest(FILE_KEY)}\nmetrics sha256:{_digest(METRICS)}\n")
        self.server = {**type(self).server, "apiKeyFile": str(keys)}
        return super().get_app()

    def tearDown(self) -> None:
        super().tearDown()
        self._keys.cleanup()

    def test_every_key_of_a_plane_is_accepted(self) -> None:
        for key in (*BIZ, FILE_KEY):  # the config's, first to last, and the key file's
            assert self.call("business", "POST", "/", key, GENERATE).code == 200, key
            assert self.call("business", "GET", "/v1/models", key).code == 200, key
        for key in ADMIN:
            assert self.call("management", "GET", "/v1/status", key).code == 200, key
        assert self.call("metrics", "GET", "/metrics", METRICS).code == 200

    def test_a_key_of_another_plane_is_refused(self) -> None:
        for key in (*ADMIN, METRICS):  # a management (or metrics) key is not a business key
            assert self.call("business", "POST", "/", key, GENERATE).code == 401, key
            assert self.call("business", "GET", "/v1/models", key).code == 401, key
        for key in (*BIZ, FILE_KEY, METRICS):
            assert self.call("management", "GET", "/v1/status", key).code == 401, key
        for key in (*BIZ, *ADMIN):
            assert self.call("metrics", "GET", "/metrics", key).code == 401, key
        assert self.call("business", "POST", "/", None, GENERATE).code == 401
        assert self.call("business", "GET", "/health").code == 200  # the probes stay open
        assert self.call("management", "GET", "/v2/health/live").code == 200

    def test_a_401_never_quotes_the_refused_key(self) -> None:
        wrong = "wrong-key-0123456789zz"
        for plane, method, path, body in (("business", "POST", "/", GENERATE),
                                          ("business", "POST", "/v1/completions", {"prompt": "a", "max_tokens": 2}),
                                          ("management", "GET", "/v1/status", None),
                                          ("metrics", "GET", "/metrics", None)):
            for key in (wrong, ADMIN[0] if plane != "management" else BIZ[0]):
                r = self.call(plane, method, path, key, body)
                assert r.code == 401 and r.headers["WWW-Authenticate"].startswith("Bearer"), (plane, path)
                text = r.body.decode()
                assert key not in text and key[:8] not in text, text

    def test_every_stored_hash_is_compared_in_constant_time(self) -> None:
        seen: list[tuple[bytes, bytes]] = []
        real = auth.hmac.compare_digest

        def spy(a: bytes, b: bytes) -> bool:
            seen.append((a, b))
            return real(a, b)

        auth.hmac.compare_digest = spy  # type: ignore[assignment]
        try:
            assert self.call("business", "GET", "/v1/models", BIZ[0]).code == 200
            assert self.call("business", "GET", "/v1/models", "not-a-key-000000").code == 401
        finally:
            auth.hmac.compare_digest = real  # type: ignore[assignment]
        stored = {bytes.fromhex(_digest(k)) for k in (*BIZ, FILE_KEY)}
        # each request compared its key's hash with every business hash (the time does not say which matched)
        assert len(seen) == 2 * len(stored) and {b for _, b in seen} == stored
        assert {a for a, _ in seen} == {bytes.fromhex(_digest(BIZ[0])), bytes.fromhex(_digest("not-a-key-000000"))}


class TestLifecycleRoutes(PlanesServer):
    """No keys; managementRoutesOnBusinessPort off (the default)."""

    def test_the_business_port_refuses_what_changes_what_is_served(self) -> None:
        port = str(self.ctx.settings.management_port)
        for path, _, methods in MANAGEMENT_ONLY:
            concrete = path.replace("([^/]+)", "nope")
            for method in methods:
                r = self.call("business", method.upper(), concrete, body={})
                assert r.code == 403, (method, concrete, r.code, r.body)
                error = json.loads(r.body)["error"]
                message = error["message"] if isinstance(error, dict) else error
                assert "management port" in message and port in message, message
                assert isinstance(error, dict) == concrete.startswith("/v1/models")  # each route's dialect

    def test_the_management_port_serves_them(self) -> None:
        for path, _, methods in MANAGEMENT_ONLY:
            if path == r"/stopService":
                continue  # served: it would stop the test's server
            concrete = path.replace("([^/]+)", "nope")
            for method in methods:
                r = self.call("management", method.upper(), concrete, body={})
                assert r.code != 403 and b"unknown route" not in r.body, (method, concrete, r.code, r.body)

    def test_the_business_port_still_serves_its_own(self) -> None:
        assert self.call("business", "POST", "/", None, GENERATE).code == 200
        assert self.call("business", "GET", "/v1/models").code == 200
        assert self.call("business", "GET", "/v1/status").code == 404  # a management route: not here
