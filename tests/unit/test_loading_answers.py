"""While the default model is still loading (issue 43): a request gets a 503 saying it is loading, with how
long so far and how long is left when a previous load says (never the hint to start it), and the management
port's /v1/status gives its status body with state ``starting`` instead of a 503."""
from __future__ import annotations

import json

from tests.inprocess import InProcessServer


class LoadingAnswersTest(InProcessServer):
    def setUp(self) -> None:
        super().setUp()
        self.ctx.engine, self.ctx.ready = None, False  # as main leaves it while build_engine runs
        entry = self.ctx.catalog.entries["mock"]
        entry.engine = None
        entry.begin_loading()
        entry.last_load_s = 3600.0  # a previous load took an hour: the ETA says about that much is left

    def _post(self, path: str, body: dict) -> tuple[int, str]:
        r = self.fetch(path, method="POST", body=json.dumps(body), headers={"Content-Type": "application/json"},
                       raise_error=False)
        return r.code, r.body.decode()

    def test_a_generation_request_hears_that_the_model_is_loading(self) -> None:
        for path, body in (("/", {"inputs": "hi"}), ("/generate", {"inputs": "hi"}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
            code, text = self._post(path, body)
            assert code == 503, (path, code, text)
            assert "the model mock is still loading (loading the weights, 0 s so far, about 3600 s left)" in text, text
            assert "/start" not in text and "state: starting" not in text, text

    def test_health_says_how_far_the_load_has_come(self) -> None:
        r = self.fetch("/health", raise_error=False)
        assert r.code == 503 and b"the model mock is still loading (loading the weights, " in r.body, r.body

    def test_status_gives_its_body_with_state_starting(self) -> None:
        r = self.fetch("/v1/status", raise_error=False)
        assert r.code == 200, r.body
        body = json.loads(r.body)
        assert body["status"] == "not ready" and body["model"]["state"] == "starting", body
        loading = body["model"]["loading"]
        assert loading["phase"] == "loading the weights" and loading["elapsed_s"] >= 0 and loading["eta_s"] > 3500

    def test_once_loaded_the_load_time_is_kept_for_the_next_eta(self) -> None:
        entry = self.ctx.catalog.entries["mock"]
        entry.last_load_s = None
        entry.loaded(self.engine)
        assert entry.state == "running" and entry.last_load_s is not None and entry.loading_json() is None
