"""A server in the test's own process, on the StandardMock engine (no weights), for handler tests that
need to reach into the server's state (its pools, its engine, its counters)."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from tornado.testing import AsyncHTTPTestCase
from tornado.web import Application

from mindie_service.config import load_config
from mindie_service.devkit.mock_engine import MockEngine
from mindie_service.server.app import make_app
from mindie_service.server.context import ServerContext
from tests.server_utils import write_mock_config


class InProcessServer(AsyncHTTPTestCase):
    """``ctx`` and a started ``engine`` (``make_engine``), all three planes on one port. ``server``: the
    ServerConfig keys of the class's config (tests.server_utils.write_mock_config)."""

    server: dict[str, Any] = {}

    def make_engine(self, ctx: ServerContext) -> MockEngine:
        return MockEngine(ctx.engine_config)

    def get_app(self) -> Application:
        self._tmp = tempfile.TemporaryDirectory()
        self.ctx = ServerContext(load_config(write_mock_config(Path(self._tmp.name), **self.server)))
        self.engine = self.make_engine(self.ctx)
        self.engine.start()
        self.ctx.attach_engine(self.engine)
        self.ctx.ready = True
        return make_app(self.ctx, ("business", "management", "metrics"))

    def tearDown(self) -> None:
        super().tearDown()
        self.ctx.executor.shutdown(wait=False)
        self._tmp.cleanup()
