"""State the handlers share: settings, the engine (once loaded), limits, metrics, admission."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

from mindie_service.config import ServiceConfig
from mindie_service.engine.client import EngineClient
from mindie_service.engine.types import EngineRequest, EngineStats
from mindie_service.errors import OverloadedError, UnhealthyError
from mindie_service.protocol.encoders import MindieEncoder, TgiEncoder
from mindie_service.protocol.generation import GenerationRequest, ProtocolLimits
from mindie_service.server.metrics import ServiceMetrics
from multimodal import MediaPolicy

logger = logging.getLogger(__name__)


class ServerContext:
    """One per process. ``engine`` is None until ``attach_engine``; generation requests get 503 until then."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.settings = config.server
        self.engine_config = config.engine_config()
        self.model_name = config.models[0].name
        self.engine: EngineClient | None = None
        self._limits: ProtocolLimits | None = None
        self.ready = False
        self.draining = False
        self.in_flight = 0
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
    def attach_engine(self, engine: EngineClient) -> None:
        self.engine = engine
        self._limits = ProtocolLimits(vocab_size=engine.vocab_size, media_policy=self.media_policy)

    @property
    def loaded_engine(self) -> EngineClient:
        """The engine, or 503 while the model is still loading."""
        if self.engine is None:
            raise UnhealthyError("the model is still loading")
        return self.engine

    @property
    def limits(self) -> ProtocolLimits:
        if self._limits is None:
            raise UnhealthyError("the model is still loading")
        return self._limits

    async def engine_request(self, req: GenerationRequest, request_id: str) -> EngineRequest:
        """The engine's request for ``req``: media fetched and decoded, the prompt built, tokenized and checked by
        the engine's input processor, in the tokenizer pool (never on the IO loop)."""
        return await self.loaded_engine.input_processor.process_async(
            req.prompt, req.params, request_id=request_id, truncate=req.truncate, executor=self.executor,
            media_policy=self.media_policy)

    def stats(self) -> EngineStats | None:
        return self.engine.stats() if self.engine is not None else None

    def healthy(self) -> bool:
        return self.ready and self.engine is not None and self.engine.healthy()

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
        if not self.loaded_engine.healthy():
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
