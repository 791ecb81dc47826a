"""Many models on one server (issue 46), in process on StandardMock engines: a request naming a stopped catalog
model loads it (one load shared by concurrent requests), a failed load answers its load_error as 424 without a
retry per request, maxLoadedModels and modelMemoryBudget unload idle models least recently used first and never one
with a request in flight (429 naming the budget once the bound passes), keep_alive and idleUnloadSeconds unload
idle models, and business-plane loads can be switched off or limited to a list."""
from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from unittest import mock

from tornado.testing import AsyncHTTPTestCase, gen_test
from tornado.web import Application

from mindie_service.catalog.memory_meter import LoadMeter
from mindie_service.catalog.residency_stats import MeasuredMemory
from mindie_service.config import load_config
from mindie_service.devkit.mock_engine import MockEngine
from mindie_service.server.app import make_app
from mindie_service.server.context import ServerContext

MODELS = ("m1", "m2", "m3")


def _config(folder: Path, server: dict[str, Any]) -> Path:
    mock = {"modelInstanceType": "StandardMock", "modelWeightPath": "none"}
    cfg = {"ServerConfig": {"httpsEnabled": False, "maxLinkNum": 16, **server},
           "BackendConfig": {"tokenizerProcessNumber": 1, "ModelDeployConfig": {
               "maxSeqLen": 256, "maxInputTokenLen": 128,
               "ModelConfig": [{**mock, "modelName": "mock"}] + [{**mock, "modelName": m} for m in MODELS]},
               "ScheduleConfig": {"maxPrefillTokens": 256, "maxIterTimes": 64}}}
    path = folder / "config.json"
    path.write_text(json.dumps(cfg))
    return path


