"""State the handlers share: settings, the engine (once loaded), limits, metrics, admission."""
from __future__ import annotations

import asyncio
from pathlib import Path
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from mindie_service.catalog.catalog import Catalog
from mindie_service.config import ServiceConfig
from mindie_service.engine.client import EngineClient
from mindie_service.engine.instances import InstanceStatus, instances_of
from mindie_service.jobs.runner import JobRunner
from mindie_service.jobs.store import JobStore
from mindie_service.engine.types import EngineRequest, EngineStats
from mindie_service.errors import TimeoutError_, UnhealthyError
from mindie_service.inputs.types import Prompt
from mindie_service.protocol.encoders import MindieEncoder, TgiEncoder
from mindie_service.protocol.generation import GenerationRequest, ProtocolLimits
from mindie_service.sampling_params import SamplingParams
from mindie_service.engine.gateway_state import gateway_state
from mindie_service.server.admission import AdmissionQueue
from mindie_service.server.gateway_metrics import GatewayCollector
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
        # MindIE's admission rule: maxLinkNum run, 2 x maxLinkNum wait (server/admission.py).
        self.admission = AdmissionQueue(self.settings.max_link_num)
        self.active_request_ids: set[str] = set()  # /api/* keys being generated (a second one is a 409)
        self.open_handlers = 0  # handlers begun and not finished (BaseHandler counts them)
        self.jobs: JobRunner | None = None  # batch jobs, once the default model is ready
        self.listeners: list[Any] = []  # the HTTP servers (main adds them): their open connections are counted
        self.media_policy = MediaPolicy(
            allowed_local_paths=tuple(self.settings.allowed_local_media_paths),
            allow_private_urls=self.settings.allow_private_media_urls,
            allowed_hosts=tuple(self.settings.media_url_allowed_hosts),
            max_items=self.settings.max_media_items, max_decoded_bytes=self.settings.max_decoded_media_bytes,
            max_aspect_ratio=self.settings.max_image_aspect_ratio,
            max_video_frames_decoded=self.settings.max_video_frames_decoded)
        # tokenizerProcessNumber sizes a thread pool, not processes: tokenizers releases the GIL, so threads
        # tokenize in parallel without pickling the tokenizer or the prompts. Body parsing runs there too.
        self.tokenizer_workers = max(1, config.backend.tokenizer_process_number)
        self.executor = ThreadPoolExecutor(max_workers=self.tokenizer_workers, thread_name_prefix="tokenize")
        # Media fetching and decoding have a pool of their own, of the same size: a request's images never hold
        # the tokenizer pool that a concurrent text request waits for (bytes bounded by maxDecodedMediaBytes).
        self.media_executor = ThreadPoolExecutor(max_workers=self.tokenizer_workers, thread_name_prefix="media")
        self.metrics = ServiceMetrics(self.model_name, self.stats, config.backend.max_seq_len,
                                      instances=self.instances)
        self.metrics.track_admission(lambda: self.admission.running, lambda: self.admission.waiting)
        self.metrics.registry.register(GatewayCollector(  # the gateway's names (vllm:*), per-server totals
            self.model_name, lambda: gateway_state(self.engine) if self.engine is not None else None,
            lambda: self.admission.waiting))
        self.mindie_encoder = MindieEncoder(full_text=self.settings.full_text_enabled,
                                            list_ids=self.settings.stream_token_id_format != "int")
        self.tgi_encoder = TgiEncoder()
        self.request_stop: Callable[[], None] = lambda: None  # set by main: starts the drain
        # Every model, its state and its engine; main gives it the engine builder (models start and stop).
        self.catalog: Catalog | None = Catalog(config, Path(config.backend.models_dir), build=None)

    # -- batch jobs ------------------------------------------------------------------------------
    def start_jobs(self) -> None:
        """Open the job store (ServerConfig.batchJobsDir) and resume the jobs a restart interrupted."""
        from mindie_service.server.handlers_jobs import engine_for

        running = self.settings.batch_max_running or max(1, self.engine_config.max_batch_size // 4)
        self.jobs = JobRunner(JobStore(self.settings.batch_jobs_dir), lambda m: engine_for(self, m), self.executor,
                              self.media_policy, running)
        self.jobs.resume_all()

    async def stop_jobs(self) -> None:
        if self.jobs is not None:
            await self.jobs.shutdown()
            self.jobs.store.close()

    # -- engine ----------------------------------------------------------------------------------
    def attach_engine(self, engine: EngineClient) -> None:
        self.engine = engine
        self._limits = ProtocolLimits(vocab_size=engine.vocab_size, media_policy=self.media_policy)
        if self.catalog is not None and self.catalog.entries[self.model_name].engine is not engine:
            self.catalog.attach(self.model_name, engine)

    @property
    def loaded_engine(self) -> EngineClient:
        """The engine, or 503 while the model is still loading (or stopped through the catalog)."""
        if self.engine is None:
            raise UnhealthyError("the default model is not running (PUT /v1/models/{id}/start)" if self.ready
                                 else "the model is still loading")
        return self.engine

    def serving_engine(self) -> EngineClient:
        """The default model's engine for a generation request: 503 while it is loading, stopped or broken."""
        engine = self.loaded_engine
        if not engine.healthy():
            raise UnhealthyError("the engine is not running")
        return engine

    @property
    def limits(self) -> ProtocolLimits:
        if self._limits is None:
            raise UnhealthyError("the model is still loading")
        return self._limits

    async def engine_request(self, req: GenerationRequest, request_id: str, *, engine: EngineClient | None = None,
                             prompt: Prompt | None = None) -> EngineRequest:
        """The engine's request for ``req`` (or its ``prompt``): media fetched and decoded, the prompt built,
        tokenized and checked by ``engine``'s input processor (default: the default model's), in the tokenizer
        pool (never on the IO loop)."""
        return await (engine or self.loaded_engine).input_processor.process_async(
            prompt if prompt is not None else req.prompt, req.params, request_id=request_id, truncate=req.truncate,
            executor=self.executor, media_policy=self.media_policy, media_executor=self.media_executor)

    async def engine_request_for(self, prompt: Prompt, params: SamplingParams, request_id: str, *,
                                 engine: EngineClient, session_id: str | None = None) -> EngineRequest:
        """The engine's request for a prompt the route built itself (the /api/* routes). ``session_id``: the
        client's key; an engine that keeps sessions continues the one it names, if any."""
        return await engine.input_processor.process_async(
            prompt, params, request_id=request_id, truncate=None, executor=self.executor,
            media_policy=self.media_policy, session_id=session_id, media_executor=self.media_executor)

    @property
    def open_connections(self) -> int:
        return sum(getattr(srv, "open_connections", 0) for srv in self.listeners)

    def stats(self) -> EngineStats | None:
        return self.engine.stats() if self.engine is not None else None

    def instances(self) -> list[InstanceStatus] | None:
        """The default model's instances (BackendConfig.modelInstanceNumber), each with its stats."""
        return instances_of(self.engine) if self.engine is not None else None

    def healthy(self) -> bool:
        return self.ready and self.engine is not None and self.engine.healthy()

    async def run_blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run tokenization (and other CPU work) off the IO loop."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    # -- admission -------------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        """Generation requests admitted (running in the engine or about to), counted in slots."""
        return self.admission.running

    @property
    def queued(self) -> int:
        """Generation requests waiting in the admission queue, counted in slots."""
        return self.admission.waiting

    async def admit(self, n: int = 1, timeout: float | None = None) -> None:
        """Take ``n`` admission slots (an /api/generate-batch call counts one per prompt), waiting in the
        queue for at most ``timeout`` seconds (what is left of e2eTimeout); 503 while loading/draining/
        unhealthy, 429 when the queue is full, 504 when the wait outlasts the timeout. ``release(n)`` after."""
        if self.draining:
            raise UnhealthyError("the service is shutting down")
        if not self.ready:
            raise UnhealthyError("the model is still loading")
        try:
            await self.admission.acquire(n, timeout)
        except TimeoutError:
            raise TimeoutError_(f"the request waited {timeout:.3g} s in the admission queue without a free slot "
                                f"(ServerConfig.e2eTimeout = {self.settings.e2e_timeout:g} s, maxLinkNum = "
                                f"{self.settings.max_link_num})") from None

    def release(self, n: int = 1) -> None:
        self.admission.release(n)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no generation request is admitted or queued; False if ``timeout`` passed first."""
        try:
            await asyncio.wait_for(self.admission.idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False
