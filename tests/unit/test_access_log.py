"""An error answer's access-log line says why (``error_type: message``); a success's line is unchanged."""
from __future__ import annotations

import json
import logging
import re

from tests.inprocess import InProcessServer


class AccessLogTest(InProcessServer):
    def _lines(self, method: str, path: str, body: object = None, headers: dict[str, str] | None = None) -> list[str]:
        logger = logging.getLogger("tornado.access")
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append  # type: ignore[method-assign]
        logger.addHandler(handler)
        old = logger.level
        logger.setLevel(logging.INFO)
        try:
            kw = {"body": json.dumps(body), "headers": {"Content-Type": "application/json"}} if body is not None else {}
            kw.setdefault("headers", {}).update(headers or {})
            self.response = self.fetch(path, method=method, raise_error=False, **kw)
        finally:
            logger.removeHandler(handler)
            logger.setLevel(old)
        return [r.getMessage() for r in records]

    def test_a_refused_value_names_the_parameter(self) -> None:
        lines = self._lines("POST", "/v1/completions", {"model": "mock", "prompt": "hi", "max_tokens": -1})
        assert len(lines) == 1 and lines[0].startswith("400 POST /v1/completions"), lines
        assert lines[0].endswith("validation: Parameter max_tokens must be in (0, 2147483647], got -1"), lines

    def test_an_unknown_route_and_a_bad_body(self) -> None:
        lines = self._lines("GET", "/nowhere")
        assert "404 GET /nowhere" in lines[0] and "unknown route: GET /nowhere" in lines[0], lines
        lines = self._lines("POST", "/generate", {"inputs": 1})
        assert lines[0].startswith("422 POST /generate") and ": validation: " in lines[0], lines

    def test_a_success_has_no_reason(self) -> None:
        lines = self._lines("GET", "/health")
        assert lines[0].startswith("200 GET /health") and ": " not in lines[0], lines
        assert re.search(r"\) \d+\.\d\dms id=[0-9a-f]+-\d+$", lines[0]), lines

    def test_a_generation_logs_its_id_token_counts_and_time_to_first_token(self) -> None:
        lines = self._lines("POST", "/generate", {"inputs": "the secret prompt", "parameters": {"max_new_tokens": 3}})
        assert lines[0].startswith("200 POST /generate"), lines
        m = re.search(r" id=(\S+) prompt_tokens=(\d+) output_tokens=3 ttft=\d+\.\d\dms$", lines[0])
        assert m and int(m.group(2)) > 0, lines
        assert self.response.headers["X-Request-Id"] == m.group(1)
        assert "secret" not in lines[0]  # never the prompt's text

    def test_the_clients_request_id_is_honoured_and_echoed_errors_included(self) -> None:
        lines = self._lines("POST", "/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 1}},
                            headers={"X-Request-Id": "trace-42"})
        assert " id=trace-42 (" in lines[0] and self.response.headers["X-Request-Id"] == "trace-42", lines
        lines = self._lines("GET", "/nowhere", headers={"X-Request-Id": "trace-43"})
        assert self.response.code == 404 and self.response.headers["X-Request-Id"] == "trace-43", lines
        lines = self._lines("POST", "/generate", {"inputs": 1}, headers={"X-Request-Id": "trace-44"})
        assert self.response.code == 422 and self.response.headers["X-Request-Id"] == "trace-44", lines
        lines = self._lines("GET", "/health", headers={"X-Request-Id": "x" * 129})  # too long: replaced
        assert re.fullmatch(r"[0-9a-f]+-\d+", self.response.headers["X-Request-Id"]), lines

    def test_the_end_user_and_cache_key_a_client_names_are_logged(self) -> None:
        body = {"model": "mock", "messages": [{"role": "user", "content": "the secret prompt"}], "max_tokens": 2,
                "safety_identifier": "hashed-user-7", "prompt_cache_key": "team-a"}
        lines = self._lines("POST", "/v1/chat/completions", body)
        assert self.response.code == 200 and " user=hashed-user-7 cache_key=team-a" in lines[0], lines
        assert "secret" not in lines[0]
