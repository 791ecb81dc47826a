"""An error answer's access-log line says why (``error_type: message``); a success's line is unchanged."""
from __future__ import annotations

import json
import logging

from tests.inprocess import InProcessServer


class AccessLogTest(InProcessServer):
    def _lines(self, method: str, path: str, body: object = None) -> list[str]:
        logger = logging.getLogger("tornado.access")
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append  # type: ignore[method-assign]
        logger.addHandler(handler)
        old = logger.level
        logger.setLevel(logging.INFO)
        try:
            kw = {"body": json.dumps(body), "headers": {"Content-Type": "application/json"}} if body is not None else {}
            self.fetch(path, method=method, raise_error=False, **kw)
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
        assert lines[0].startswith("200 GET /health") and lines[0].endswith("ms"), lines
