"""The engine behind ``modelInstanceType: "StandardMock"``: no model, the ``EngineClient`` interface.

Tokens are UTF-8 bytes (ids 3..258; 0 <unk>, 1 <s>, 2 </s>); the output is seeded pseudo-random
lower-case words, one token per millisecond. It lets the frontend be load-tested (bench_serve)
and exercised without weights; its numbers say nothing about a model."""
from __future__ import annotations

import asyncio
import math
import random
import secrets
from typing import Any, AsyncIterator

from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.contract import (FINISH_LENGTH, FINISH_STOP, EngineRequest, EngineStats, InputFacts,
                                            PoolRequest, PoolResult, check_task,
                                            TokenEvent, TokenInfo)
from mindie_service.errors import ValidationError
from mindie_service.params.output_cap import output_cap

_SPECIAL = ("<unk>", "<s>", "</s>")
_ALPHABET = "abcdefghijklmnopqrstuvwxyz    "
TOTAL_BLOCKS = 4096


_NO_ADAPTERS = "lora_name must name an adapter of a model engine; StandardMock has no model"


def tokenize(text: str) -> list[int]:
    """The mock's tokenizer: <s> then each UTF-8 byte (a plain function: the serving core's input processor for
    the mock must not keep the engine alive)."""
    return [1] + [b + 3 for b in text.encode("utf-8")]


class MockEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_name = config.model_name or "mock"
        self.vocab_size = 259
        self.eos_token_ids = frozenset({2})
        self.device_type, self.device_reason, self.dtype = "cpu", "StandardMock: no model", "float32"
        self.modalities: frozenset[str] = frozenset()
        self.weights_report: dict[str, str] = {}
        self.tasks: frozenset[str] = frozenset({"generate"})  # no model: nothing to pool
        self.pooling_info: dict[str, Any] = {}
        self.input_facts = InputFacts(tokenize=tokenize, vocab_size=self.vocab_size,
                                      max_input_len=config.effective_max_input_len,
                                      pool_tokens=TOTAL_BLOCKS * config.cache_block_size,
                                      truncation=config.truncation)
        self.token_delay_s = 0.001
        self._active: dict[str, int] = {}
        self._started = False

    def start(self) -> None:
        self._started = True

    def healthy(self) -> bool:
        return self._started

    def shutdown(self) -> None:
        self._started = False

    def tokenize(self, text: str) -> list[int]:
        return tokenize(text)

    def detokenize(self, token_ids: list[int]) -> str:
        raw = b"".join(_SPECIAL[t].encode() if t < 3 else bytes([t - 3]) for t in token_ids)
        return raw.decode("utf-8", errors="replace")

    def _info(self, tid: int, logprob: float | None) -> TokenInfo:
        text = _SPECIAL[tid] if tid < 3 else bytes([tid - 3]).decode("latin-1")
        return TokenInfo(id=tid, logprob=logprob, text=text, special=tid < 3)

    async def pool(self, request: PoolRequest) -> PoolResult:
        check_task(self.tasks, request.task, self.model_name)
        raise AssertionError("unreachable: the mock serves generation only")

    def abort(self, request_id: str) -> None:
        self._active.pop(request_id, None)

    # No model, so no adapters: the base model is the only name a request may use.
    async def load_adapter(self, name: str, path: str) -> dict[str, Any]:
        raise ValidationError(f"Parameter {_NO_ADAPTERS}, got {name!r}")

    def unload_adapter(self, name: str) -> None:
        raise ValidationError(f"Parameter {_NO_ADAPTERS}, got {name!r}")

    def list_adapters(self) -> list[dict[str, Any]]:
        return []

    def adapter_names(self) -> list[str]:
        return []

    def stats(self) -> EngineStats:
        bs = self.config.cache_block_size
        used = sum(math.ceil(n / bs) for n in self._active.values())
        return EngineStats(running=len(self._active), waiting=0, swapped=0, total_blocks=TOTAL_BLOCKS,
                           free_blocks=TOTAL_BLOCKS - used, cache_usage=used / TOTAL_BLOCKS,
                           prefix_cache_hit_rate=0.0, num_preemptions=0, block_size=bs,
                           max_loras=self.config.max_loras, prefix_caching=self.config.enable_prefix_caching)

    async def generate(self, request: EngineRequest) -> AsyncIterator[TokenEvent]:
        p, ids, cfg = request.params, request.prompt_token_ids, self.config
        seed = p.seed if p.seed is not None else secrets.randbits(63) + 1
        rng = random.Random(seed if not p.greedy else 0)
        cap = output_cap(p.max_tokens, len(ids), max_iter_times=cfg.max_iter_times, max_seq_len=cfg.max_seq_len)
        text = ""
        rid = request.request_id
        self._active[rid] = len(ids)
        try:
            for i in range(cap):
                await asyncio.sleep(self.token_delay_s)
                tid = ord(rng.choice(_ALPHABET)) + 3
                info = self._info(tid, -1.0)
                if p.logprobs:
                    info = TokenInfo(info.id, info.logprob, info.text, info.special,
                                     tuple(self._info(ord(c) + 3, -2.0) for c in "etaoin"[:p.logprobs]))
                self._active[rid] += 1
                delta, finish = info.text, None
                text += delta
                for s in p.stop:
                    at = text.find(s)
                    if at >= 0:
                        delta = delta[: max(0, len(delta) - (len(text) - at))]
                        text, finish = text[:at], FINISH_STOP
                        break
                if finish is None and i == cap - 1:
                    finish = FINISH_LENGTH
                ev = TokenEvent(request_id=rid, token=info, text_delta=delta, index=i, finish_reason=finish)
                if i == 0:
                    ev.prompt_tokens = [self._info(t, None if k == 0 or not p.prompt_logprobs else -1.0)
                                        for k, t in enumerate(ids)]
                    ev.num_prompt_tokens, ev.seed = len(ids), seed
                if finish is not None:
                    ev.full_text = text
                yield ev
                if finish is not None:
                    return
        finally:
            self.abort(rid)
