"""Two small things a newcomer hit (issue 43): a running model reads "running" in GET /v1/models as in
GET /v1/models/{id}, and POST /stopService takes an empty body (`curl -X POST`), while a cross-site form post
(a form's Content-Type, empty or not) is still refused."""
from __future__ import annotations

import json

from tornado.tcpclient import TCPClient

from tests.inprocess import InProcessServer


class ModelStateAndStopTest(InProcessServer):
    def setUp(self) -> None:
        super().setUp()
        self.stops: list[bool] = []
        self.ctx.request_stop = lambda: self.stops.append(True)

    def _raw_post(self, path: str, headers: dict[str, str], body: bytes = b"") -> int:
        """POST with exactly these headers (tornado's client would add a form Content-Type to a bare POST)."""
        async def go() -> bytes:
            stream = await TCPClient().connect("127.0.0.1", self.get_http_port())
            head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            await stream.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.get_http_port()}\r\n{head}"
                               f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            return await stream.read_until_close()

        return int(self.io_loop.run_sync(go).split(b" ", 2)[1])

    def test_a_running_model_reads_running_in_the_list_and_alone(self) -> None:
        listed = json.loads(self.fetch("/v1/models").body)["data"]
        alone = json.loads(self.fetch("/v1/models/mock").body)
        assert [m["state"] for m in listed if m["id"] == "mock"] == ["running"] == [alone["state"]]

    def test_stop_service_takes_an_empty_body(self) -> None:
        assert self._raw_post("/stopService", {}) == 200  # curl -X POST .../stopService
        assert self._raw_post("/stopService", {"Content-Type": "application/json"}) == 200
        assert len(self.stops) == 2

    def test_an_empty_form_post_is_still_refused(self) -> None:
        for ctype in ("application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x"):
            assert self._raw_post("/stopService", {"Content-Type": ctype}) == 400, ctype
        assert self._raw_post("/stopService", {"Content-Type": "application/json",
                                               "Origin": "http://evil.example"}) == 403
        assert self._raw_post("/stopService", {}, b"not json") == 400
        assert self.stops == []
