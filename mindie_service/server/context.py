"""State the handlers share: settings, the engine (once loaded), limits, metrics, and the serving core
(mindie_service.serving.Frontend: admission, thread pools, input processing, sessions) they call."""
from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable

from tornado.ioloop import IOLoop

from mindie_service.catalog.catalog import Catalog, Target
from mindie_service.catalog.memory_meter import LoadMeter
from mindie_service.catalog.residency import Residency
from mindie_service.catalog.residency_policy import ResidencyPolicy
from mindie_service.config import ServiceConfig
from mindie_service.engine.client import EngineClient
from mindie_service.fleet.instances import InstanceStatus, instances_of
from mindie_service.jobs.batch_lines import BatchEndpoints
from mindie_service.jobs.batch_runner import BatchRunner
from mindie_service.jobs.batch_store import BatchStore
from mindie_service.jobs.runner import JobRunner
from mindie_service.jobs.store import JobStore
from mindie_service.engine.contract import EngineStats
from mindie_service.errors import UnhealthyError
from mindie_service.protocol.encoders import MindieEncoder, TgiEncoder
from mindie_service.protocol.request import ProtocolLimits
from mindie_service.serving import Frontend, Timeouts
from mindie_service.serving.admission_queue import AdmissionQueue
from mindie_service.serving.model_lookup import engine_for, hold_model
from mindie_service.serving.responses_service import ResponsesService
from mindie_service.storage.chat_store import ChatCompletionStore
from mindie_service.storage.files_store import FilesStore
from mindie_service.storage.responses_store import ResponsesStore
from mindie_service.fleet.gateway_view import gateway_state
from mindie_service.netguard import FetchPolicy
from mindie_service.server.gateway_metrics import GatewayCollector
from mindie_service.server.metrics import ServiceMetrics
from mindie_service.server.vllm_metrics import VllmMetrics
from mindie_service.serving.observer import ObserverGroup, RequestObserver
from mindie_service.server.model_metrics import ModelResidencyCollector
from mindie_service.server.responses_prepare import prepare_held
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
        self.open_handlers = 0  # handlers begun and not finished (BaseHandler counts them)
        self.jobs: JobRunner | None = None  # batch jobs, once the default model is ready
        self._responses: ResponsesService | None = None  # the Responses API's store, opened on first use
        self._chat_store: ChatCompletionStore | None = None  # stored chat completions (store: true), likewise
        self.batches: BatchRunner | None = None  # OpenAI batches, once the default model is ready
        self.batch_endpoints = BatchEndpoints()  # what a batch may call: main fills it (server/batch_routes.py)
        self._files: FilesStore | None = None  # OpenAI Files, opened on first use
        self.listeners: list[Any] = []  # the HTTP servers (main adds them): their open connections are counted
        # Where any server-side fetch may go (media, catalog downloads, batch-job input files share it).
        self.fetch_policy = FetchPolicy(
            allowed_local_paths=tuple(self.settings.allowed_local_media_paths),
            allow_private_urls=self.settings.allow_private_media_urls,
            allowed_hosts=tuple(self.settings.media_url_allowed_hosts))
        self.media_policy = MediaPolicy(
            fetch=self.fetch_policy,
            max_items=self.settings.max_media_items, max_decoded_bytes=self.settings.max_decoded_media_bytes,
            max_aspect_ratio=self.settings.max_image_aspect_ratio,
            max_video_frames_decoded=self.settings.max_video_frames_decoded)
        self.metrics = ServiceMetrics(self.model_name, self.stats, config.backend.max_seq_len,
                                      instances=self.instances)
        observers: list[RequestObserver] = [self.metrics, VllmMetrics(self.metrics.registry, self.model_name,
                                                                      self.stats, config.backend.max_seq_len)]
        self.tracer = None  # request spans (server/tracing.py): OpenTelemetry is imported only when configured
        if self.settings.otlp_traces_endpoint:
            from mindie_service.server.tracing import RequestTracer

            self.tracer = RequestTracer(self.settings.otlp_traces_endpoint)
            observers.append(self.tracer)
        self.frontend = Frontend(Timeouts(token=self.settings.token_timeout, e2e=self.settings.e2e_timeout),
                                 self.settings.max_link_num, config.backend.tokenizer_process_number,
                                 self.media_policy, observer=ObserverGroup(*observers), gate=self._check_open)
        self.metrics.track_admission(lambda: self.admission.running, lambda: self.admission.waiting)
        self.metrics.registry.register(GatewayCollector(  # the gateway's names (vllm:*), per-server totals
            self.model_name, lambda: gateway_state(self.engine) if self.engine is not None else None,
            lambda: self.admission.waiting))
        self.mindie_encoder = MindieEncoder(full_text=self.settings.full_text_enabled,
                                            list_ids=self.settings.stream_token_id_format != "int")
        self.tgi_encoder = TgiEncoder()
        self.request_stop: Callable[[], None] = lambda: None  # set by main: starts the drain
        # Every model, its state and its engine; main gives it the engine builder (models start and stop).
        self.catalog: Catalog | None = Catalog(config, Path(config.backend.models_dir), build=None,
                                               on_default=self._default_changed)
        # Which models are loaded: on demand, within maxLoadedModels / modelMemoryBudget, idle ones unloaded.
        self.residency = Residency(self.catalog, ResidencyPolicy.from_settings(self.settings))
        self.boot_meter = LoadMeter()  # the default model's load at start-up, measured (server/main.py)
        self.metrics.registry.register(ModelResidencyCollector(self.residency))

    # -- batch jobs ------------------------------------------------------------------------------
    def start_jobs(self) -> None:
        """Open the job store (ServerConfig.batchJobsDir) and resume the jobs a restart interrupted."""
        running = self.settings.batch_max_running or max(1, self.engine_config.max_batch_size // 4)
        self.jobs = JobRunner(JobStore(self.settings.batch_jobs_dir), self.hold, self.release_model,  # type: ignore[arg-type]
                              self.frontend, running)
        self.jobs.resume_all()
        self.batches = BatchRunner(BatchStore(Path(self.settings.batch_jobs_dir) / "openai"), self.files(),
                                   self.batch_endpoints, self.jobs.slots, self.run_blocking)
        self.batches.resume_all()
        # on the IO loop once it runs (the app may be built before it starts, as in tornado's test cases)
        IOLoop.current().spawn_callback(self.responses_service().resume_all)

    async def stop_jobs(self) -> None:
        if self.tracer is not None:  # the spans still batched go out before the exit
            await asyncio.get_running_loop().run_in_executor(None, self.tracer.close)
        if self.jobs is not None:
            await self.jobs.shutdown()
            self.jobs.store.close()
        if self.batches is not None:
            await self.batches.shutdown()
            self.batches.store.close()
        if self._responses is not None:
            await self.pause_responses()
            self._responses.store.close()

    async def pause_responses(self) -> None:
        """Background responses stop where they are (still in progress in the store): the next start resumes them."""
        if self._responses is not None:
            await self._responses.shutdown()

    def files(self) -> FilesStore:
        """The Files store (ServerConfig.filesStore), opened on first use."""
        if self._files is None:
            s = self.settings
            self._files = FilesStore(s.files_dir, s.files_max_bytes, s.files_max_total_bytes)
        return self._files

    def responses_service(self) -> ResponsesService:
        """The Responses API's service over its store (ServerConfig.responsesStore), opened on first use."""
        if self._responses is None:
            s = self.settings
            self._responses = ResponsesService(
                ResponsesStore(s.responses_dir, s.responses_max, s.responses_max_age), self.frontend,
                lambda body, context, rid: prepare_held(self, body, context, rid))
        return self._responses

    def chat_store(self) -> ChatCompletionStore:
        """Stored chat completions, beside the responses (ServerConfig.responsesStore: folder and bounds)."""
        if self._chat_store is None:
            s = self.settings
            self._chat_store = ChatCompletionStore(s.responses_dir, s.responses_max, s.responses_max_age)
        return self._chat_store

    # -- engine ----------------------------------------------------------------------------------
    def attach_engine(self, engine: EngineClient) -> None:
        self.engine = engine
        self._limits = ProtocolLimits(vocab_size=engine.vocab_size, media_policy=self.media_policy)
        if self.catalog is not None and self.catalog.entries[self.model_name].engine is not engine:
            self.catalog.attach(self.model_name, engine)

    def _default_changed(self, engine: EngineClient | None) -> None:
        """The default model (ModelConfig[0], behind `/` and the TGI routes) started or stopped via the catalog."""
        if engine is None:
            self.engine = None
        else:
            self.attach_engine(engine)

    @property
    def loaded_engine(self) -> EngineClient:
        """The engine, or 503 while the model is still loading (or stopped through the catalog)."""
        if self.engine is None:
            if self.ready and self.default_parked():
                raise UnhealthyError(f"the default model {self.model_name} is unloaded (idle or evicted); a "
                                     "generation request loads it again")
            if self.ready:
                raise UnhealthyError(f"the default model is not running (PUT /v1/models/{self.model_name}/start)")
            raise self.loading_error()
        return self.engine

    def loading_error(self) -> UnhealthyError:
        """503 while the default model loads: how far it has come and, when known, how long is left."""
        entry = self.catalog.entries.get(self.model_name) if self.catalog is not None else None
        if entry is not None and entry.state == "starting":
            return UnhealthyError(entry.loading_message())
        return UnhealthyError("the model is still loading")

    def serving_engine(self) -> EngineClient:
        """The default model's engine for a generation request: 503 while it is loading, stopped or broken."""
        engine = self.loaded_engine
        if not engine.healthy():
            raise UnhealthyError("the engine is not running")
        return engine

    @property
    def limits(self) -> ProtocolLimits:
        if self._limits is None:
            raise self.loading_error()
        return self._limits

    async def engine_for(self, model: str, loads: bool = True) -> tuple[EngineClient, str | None]:
        """The engine ``model`` names (a catalog model, loaded on demand unless ``loads`` is false, or a LoRA adapter
        on one) and the adapter."""
        return await engine_for(self.residency, model, self.model_name, lambda: self.loaded_engine, loads)

    async def hold(self, model: str, keep_alive: float | None) -> Target:
        """``model`` running and held for one request (catalog.release after): the one door (serving/model_lookup)."""
        return await hold_model(self.residency, model, keep_alive)

    def release_model(self, target: Target) -> None:
        """Let go of a ``hold``: idleness (keep_alive, idleUnloadSeconds) counts from the last release."""
        assert self.catalog is not None
        self.catalog.release(target)

    @contextlib.asynccontextmanager
    async def held(self, model: str, keep_alive: float | None) -> AsyncIterator[Target]:
        """``model`` held for a ``with`` block (a route answered at once: tokenize, detokenize)."""
        target = await self.hold(model, keep_alive)
        try:
            yield target
        finally:
            self.release_model(target)

    async def default_engine(self) -> EngineClient:
        """The default model's engine for a route that reads it (TGI's /info, MindIE's tokenizer, sessions): loaded
        on demand, as for a generation request, when residency parked it (idle, keep_alive 0, evicted, asleep)."""
        if self.engine is None and self.ready and self.default_parked():
            self.catalog.release(await self.hold(self.model_name, None))
        return self.loaded_engine

    def default_parked(self) -> bool:
        """The default model was unloaded by residency (idle, evicted, asleep) and the next request loads it."""
        e = self.catalog.entries.get(self.model_name) if self.catalog is not None else None
        return (e is not None and e.parked and e.state in ("stopped", "sleeping", "starting", "stopping")
                and self.residency.policy.may_load(e.id))

    @property
    def open_connections(self) -> int:
        return sum(getattr(srv, "open_connections", 0) for srv in self.listeners)

    def stats(self) -> EngineStats | None:
        return self.engine.stats() if self.engine is not None else None

    def instances(self) -> list[InstanceStatus] | None:
        """The default model's instances (BackendConfig.modelInstanceNumber), each with its stats."""
        return instances_of(self.engine) if self.engine is not None else None

    def healthy(self) -> bool:
        """Ready, and the default model serves now or loads on the next request (parked by residency)."""
        return self.ready and ((self.engine is not None and self.engine.healthy()) or self.default_parked())

    async def run_blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run tokenization (and other CPU work) off the IO loop, in the serving core's tokenizer pool."""
        return await self.frontend.run_blocking(fn, *args)

    # -- the serving core's pools and admission, as the server and its tests see them ----------------------
    @property
    def executor(self) -> ThreadPoolExecutor:
        return self.frontend.executor

    @executor.setter
    def executor(self, pool: ThreadPoolExecutor) -> None:
        self.frontend.executor = pool

    @property
    def media_executor(self) -> ThreadPoolExecutor:
        return self.frontend.media_executor

    @property
    def tokenizer_workers(self) -> int:
        return self.frontend.workers

    @property
    def admission(self) -> AdmissionQueue:
        return self.frontend.admission

    @property
    def in_flight(self) -> int:
        """Generation requests admitted (running in the engine or about to), counted in slots."""
        return self.admission.running

    @property
    def queued(self) -> int:
        """Generation requests waiting in the admission queue, counted in slots."""
        return self.admission.waiting

    def _check_open(self) -> None:
        """The serving core's gate: 503 while loading or draining."""
        if self.draining:
            raise UnhealthyError("the service is shutting down")
        if not self.ready:
            raise self.loading_error()

    async def admit(self, n: int = 1, timeout: float | None = None) -> None:
        """Take ``n`` admission slots (Frontend.admit); ``release(n)`` after."""
        await self.frontend.admit(n, timeout)

    def release(self, n: int = 1) -> None:
        self.frontend.release(n)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no generation request is admitted or queued; False if ``timeout`` passed first."""
        return await self.frontend.wait_idle(timeout)
