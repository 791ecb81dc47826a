"""Model instances: the router picks the least outstanding work, keeps sessions on their instance, loads
adapters on every instance, and sums the instances' stats (fleet/instances.py)."""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, AsyncIterator

import pytest

from mindie_service.engine.client import EngineClient
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.fleet.gateway_view import gateway_state
from mindie_service.fleet.instances import (InstanceRouter, build_instances, instances_of, split_threads,
                                             sum_stats)
from mindie_service.engine.contract import (FINISH_LENGTH, EngineRequest, EngineStats, InputFacts, TokenEvent,
                                            TokenInfo)
from mindie_service.errors import ConflictError, NotFoundError, ValidationError
from mindie_service.inputs import InputProcessor, TextPrompt
from mindie_service.sampling_params import SamplingParams


class FakeSessions:
    def __init__(self) -> None:
        self.kept: dict[str, tuple[int, ...]] = {}

    def tokens(self, key: str) -> tuple[int, ...] | None:
        return self.kept.get(key)


class FakeEngine:
    """An EngineClient whose requests stay in flight until the test lets them go (``release``)."""

    def __init__(self, name: str = "m", fail_load: bool = False) -> None:
        self.model_name, self.vocab_size, self.eos_token_ids = name, 300, frozenset({2})
        self.device_type, self.device_reason, self.dtype, self.modalities = "cpu", "test", "float32", frozenset()
        self.tasks, self.pooling_info = frozenset({"generate"}), {}
        self.config = EngineConfig(model="x", max_sessions=8)
        self.sessions = FakeSessions()
        self.input_facts = InputFacts(self.tokenize, vocab_size=300, max_input_len=100, pool_tokens=1000,
                                      truncation=False, adapter_names=lambda: list(self.adapters),
                                      sessions=self.sessions)
        self.adapters: dict[str, str] = {}
        self.fail_load = fail_load
        self.seen: list[EngineRequest] = []
        self.first: dict[str, asyncio.Event] = {}  # set: the request gets its first token
        self.done: dict[str, asyncio.Event] = {}  # set: the request finishes
        self.aborted: list[str] = []
        self.alive = True
        self.started = False

    def start(self) -> None:
        self.started = True

    def shutdown(self) -> None:
        self.started = False

    def healthy(self) -> bool:
        return self.alive

    def stats(self) -> EngineStats:
        running = sum(1 for r in self.seen if not self.done[r.request_id].is_set())
        return EngineStats(running=running, waiting=1, swapped=0, total_blocks=100, free_blocks=100 - 10 * running,
                           cache_usage=0.1 * running, prefix_cache_hit_rate=0.5 if self.seen else 0.0,
                           num_preemptions=2, sessions_held=len(self.sessions.kept))

    def tokenize(self, text: str) -> list[int]:
        return [1] + [3 + (ord(c) % 200) for c in text]

    def detokenize(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)

    async def generate(self, request: EngineRequest) -> AsyncIterator[TokenEvent]:
        rid = request.request_id
        self.seen.append(request)
        first, done = self.first.setdefault(rid, asyncio.Event()), self.done.setdefault(rid, asyncio.Event())
        await first.wait()
        yield TokenEvent(rid, TokenInfo(7, -1.0, "a", False), "a", 0)
        await done.wait()
        if request.session_id is not None:  # the engine keeps the finished sequence under its key
            self.sessions.kept[request.session_id] = request.prompt_token_ids + (7, 8)
        yield TokenEvent(rid, TokenInfo(8, -1.0, "b", False), "b", 1, finish_reason=FINISH_LENGTH)

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def load_adapter(self, name: str, path: str) -> dict[str, Any]:
        if self.fail_load:
            raise ValidationError(f"Parameter lora_path must be an adapter folder, got {path!r}")
        if name in self.adapters:
            raise ConflictError(f"LoRA adapter {name!r} is already loaded")
        self.adapters[name] = path
        return {"name": name, "rank": 8}

    def unload_adapter(self, name: str) -> None:
        if self.adapters.pop(name, None) is None:
            raise NotFoundError(f"LoRA adapter {name!r} is not loaded")

    def list_adapters(self) -> list[dict[str, Any]]:
        return [{"name": n, "path": p, "in_use": 0} for n, p in self.adapters.items()]

    def adapter_names(self) -> list[str]:
        return list(self.adapters)