class ResidencyServer(AsyncHTTPTestCase):
    """The default model ``mock`` running, m1..m3 stopped ModelConfig entries; ``builds`` counts engine builds per
    model; a model named in ``failing`` fails its build; each build takes ``build_s`` (in the load's thread)."""

    server: dict[str, Any] = {}
    build_s = 0.0

    def get_app(self) -> Application:
        self._tmp = tempfile.TemporaryDirectory()
        self.ctx = ServerContext(load_config(_config(Path(self._tmp.name), self.server)))
        self.builds: dict[str, int] = {}
        self.failing: set[str] = set()
        self._lock = threading.Lock()
        self.ctx.catalog.build = self._build
        engine = MockEngine(self.ctx.engine_config)
        engine.start()
        self.ctx.attach_engine(engine)
        self.ctx.ready = True
        return make_app(self.ctx, ("business", "management", "metrics"))

    def _build(self, ec: Any, mock: bool) -> MockEngine:
        with self._lock:
            self.builds[ec.model_name] = self.builds.get(ec.model_name, 0) + 1
        time.sleep(self.build_s)
        if ec.model_name in self.failing:
            raise RuntimeError(f"weights of {ec.model_name} are broken")
        return MockEngine(ec)

    def tearDown(self) -> None:
        self.io_loop.run_sync(self.ctx.residency.shutdown)
        super().tearDown()
        self.ctx.executor.shutdown(wait=False)
        self._tmp.cleanup()

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        return await self.http_client.fetch(self.get_url(path), method="POST", raise_error=False, body=json.dumps(body),
                                            headers={"Content-Type": "application/json"}, request_timeout=60)

    async def complete(self, model: str, **extra: Any) -> tuple[int, dict[str, Any]]:
        r = await self.post("/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 3, **extra})
        return r.code, json.loads(r.body)

    def state(self, model: str) -> str:
        return self.ctx.catalog.entries[model].state

    async def settle(self, model: str, state: str, within: float = 10.0) -> bool:
        """Whether ``model`` reaches ``state`` within ``within`` seconds (a stop drains and runs in the background)."""
        end = time.monotonic() + within
        while time.monotonic() < end:
            if self.state(model) == state:
                return True
            await asyncio.sleep(0.05)
        return False

    def resident(self) -> list[str]:
        return sorted(e.id for e in self.ctx.catalog.entries.values() if self.ctx.residency.resident(e))


class LoadOnDemandTest(ResidencyServer):
    build_s = 0.3

    @gen_test(timeout=60)
    async def test_concurrent_requests_share_one_load(self) -> None:
        assert self.state("m1") == "stopped"
        results = await asyncio.gather(*(self.complete("m1") for _ in range(5)))
        assert all(code == 200 and body["model"] == "m1" for code, body in results), results
        assert self.builds == {"m1": 1} and self.state("m1") == "running"
        e = self.ctx.catalog.entries["m1"]
        assert e.counters.loads == 1 and e.counters.load_waits == 5 and e.last_used is not None

    @gen_test(timeout=60)
    async def test_a_request_that_waited_for_the_load_says_how_long(self) -> None:
        body = {"model": "m1", "prompt": "hi", "max_tokens": 2}
        first, second = await self.post("/v1/completions", body), await self.post("/v1/completions", body)
        assert first.code == second.code == 200
        assert float(first.headers["X-Model-Load-Wait"]) >= 0.3  # the build alone takes build_s
        assert "X-Model-Load-Wait" not in second.headers

    @gen_test(timeout=60)
    async def test_a_failed_load_is_a_424_with_its_error_and_is_not_retried(self) -> None:
        self.failing.add("m2")
        for _ in range(3):
            code, body = await self.complete("m2")
            assert code == 424, body
            assert "weights of m2 are broken" in body["error"]["message"] and body["error"]["code"] == "model_load_failed"
        assert self.builds == {"m2": 1} and self.state("m2") == "failed"
        r = await self.http_client.fetch(self.get_url("/v1/models/m2"), raise_error=False)
        assert "weights of m2 are broken" in json.loads(r.body)["load_error"]

    @gen_test(timeout=60)
    async def test_other_routes_load_too(self) -> None:
        r = await self.post("/v1/chat/completions", {"model": "m3", "max_tokens": 2,
                                                     "messages": [{"role": "user", "content": "hi"}]})
        assert r.code == 200, r.body
        r = await self.post("/tokenize", {"model": "m1", "prompt": "hi"})
        assert r.code == 200, r.body
        assert self.state("m3") == "running" and self.state("m1") == "running"


class LoadsOffTest(ResidencyServer):
    server = {"loadableModels": ["m1"]}

    @gen_test(timeout=60)
    async def test_only_the_listed_models_load(self) -> None:
        code, body = await self.complete("m2")
        assert code == 503 and "ServerConfig.loadableModels" in body["error"]["message"], body
        assert (await self.complete("m1"))[0] == 200
        assert "m2" not in self.builds


class MaxLoadedTest(ResidencyServer):
    server = {"maxLoadedModels": 2}

    @gen_test(timeout=60)
    async def test_least_recently_used_idle_model_goes_first(self) -> None:
        assert (await self.complete("mock"))[0] == 200  # the default model, resident since start
        assert (await self.complete("m1"))[0] == 200  # evicts nothing yet? two loaded now: mock, m1
        assert self.resident() == ["m1", "mock"]
        assert (await self.complete("mock"))[0] == 200  # mock used after m1: m1 is the least recent
        assert (await self.complete("m2"))[0] == 200
        assert self.resident() == ["m2", "mock"]
        assert self.ctx.catalog.entries["m1"].counters.evictions["max_loaded"] == 1
        assert (await self.complete("m1"))[0] == 200  # loaded again; the default model was the least recent
        assert self.resident() == ["m1", "m2"] and self.ctx.healthy()  # a parked default model stays healthy
        code, _ = await self.complete("mock")
        assert code == 200 and self.resident() == ["m1", "mock"]

    @gen_test(timeout=60)
    async def test_a_model_with_a_request_in_flight_is_never_evicted(self) -> None:
        cat = self.ctx.catalog
        held = cat.resolve("mock")  # a request in flight on the default model
        try:
            assert (await self.complete("m1"))[0] == 200
            self.ctx.residency.policy = type(self.ctx.residency.policy)(max_loaded=2, load_timeout_s=0.3)
            held_m1 = cat.resolve("m1")
            try:
                code, body = await self.complete("m2")
                assert code == 429 and "maxLoadedModels = 2" in body["error"]["message"], body
            finally:
                cat.release(held_m1)
            assert self.state("mock") == "running"
        finally:
            cat.release(held)


class BudgetTest(ResidencyServer):
    server = {"modelMemoryBudget": "1GiB"}

    def setUp(self) -> None:
        super().setUp()
        size = MeasuredMemory(weights=300 << 20, kv_pool=80 << 20, workspace=20 << 20)  # 400 MiB each
        for m in ("mock",) + MODELS:
            self.ctx.catalog.entries[m].memory = size
        patcher = mock.patch.object(LoadMeter, "result", lambda meter, engine, mock=False: size)  # what each load measures
        patcher.start()
        self.addCleanup(patcher.stop)

    @gen_test(timeout=60)
    async def test_the_budget_holds_two_and_eviction_names_it(self) -> None:
        for m in ("m1", "m2", "m3", "m1"):
            assert (await self.complete(m))[0] == 200
            assert len(self.resident()) <= 2, self.resident()
        assert sum(e.counters.evictions["budget"] for e in self.ctx.catalog.entries.values()) >= 3

    @gen_test(timeout=60)
    async def test_a_model_over_the_whole_budget_is_refused_at_once(self) -> None:
        self.ctx.catalog.entries["m3"].memory = MeasuredMemory(weights=2 << 30, kv_pool=0, workspace=0)
        code, body = await self.complete("m3")
        assert code == 429 and "modelMemoryBudget = 1GiB" in body["error"]["message"], body
        assert "m3" not in self.builds

    @gen_test(timeout=60)
    async def test_a_load_fits_only_where_its_peak_does(self) -> None:
        """m2 stays at 400 MiB but its last load peaked at 700 MiB (the checkpoint's pages while read): beside the
        resident default model's 400 MiB that is over 1 GiB at the load's highest, so the default model goes first."""
        self.ctx.catalog.entries["m2"].memory = MeasuredMemory(weights=300 << 20, kv_pool=80 << 20,
                                                               workspace=20 << 20, peak=700 << 20)
        assert (await self.complete("m2"))[0] == 200
        assert self.resident() == ["m2"] and self.ctx.catalog.entries["mock"].counters.evictions["budget"] == 1


class MeasuredFitTest(ResidencyServer):
    """m1..m3's header estimate is 300 MiB, each load measures ``self.size`` (600 MiB unless a test changes it)."""

    server = {"modelMemoryBudget": "1GiB"}

    def setUp(self) -> None:
        super().setUp()
        self.size = 600 << 20
        for target, fn in ((LoadMeter, lambda meter, engine, mock=False: MeasuredMemory(
                weights=self.size, kv_pool=0, workspace=0)),
                (type(self.ctx.catalog), lambda cat, e: 0 if e.id == "mock" else 300 << 20)):
            patcher = mock.patch.object(target, "result" if target is LoadMeter else "need_bytes", fn)
            patcher.start()
            self.addCleanup(patcher.stop)

    @gen_test(timeout=60)
    async def test_an_unmeasured_model_counts_what_loads_took_beyond_their_estimate(self) -> None:
        assert (await self.complete("m1"))[0] == 200  # 300 MiB by its estimate, 600 measured
        assert self.ctx.residency.beyond_estimate == 300 << 20
        assert (await self.complete("m2"))[0] == 200  # 300 + 300 MiB beside m1's 600: over 1 GiB, m1 goes first
        assert self.resident() == ["m2"] and self.ctx.catalog.entries["m1"].counters.evictions["budget"] == 1

    @gen_test(timeout=60)
    async def test_a_model_counts_its_highest_measurement(self) -> None:
        assert (await self.complete("m1"))[0] == 200
        self.ctx.catalog.stop("m1")
        assert await self.settle("m1", "stopped")
        self.size = 200 << 20  # the next load measures less (requests beside it, the heap it found)
        assert (await self.complete("m1"))[0] == 200
        e = self.ctx.catalog.entries["m1"]
        assert e.memory.total == 200 << 20 and self.ctx.residency.need_bytes(e) == 600 << 20
        assert self.ctx.residency.held_bytes(e) == 600 << 20


class KeepAliveTest(ResidencyServer):
    server = {"idleUnloadSeconds": 0.5}

    def setUp(self) -> None:
        super().setUp()
        self.io_loop.add_callback(self.ctx.residency.start)

    @gen_test(timeout=60)
    async def test_keep_alive_zero_unloads_after_the_request(self) -> None:
        code, _ = await self.complete("m1", keep_alive=0)
        assert code == 200
        assert await self.settle("m1", "stopped", within=2.0)
        assert self.ctx.catalog.entries["m1"].counters.evictions["keep_alive"] == 1

    @gen_test(timeout=60)
    async def test_idle_unload_seconds_unloads_on_time_and_forever_keeps(self) -> None:
        assert (await self.complete("m1"))[0] == 200
        assert (await self.complete("m2", keep_alive=-1))[0] == 200
        assert (await self.complete("m3", keep_alive="1h"))[0] == 200
        m1 = self.ctx.catalog.entries["m1"]
        if time.monotonic() - m1.idle_since < 0.4:  # (a loaded machine may have taken longer than that already)
            assert self.state("m1") == "running"  # not before its idleUnloadSeconds
        assert await self.settle("m1", "stopped")
        assert self.ctx.catalog.entries["m1"].counters.evictions["idle"] == 1
        await asyncio.sleep(0.6)
        assert self.state("m2") == "running" and self.state("m3") == "running"

    @gen_test(timeout=60)
    async def test_keep_alive_on_the_default_models_routes(self) -> None:
        r = await self.post("/api/generate-one", {"prompt": "hi", "request_id": "r1", "keep_alive": 0})  # REST
        assert r.code == 200, r.body
        evictions = self.ctx.catalog.entries["mock"].counters.evictions
        assert await self.settle("mock", "stopped", within=2.0)
        assert evictions["keep_alive"] == 1 and evictions["idle"] == 0  # its keep_alive, not idleUnloadSeconds
        assert self.ctx.healthy()  # unloaded by residency: the next request loads it
        r = await self.post("/", {"inputs": "hi", "keep_alive": "0s", "parameters": {"max_new_tokens": 2}})
        assert r.code == 200 and float(r.headers["X-Model-Load-Wait"]) >= 0, r.body
        assert await self.settle("mock", "stopped", within=2.0)
        assert evictions["keep_alive"] == 2 and evictions["idle"] == 0
        r = await self.post("/v2/models/mock/infer", {"keep_alive": -1, "inputs": [
            {"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["hi"]}]})
        assert r.code == 200, r.body
        await asyncio.sleep(0.7)
        assert self.state("mock") == "running"  # -1: kept past idleUnloadSeconds

    @gen_test(timeout=60)
    async def test_routes_that_read_the_parked_default_model_load_it(self) -> None:
        """TGI's /info and MindIE's tokenizer answer after keep_alive 0 parked the default model, as a generation
        request would (a 503 "stopped" there was what schemathesis found)."""
        for path, body in (("/info", None), ("/v1/tokenizer", {"inputs": "hi"})):
            r = await self.post("/api/generate-one", {"prompt": "hi", "request_id": "r1", "keep_alive": 0})
            assert r.code == 200 and await self.settle("mock", "stopped", within=2.0), r.body
            r = await (self.post(path, body) if body else self.http_client.fetch(self.get_url(path), raise_error=False))
            assert r.code == 200 and self.state("mock") == "running", (path, r.body)

    @gen_test(timeout=60)
    async def test_malformed_keep_alive_is_refused_in_the_route_shape(self) -> None:
        for bad in ("soon", "5 minutes", True, [1], "1e999h"):
            code, body = await self.complete("m1", keep_alive=bad)
            assert code == 400 and "keep_alive" in body["error"]["message"], (bad, body)
        r = await self.post("/", {"inputs": "hi", "keep_alive": "later"})
        assert r.code == 422 and "keep_alive" in json.loads(r.body)["error"], r.body


class ViewsAndMetricsTest(ResidencyServer):
    server = {"maxLoadedModels": 2}

    @gen_test(timeout=60)
    async def test_list_detail_status_and_metrics_show_residency(self) -> None:
        assert (await self.complete("m1"))[0] == 200
        assert (await self.complete("m2"))[0] == 200  # evicts the default model (least recently used)
        listed = {m["id"]: m for m in json.loads((await self.http_client.fetch(self.get_url("/v1/models"))).body)["data"]}
        assert listed["m1"]["status"] == "running" and listed["m1"]["last_used"] > 0
        assert listed["mock"]["status"] == "stopped" and listed["m3"]["last_used"] is None
        got = json.loads((await self.http_client.fetch(self.get_url("/v1/models/m1"))).body)
        measured = got["memory"]["measured"]
        assert measured is not None and measured["kv_pool_bytes"] == 0  # a mock has no pool
        # the process's first measured load also paid the runtime's start: the fit check keeps the estimate then
        assert got["memory"]["fit_check_uses"] == ("estimate" if measured["includes_runtime_start"] else "measured")
        assert got["memory"]["loads"] == 1
        st = json.loads((await self.http_client.fetch(self.get_url("/v1/status"))).body)
        assert st["residency"]["loaded"] == 2 and st["residency"]["maxLoadedModels"] == 2, st
        text = (await self.http_client.fetch(self.get_url("/metrics"))).body.decode()
        assert 'model_loads_total{model_name="m1"} 1.0' in text
        assert 'model_evictions_total{model_name="mock",reason="max_loaded"} 1.0' in text
        assert 'model_state{model_name="mock",state="stopped"} 1.0' in text
        assert 'model_state{model_name="m2",state="running"} 1.0' in text
        assert 'model_load_seconds_count{model_name="m2"} 1.0' in text


class SleepRoutesTest(ResidencyServer):
    async def call(self, method: str, path: str) -> tuple[int, dict[str, Any]]:
        r = await self.http_client.fetch(self.get_url(path), method=method, raise_error=False,
                                         body=b"" if method == "POST" else None)
        return r.code, json.loads(r.body)

    @gen_test(timeout=60)
    async def test_level_two_sleeps_and_a_request_wakes_it(self) -> None:
        assert (await self.complete("m1"))[0] == 200
        code, body = await self.call("POST", "/sleep?level=2&model=m1")
        assert code == 200 and body == {"model": "m1", "is_sleeping": True, "level": 2, "state": "sleeping"}, body
        e = self.ctx.catalog.entries["m1"]
        assert e.engine is None and e.counters.sleeps == 1
        assert (await self.call("GET", "/is_sleeping?model=m1"))[1]["is_sleeping"] is True
        code, body = await self.complete("m1")  # a request wakes it, as load on demand does
        assert code == 200 and self.state("m1") == "running" and self.builds["m1"] == 2
        assert (await self.call("POST", "/sleep?level=2&model=m1"))[0] == 200
        code, body = await self.call("POST", "/wake_up?model=m1")
        assert code == 200 and body["state"] == "running" and self.builds["m1"] == 3

    @gen_test(timeout=60)
    async def test_bad_levels_and_engines_without_a_pool_are_refused(self) -> None:
        code, body = await self.call("POST", "/sleep?level=3&model=mock")
        assert code == 422 and "level must be 1" in body["error"]
        code, body = await self.call("POST", "/sleep?level=1&model=mock")  # StandardMock: no KV pool to free
        assert code == 409 and "no KV pool of its own" in body["error"], body
        assert self.state("mock") == "running"
        assert (await self.call("POST", "/sleep?level=1&model=m2"))[0] == 409  # stopped: nothing to put to sleep
        assert (await self.call("POST", "/sleep?level=1&model=nope"))[0] == 404


class OneAtATimeTest(ResidencyServer):
    server = {"maxLoadedModels": 1, "modelLoadTimeoutSeconds": 20}

    @gen_test(timeout=60)
    async def test_a_model_just_loaded_serves_its_waiters_before_it_can_be_evicted(self) -> None:
        results = await asyncio.gather(*(self.complete(m) for m in ("m1", "m2") * 3))
        assert [code for code, _ in results] == [200] * 6, results
        assert self.builds == {"m1": 1, "m2": 1}  # no thrash: each loaded once, its three requests served


class ManagementStartTest(ResidencyServer):
    server = {"maxLoadedModels": 1, "modelLoadTimeoutSeconds": 0.5}

    async def start(self, model: str) -> tuple[int, dict[str, Any]]:
        r = await self.http_client.fetch(self.get_url(f"/v1/models/{model}/start"), method="PUT", body=b"",
                                         raise_error=False)
        return r.code, json.loads(r.body)

    def test_boot_starts_only_what_fits(self) -> None:
        """server/main starts the other ModelConfig entries at boot only where no_room says they fit."""
        assert "maxLoadedModels = 1" in self.ctx.residency.no_room(self.ctx.catalog.entries["m1"])
        assert self.ctx.residency.no_room(self.ctx.catalog.entries["mock"]) is None  # itself does not count

    @gen_test(timeout=60)
    async def test_a_management_start_makes_room_as_a_request_does(self) -> None:
        code, body = await self.start("m1")  # the idle default model goes first
        assert code == 200 and body["state"] in ("starting", "running"), body
        while self.state("m1") == "starting":
            await asyncio.sleep(0.02)
        assert self.resident() == ["m1"]
        held = self.ctx.catalog.resolve("m1")
        try:
            code, body = await self.start("m2")  # m1 has a request in flight: no room within the bound
            assert code == 429 and "maxLoadedModels = 1" in body["error"]["message"], body
            assert self.state("m2") == "stopped"
        finally:
            self.ctx.catalog.release(held)
