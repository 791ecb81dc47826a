"""State the handlers share: settings, the engine (once loaded), limits, metrics, admission."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

from mindie_service.config import ServiceConfig
from mindie_service.protocol.encoders import MindieEncoder, TgiEncoder
from mindie_service.errors import OverloadedError, UnhealthyError, ValidationError
from mindie_service.protocol.generation import ProtocolLimits
from mindie_service.server.metrics import ServiceMetrics
from multimodal import DecodeOptions, MediaPolicy, load_media

logger = logging.getLogger(__name__)


class _LiveNames:
    """The adapter names as they are now (adapters load and unload at run time)."""

    def __init__(self, names: Callable[[], frozenset[str]]) -> None:
        self._names = names

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


class ServerContext:
    """One per process. ``engine`` is None until ``attach_engine``; generation requests get 503 until then."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.settings = config.server
        self.engine_config = config.engine_config()
        self.model_name = config.models[0].name
        self.engine: Any = None
        self.limits: ProtocolLimits | None = None
        self.ready = False
        self.draining = False
        self.in_flight = 0
        self.started_at = time.time()
        self._idle = asyncio.Event()
        self._idle.set()
        self.media_policy = MediaPolicy(
            allowed_local_paths=tuple(self.settings.allowed_local_media_paths),
            allow_private_urls=self.settings.allow_private_media_urls,
            allowed_hosts=tuple(self.settings.media_url_allowed_hosts),
            max_items=self.settings.max_media_items)
        self.tokenizer_workers = max(1, config.backend.tokenizer_process_number)
        self.executor = ThreadPoolExecutor(max_workers=self.tokenizer_workers, thread_name_prefix="tokenize")
        self.metrics = ServiceMetrics(self.model_name, self.stats, config.backend.max_seq_len)
        self.mindie_encoder = MindieEncoder(full_text=self.settings.full_text_enabled,
                                            list_ids=self.settings.stream_token_id_format != "int")
        self.tgi_encoder = TgiEncoder()
        self.request_stop: Callable[[], None] = lambda: None  # set by main: starts the drain

    # -- engine ----------------------------------------------------------------------------------
    def attach_engine(self, engine: Any) -> None:
        self.engine = engine
        self.limits = ProtocolLimits(
            vocab_size=int(engine.vocab_size),
            max_input_len=self.engine_config.effective_max_input_len,
            truncation=self.engine_config.truncation,
            adapters=_LiveNames(self.adapter_names),
            modalities=frozenset(getattr(self.mm_encoder, "modalities", ())),
            media_policy=self.media_policy,
        )

    @property
    def mm_encoder(self) -> Any:
        """The model's media encoder (None for text-only models and the mock engine)."""
        return getattr(self.engine, "mm_encoder", None)

    async def prepare_media(self, req: Any) -> None:
        """Fetch and decode the request's media (thread pool, never the IO loop), then let the model's
        processor build the prompt with its placeholders expanded."""
        enc = self.mm_encoder
        opts = DecodeOptions(num_video_frames=min(self.engine_config.video_frames, self.engine_config.max_video_frames),
                             audio_sampling_rate=enc.sampling_rate or 16000)
        loaded = await load_media(req.parts, self.media_policy, self.executor, opts)
        prompt = await self.run_blocking(enc.prepare, loaded)
        limit = self.limits.max_input_len if self.limits else self.engine_config.effective_max_input_len
        n = len(prompt.prompt_token_ids)
        if n > limit:
            raise ValidationError(f"Parameter inputs must be at most {limit} tokens (maxInputTokenLen, or maxSeqLen - 1)"
                                  f" with media placeholders expanded, got {n} tokens")
        req.prompt_token_ids, req.mm_inputs, req.mm_hashes = prompt.prompt_token_ids, prompt.mm_inputs, prompt.mm_hashes

    def adapter_names(self) -> frozenset[str]:
        """LoRA adapters a request may name. The LoRA work fills this; until then only the base model."""
        names = getattr(self.engine, "adapter_names", None)
        return frozenset(names()) if callable(names) else frozenset()

    def stats(self) -> Any:
        return self.engine.stats() if self.engine is not None else None

    def healthy(self) -> bool:
        return self.ready and self.engine is not None and bool(self.engine.healthy())

    def tokenize(self, text: str) -> list[int]:
        return list(self.engine.tokenize(text))

    async def run_blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run tokenization (and other CPU work) off the IO loop."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    # -- admission -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def admit(self) -> Iterator[None]:
        """Count one generation request in flight; 503 while loading/draining/unhealthy, 429 beyond maxLinkNum."""
        if self.draining:
            raise UnhealthyError("the service is shutting down")
        if not self.ready:
            raise UnhealthyError("the model is still loading")
        if not self.engine.healthy():
            raise UnhealthyError("the engine is not running")
        if self.in_flight >= self.settings.max_link_num:
            raise OverloadedError(f"Model is overloaded: {self.in_flight} requests in flight "
                                  f"(ServerConfig.maxLinkNum = {self.settings.max_link_num})")
        self.in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no generation request is in flight; False if ``timeout`` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False