def _req(router: InstanceRouter, rid: str, text: str = "hello", session: str | None = None,
         adapter: str | None = None) -> EngineRequest:
    return InputProcessor.from_facts(router.input_facts).process(
        TextPrompt(text), SamplingParams(max_tokens=2, adapter_id=adapter), request_id=rid, session_id=session)


class Driver:
    """Runs requests through the router as tasks, so several are in flight at once."""

    def __init__(self, router: InstanceRouter, fakes: list[FakeEngine]) -> None:
        self.router, self.fakes = router, fakes
        self.tasks: dict[str, asyncio.Task[list[int]]] = {}

    async def send(self, req: EngineRequest) -> int:
        """Start ``req``; returns the instance it reached."""
        async def run() -> list[int]:
            return [ev.token.id async for ev in self.router.generate(req)]
        self.tasks[req.request_id] = asyncio.create_task(run())
        for _ in range(50):
            await asyncio.sleep(0)
            hit = [i for i, f in enumerate(self.fakes) if any(r.request_id == req.request_id for r in f.seen)]
            if hit:
                return hit[0]
        raise AssertionError(f"{req.request_id} reached no instance")

    def fake_of(self, rid: str) -> FakeEngine:
        return next(f for f in self.fakes if any(r.request_id == rid for r in f.seen))

    async def first_token(self, rid: str) -> None:
        self.fake_of(rid).first[rid].set()
        for _ in range(20):
            await asyncio.sleep(0)

    async def finish(self, rid: str) -> list[int]:
        f = self.fake_of(rid)
        f.first[rid].set()
        f.done[rid].set()
        return await self.tasks.pop(rid)


def _router(n: int = 2) -> tuple[InstanceRouter, list[FakeEngine]]:
    fakes = [FakeEngine() for _ in range(n)]
    return InstanceRouter(fakes), fakes


def test_router_is_an_engine_client():
    router, _ = _router()
    assert isinstance(router, EngineClient)


def test_each_request_goes_to_the_least_busy_instance():
    async def main() -> None:
        router, fakes = _router(3)
        d = Driver(router, fakes)
        # Three requests at once spread over the three instances.
        assert sorted([await d.send(_req(router, f"r{i}")) for i in range(3)]) == [0, 1, 2]
        # Two finish on instances 0 and 2: the next two go there, never to the one still busy.
        busy = fakes.index(d.fake_of("r1"))
        for rid in ("r0", "r2"):
            assert await d.finish(rid) == [7, 8]
        nxt = [await d.send(_req(router, f"n{i}")) for i in range(2)]
        assert busy not in nxt and sorted(nxt) == sorted({0, 1, 2} - {busy})
        assert [s.in_flight for s in router.instances()] == [1, 1, 1]
        for rid in ("r1", "n0", "n1"):
            await d.finish(rid)
        assert [s.in_flight for s in router.instances()] == [0, 0, 0]
        assert sum(s.routed or 0 for s in router.instances()) == 5
    asyncio.run(main())


def test_equal_counts_prefer_the_instance_without_queued_prompt_tokens():
    async def main() -> None:
        router, fakes = _router(2)
        d = Driver(router, fakes)
        a = await d.send(_req(router, "long", "x" * 90))  # stays queued: no first token yet
        b = await d.send(_req(router, "short", "y"))
        assert (a, b) == (0, 1)
        await d.first_token("short")  # answering: its prompt is no longer outstanding work
        # One in flight each, and instance 0's turn: its queued prompt still sends the next one to 1.
        assert await d.send(_req(router, "next")) == 1
        for rid in ("long", "short", "next"):
            await d.finish(rid)
        assert [s.in_flight for s in router.instances()] == [0, 0]
    asyncio.run(main())


