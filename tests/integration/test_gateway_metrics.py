"""The gateway's model-server protocol on /metrics (vLLM's names, per-server totals) checked against /v1/status
while requests run: the engine is held inside a step (its queues frozen) while both are read."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import tempfile
import threading
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from tornado.testing import gen_test

from mindie_service.devkit.lora import build_demo_lora
from mindie_service.devkit.presets import build_demo_model
from mindie_service.engine.async_engine import AsyncEngine
from mindie_service.sampling_params import is_base_adapter
from mindie_service.server.context import ServerContext
from tests.inprocess import InProcessServer

ROOT = Path(__file__).resolve().parents[2]


class Gate:
    """Wraps ``runner.execute``: the ``hold_at``-th step blocks until released (the engine's state frozen)."""

    def __init__(self, llm, hold_at: int) -> None:
        self.real, self.calls, self.hold_at = llm.runner.execute, 0, hold_at
        self.held, self.release = threading.Event(), threading.Event()
        llm.runner.execute = self

    def __call__(self, out):
        self.calls += 1
        if self.calls == self.hold_at:
            self.held.set()
            self.release.wait(30)
        return self.real(out)


class GatewayMetrics(InProcessServer):
    server = {"openAiSupport": "vllm"}

    def make_engine(self, ctx: ServerContext) -> AsyncEngine:
        model = ROOT / "models" / "tiny"
        build_demo_model("tiny", str(model), if_missing=True)
        self._lora_dir = tempfile.TemporaryDirectory()
        lora = build_demo_lora(str(model), str(Path(self._lora_dir.name) / "ad"), rank=8, seed=5)
        cfg = dataclasses.replace(ctx.engine_config, model=str(model), model_name="mock", cache_block_size=4,
                                  num_kv_blocks=96, max_batch_size=3, max_prefill_batch_size=3, max_loras=2,
                                  max_lora_rank=8, max_queue_delay_microseconds=0)
        engine = AsyncEngine(cfg)
        engine.engine.load_adapter("ad", str(lora))
        engine.engine.load_adapter("bd", str(lora))
        self.gate = Gate(engine.engine, hold_at=4)
        return engine

    def tearDown(self) -> None:
        self.gate.release.set()
        self.engine.shutdown()
        super().tearDown()
        self._lora_dir.cleanup()

    def post(self, model: str, i: int):
        body = {"model": model, "prompt": f"request {i} about the mill", "max_tokens": 12, "temperature": 0,
                "ignore_eos": True}
        return self.http_client.fetch(self.get_url("/v1/completions"), method="POST", body=json.dumps(body),
                                      headers={"Content-Type": "application/json"}, raise_error=False,
                                      request_timeout=60)

    async def scrape(self) -> tuple[dict, dict]:
        text = (await self.http_client.fetch(self.get_url("/metrics"))).body.decode()
        samples: dict = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                samples.setdefault(s.name, []).append(s)
        status = json.loads((await self.http_client.fetch(self.get_url("/v1/status"))).body)
        return samples, status

    @gen_test(timeout=60)
    async def test_vllm_metric_names_agree_with_v1_status_while_requests_run(self):
        # base-model and adapter requests: 3 run (maxBatchSize), the rest wait, an adapter among each
        futs = [self.post(m, i) for i, m in enumerate(["ad", "mock", "mock", "bd", "mock", "ad"])]
        for _ in range(3000):
            if self.gate.held.is_set() or all(f.done() for f in futs):
                break
            await asyncio.sleep(0.01)
        assert self.gate.held.is_set(), [(f.result().code, f.result().body[:300]) for f in futs if f.done()]
        samples, st = await self.scrape()
        sched = self.engine.engine.scheduler  # the truth, frozen inside the held step

        def adapters(seqs):
            return ",".join(sorted({q.params.adapter_id for q in seqs if not is_base_adapter(q.params.adapter_id)}))

        truth = adapters(sched.running), adapters(list(sched.waiting) + list(sched.swapped))
        self.gate.release.set()

        def one(name):
            (s,) = samples[name]
            return s

        waiting = st["requests"]["waiting"] + st["requests"]["swapped"] + st["requests"]["queued"]
        assert st["requests"]["running"] == 3 and waiting == 3
        assert one("vllm:num_requests_running").value == st["requests"]["running"]
        assert one("vllm:num_requests_waiting").value == waiting
        assert 0 < one("vllm:kv_cache_usage_perc").value == st["cacheUsage"] <= 1
        assert one("vllm:gpu_cache_usage_perc").value == st["cacheUsage"]
        assert one("vllm:num_requests_running").labels == {"model_name": "mock", "engine": "0"}  # vLLM's labels
        lora = one("vllm:lora_requests_info").labels
        assert lora["max_lora"] == str(st["lora"]["maxLora"]) == "2"
        assert lora["running_lora_adapters"] == ",".join(st["lora"]["runningAdapters"]) == truth[0]
        assert lora["waiting_lora_adapters"] == ",".join(st["lora"]["waitingAdapters"]) == truth[1]
        assert truth[0] and truth[1] and truth[0] != truth[1]
        info = one("vllm:cache_config_info").labels
        assert info["block_size"] == str(st["cacheConfig"]["blockSize"]) == "4"
        assert info["num_gpu_blocks"] == str(st["blocks"]["total"]) == "96"
        resps = await asyncio.gather(*futs)
        assert [r.code for r in resps] == [200] * 6
        samples, st = await self.scrape()  # idle: nothing running, nothing waiting, no adapter in use
        assert one("vllm:num_requests_running").value == 0 and one("vllm:num_requests_waiting").value == 0
        assert one("vllm:lora_requests_info").labels["running_lora_adapters"] == ""