def test_a_session_continues_on_the_instance_that_holds_it():
    async def main() -> None:
        router, fakes = _router(2)
        d = Driver(router, fakes)
        first = await d.send(_req(router, "g1", "tell me", session="sess-1"))
        await d.finish("g1")
        assert fakes[first].sessions.kept["sess-1"] and router.owner_of("sess-1") == first
        # Make the owner the busier instance: least-outstanding alone would pick the other one.
        for k in range(2):
            if await d.send(_req(router, f"busy{k}", "x")) != first:
                await d.finish(f"busy{k}")
        assert router.instances()[first].in_flight == 1 and router.instances()[1 - first].in_flight == 0
        cont = _req(router, "g2", "ignored", session="sess-1")
        assert cont.continued and cont.prompt_token_ids == fakes[first].sessions.kept["sess-1"]
        assert await d.send(cont) == first
        # A new key with no kept session goes by load (to the idle instance) and is remembered there.
        assert await d.send(_req(router, "g3", "new", session="sess-2")) == 1 - first
        assert router.owner_of("sess-2") == 1 - first
        for rid in list(d.tasks):
            await d.finish(rid)
    asyncio.run(main())


def test_abort_reaches_the_instance_running_the_request():
    async def main() -> None:
        router, fakes = _router(2)
        d = Driver(router, fakes)
        i = await d.send(_req(router, "ab"))
        router.abort("ab")
        assert fakes[i].aborted == ["ab"] and fakes[1 - i].aborted == []
        d.tasks.pop("ab").cancel()
        router.abort("unknown")  # not running anywhere: every instance is told (harmless)
        assert all("unknown" in f.aborted for f in fakes)
    asyncio.run(main())


def test_adapters_load_and_unload_on_every_instance():
    async def main() -> None:
        router, fakes = _router(3)
        assert (await router.load_adapter("ad", "/p"))["rank"] == 8
        assert all(f.adapters == {"ad": "/p"} for f in fakes) and router.adapter_names() == ["ad"]
        with pytest.raises(ConflictError):
            await router.load_adapter("ad", "/p")
        assert all(f.adapters == {"ad": "/p"} for f in fakes)  # a refused load takes nothing away
        # Unload is refused while a request on any instance uses it; afterwards it leaves every instance.
        d = Driver(router, fakes)
        await d.send(_req(router, "u", adapter="ad"))
        with pytest.raises(ConflictError):
            router.unload_adapter("ad")
        assert all("ad" in f.adapters for f in fakes)
        await d.finish("u")
        router.unload_adapter("ad")
        assert all(f.adapters == {} for f in fakes)
        with pytest.raises(NotFoundError):
            router.unload_adapter("ad")
    asyncio.run(main())


def test_a_load_that_fails_on_one_instance_is_undone_on_the_others():
    async def main() -> None:
        fakes = [FakeEngine(), FakeEngine(fail_load=True), FakeEngine()]
        router = InstanceRouter(fakes)
        with pytest.raises(ValidationError):
            await router.load_adapter("ad", "/bad")
        assert all(f.adapters == {} for f in fakes)
    asyncio.run(main())


def test_stats_sum_the_instances_and_health_needs_all():
    async def main() -> None:
        router, fakes = _router(2)
        d = Driver(router, fakes)
        await d.send(_req(router, "s1"))
        st = router.stats()
        assert (st.running, st.waiting, st.total_blocks, st.free_blocks, st.num_preemptions) == (1, 2, 200, 190, 4)
        assert st.cache_usage == pytest.approx(10 / 200)
        assert [s.stats.running for s in router.instances()] == sorted([s.stats.running for s in router.instances()],
                                                                       reverse=d.fake_of("s1") is fakes[0])
        assert router.healthy()
        fakes[1].alive = False
        assert not router.healthy() and [s.healthy for s in router.instances()] == [True, False]
        await d.finish("s1")
    asyncio.run(main())


def test_sum_stats_of_one_is_itself():
    s = EngineStats(running=3, waiting=1, swapped=0, total_blocks=50, free_blocks=40, cache_usage=0.2,
                    prefix_cache_hit_rate=0.25, num_preemptions=1, sessions_held=2)
    assert sum_stats([s]) == s


def test_a_lone_engine_is_instance_zero():
    f = FakeEngine()
    assert [(s.index, s.routed) for s in instances_of(f)] == [(0, None)]


def test_instances_share_the_cores():
    base = EngineConfig(model="x")
    assert split_threads(base, 2, cores=16).num_threads == 8
    assert split_threads(base, 3, cores=2).num_threads == 1
    assert split_threads(base, 1, cores=16) is base
    assert split_threads(dataclasses.replace(base, num_threads=3), 2, cores=16).num_threads == 3


def test_build_instances_one_is_the_engine_itself_and_a_failure_shuts_down_the_built():
    built: list[FakeEngine] = []

    def one(ec: EngineConfig) -> FakeEngine:
        if len(built) == 2:
            raise RuntimeError("out of memory")
        built.append(FakeEngine())
        built[-1].started = True
        return built[-1]

    cfg = EngineConfig(model="x")
    assert build_instances([cfg], one) is built[0]
    built.clear()
    assert isinstance(build_instances([cfg, cfg], one), InstanceRouter)
    built.clear()
    with pytest.raises(RuntimeError):
        build_instances([cfg, cfg, cfg], one)
    assert len(built) == 2 and not any(f.started for f in built)


def test_instance_configs_follow_model_instance_number(tmp_path, monkeypatch):
    import json

    from mindie_service.config import load_config
    from mindie_service.fleet import instances
    from mindie_service.fleet.instances import instance_configs

    cfg = {"ServerConfig": {"httpsEnabled": False},
           "BackendConfig": {"modelInstanceNumber": 2, "npuDeviceIds": [[0], [1]], "ModelDeployConfig": {
               "ModelConfig": [{"modelInstanceType": "StandardMock", "modelName": "m", "modelWeightPath": "w"}]}}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setattr(instances, "cpu_cores", lambda: 16)
    got = instance_configs(load_config(str(tmp_path / "config.json")))
    assert len(got) == 2 and [c.num_threads for c in got] == [8, 8]
    assert got[0].device_ids in (None, (0,)) and got[1].device_ids == (1,)  # each its npuDeviceIds group


def test_the_gateway_view_reads_the_instances_stats_only():
    """fleet.gateway_view reads EngineStats and nothing else: adapters are the union over the instances, counts
    and blocks are summed, the cache's shape is an instance's."""
    shape = dict(block_size=16, max_loras=4, kv_cache_dtype="int8", prefix_caching=True)
    a = EngineStats(running=2, waiting=1, swapped=1, total_blocks=50, free_blocks=40, cache_usage=0.2,
                    prefix_cache_hit_rate=0.0, num_preemptions=0, running_adapters=("b", "x"),
                    waiting_adapters=("w",), host_blocks=8, kv_events_published=3, kv_events_dropped=1, **shape)
    b = EngineStats(running=1, waiting=0, swapped=2, total_blocks=50, free_blocks=10, cache_usage=0.8,
                    prefix_cache_hit_rate=0.0, num_preemptions=0, running_adapters=("a", "x"),
                    waiting_adapters=(), host_blocks=8, kv_events_published=5, kv_events_dropped=0, **shape)

    class Client:
        def stats(self) -> EngineStats:
            return sum_stats([a, b])

    g = gateway_state(Client())  # type: ignore[arg-type]
    assert (g.running, g.waiting, g.num_gpu_blocks, g.num_cpu_blocks) == (3, 4, 100, 16)
    assert g.running_adapters == ("a", "b", "x") and g.waiting_adapters == ("w",)
    assert (g.block_size, g.max_lora, g.cache_dtype, g.enable_prefix_caching) == (16, 4, "int8", True)
    assert (g.kv_events_published, g.kv_events_dropped) == (8, 1) and g.kv_cache_usage == 0.5
