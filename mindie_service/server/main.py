"""`mindie-service serve`: load the config, open the listeners, load the engine, serve, drain on SIGTERM.

Order: config (and, with --prepare, what the CLI's wiring prepares) -> files and TLS material
checked (a bad one stops start-up, naming its key) -> listeners open (generation answers 503 and
/health 503 until the engine is ready) -> engine loaded in a worker thread, started, warmed up ->
ready. SIGTERM, SIGINT or POST /stopService: stop accepting, let running requests finish (bounded),
exit 0; a second SIGTERM or SIGINT during that drain stops at once (requests in flight end with an error,
a stream with an error frame), exit FORCED_EXIT.

What comes from the devkit (demo model and certificates, the mock engine, the testing fault hook, the
ready banner) is plugged in by the CLI through ``ServeWiring`` (``mindie_service.serve_wiring``): this
package never imports ``mindie_service.devkit``.
"""
from __future__ import annotations

import asyncio
import logging
import logging.handlers
import os
import signal
import ssl
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from mindie_service.config import ServiceConfig, check_files, load_config
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.client import EngineClient
from mindie_service.engine.contract import PoolRequest
from mindie_service.errors import ConfigError, UnhealthyError
from mindie_service.inputs import InputProcessor, TextPrompt
from mindie_service.sampling_params import SamplingParams
from mindie_service.server.app import make_app
from mindie_service.server.auth import Auth
from mindie_service.server.batch_routes import register_batch_endpoints
from mindie_service.server.context import ServerContext
from mindie_service.server.listener import BoundedHTTPServer, drain_limit, raise_open_files_limit
from npu_ops.memory import rss_bytes  # the ready line's RSS (also in /info, and after a model's load)

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 60.0
MAX_HEADER_BYTES = 64 * 1024
IDLE_CONNECTION_TIMEOUT_S = 300.0
ENGINE_DEAD_EXIT = 3  # the exit code after the engine thread died while serving (README: running under a supervisor)
ENGINE_DEATH_GRACE_S = 5.0
FORCED_EXIT = 4  # the exit code after a second SIGINT / SIGTERM cut the drain short (README)
FORCED_MESSAGE = "the service was stopped at once (a second SIGINT or SIGTERM during its drain)"


# -- engine -----------------------------------------------------------------------------------------
def build_model_engine(ec: EngineConfig, mock: bool) -> EngineClient:
    """The real engine of one catalog model (runs in a worker thread: it loads weights). A mock model needs
    the CLI's wiring (the mock engine is the devkit's)."""
    if mock:
        raise ConfigError(f"ModelConfig {ec.model_name!r} is a mock model: serve it through `mindie-service serve`")
    from mindie_service.engine.async_engine import AsyncEngine

    return AsyncEngine(ec)


def _same(engine: EngineClient) -> EngineClient:
    return engine


@dataclass(frozen=True)
class ServeWiring:
    """What the CLI plugs into the server (``mindie_service.serve_wiring.cli_wiring``); the defaults serve
    real models only, with nothing prepared and no banner.

    - ``prepare``: runs on the loaded config before its files are checked (``serve --prepare``).
    - ``model_engine``: ``(EngineConfig, mock) -> EngineClient`` for every model, the catalog's too.
    - ``wrap_engine``: applied once to the default model's engine after it loaded (a testing hook).
    - ``ready_banner``: a line printed once the service is ready."""

    prepare: Callable[[ServiceConfig], None] | None = None
    model_engine: Callable[[EngineConfig, bool], EngineClient] = build_model_engine
    wrap_engine: Callable[[EngineClient], EngineClient] = _same
    ready_banner: Callable[[ServiceConfig], str] | None = None


def build_engine(cfg: ServiceConfig, wiring: ServeWiring) -> EngineClient:
    """The engine for the first model (runs in a worker thread: it loads weights): its
    BackendConfig.modelInstanceNumber instances, behind one router when there are several."""
    from mindie_service.fleet.instances import build_instances, instance_configs

    from mindie_service.fleet.prefix_routing import use_prefix_routing

    mock = cfg.models[0].mock
    return use_prefix_routing(build_instances(instance_configs(cfg, 0), lambda ec: wiring.model_engine(ec, mock)),
                              cfg.backend.instance_routing)


async def warm_up(engine: EngineClient) -> None:
    """One greedy token through the input processor and the engine: /health turns green only after both answered.
    A model that does not generate (an embedding or rerank model) pools one input instead."""
    if "generate" not in engine.tasks:
        task = "embed" if "embed" in engine.tasks else "score"
        ids = tuple(engine.input_facts.tokenize("Hello"))
        await engine.pool(PoolRequest("warmup", (ids,), task))
        return
    req = InputProcessor.from_facts(engine.input_facts).process(
        TextPrompt("Hello"), SamplingParams(max_tokens=1, temperature=0.0), request_id="warmup")
    agen = engine.generate(req)
    try:
        async for _ in agen:
            pass
    finally:
        await agen.aclose()


def _setup_file_logging(cfg: ServiceConfig) -> None:
    level = {"Debug": logging.DEBUG, "Info": logging.INFO, "Warning": logging.WARNING, "Error": logging.ERROR,
             "Critical": logging.CRITICAL}[cfg.log.level]
    logging.getLogger("mindie_service").setLevel(level)
    if cfg.log.path:
        Path(cfg.log.path).parent.mkdir(parents=True, exist_ok=True)
        h = logging.handlers.RotatingFileHandler(cfg.log.path, maxBytes=cfg.log.file_size_mb * 1024 * 1024,
                                                 backupCount=cfg.log.file_num)
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(h)


def memory_facts(engine: EngineClient, block_size: int) -> str:
    """``KV pool 2912 blocks (46592 tokens), RSS 812 MiB``: what the ready line says about memory."""
    stats = engine.stats()
    pool = f"KV pool {stats.total_blocks} blocks ({stats.total_blocks * block_size} tokens)"
    rss = rss_bytes()
    return pool + (f", RSS {rss / 2**20:.0f} MiB" if rss is not None else "")


# -- engine death -----------------------------------------------------------------------------------
async def watch_engine(ctx: ServerContext, stop: asyncio.Event, interval_s: float = 0.1) -> bool:
    """True (and ``stop`` set) once the default model's engine died while serving. Its requests in flight have
    already failed (500 incomplete_generation); for ENGINE_DEATH_GRACE_S /health and /v2/health/ready answer 503
    (a load balancer stops sending) while those answers go out; then the drain stops the listeners and the
    process exits with ENGINE_DEAD_EXIT so that a supervisor restarts it. A model stopped through the catalog
    is not a death (ctx.engine is None then)."""
    while not stop.is_set():
        engine = ctx.engine
        if engine is not None and not engine.healthy():
            reasons = [getattr(e, "dead_reason", None) for e in getattr(engine, "engines", [engine])]  # instances
            logger.critical("the engine of model %s died (%s); exiting with code %d in %.0f s so that a supervisor "
                            "restarts the service", ctx.model_name, "; ".join(r for r in reasons if r) or "unknown",
                            ENGINE_DEAD_EXIT, ENGINE_DEATH_GRACE_S)
            try:
                await asyncio.wait_for(stop.wait(), ENGINE_DEATH_GRACE_S)
            except asyncio.TimeoutError:
                pass
            stop.set()
            return True
        await asyncio.sleep(interval_s)
    return False


# -- serving ----------------------------------------------------------------------------------------
_PORT_KEYS = {"business": "port", "management": "managementPort", "metrics": "metricsPort"}


def listen_error(e: OSError, planes: tuple[str, ...], addr: str, port: int) -> OSError:
    """``e`` naming what could not open: "[Errno 98] Address already in use: the business plane's port 1025 on
    127.0.0.1 (ServerConfig.port)"."""
    keys = " / ".join(f"ServerConfig.{_PORT_KEYS.get(p, p)}" for p in planes)
    owner = "planes'" if len(planes) > 1 else "plane's"
    what = f"the {' + '.join(planes)} {owner} port {port} on {addr} ({keys})"
    return OSError(e.errno, f"{e.strerror or e}: {what}")


def _listen(ctx: ServerContext, cfg: ServiceConfig, contexts: dict[str, ssl.SSLContext],
            auth: Auth) -> list[BoundedHTTPServer]:
    """One listener per (address, port) of the config's planes; OSError if one cannot open (the others closed)."""
    s = cfg.server
    servers: list[BoundedHTTPServer] = []
    try:
        for (addr, port), planes in s.listeners().items():
            srv = BoundedHTTPServer(make_app(ctx, planes, auth), ssl_options=contexts.get(planes[0]),
                                    max_body_size=drain_limit(s.max_request_bytes),
                                    max_header_size=MAX_HEADER_BYTES, idle_connection_timeout=IDLE_CONNECTION_TIMEOUT_S,
                                    body_timeout=s.body_timeout, decompress_request=False,
                                    max_connections=s.max_connections)
            try:
                srv.listen(port, address=addr)
            except OSError as e:
                raise listen_error(e, planes, addr, port) from None
            ctx.listeners.append(srv)
            servers.append(srv)
            logger.info("listening on %s://%s:%d for %s", "https" if contexts.get(planes[0]) else "http", addr, port,
                        ", ".join(planes))
    except OSError:
        for srv in servers:
            srv.stop()
        raise
    return servers


async def _go_ready(ctx: ServerContext, cfg: ServiceConfig, engine: EngineClient, wiring: ServeWiring) -> None:
    """Start and warm up the default model's engine, start the other models and the batch jobs: ready."""
    catalog = ctx.catalog
    assert catalog is not None
    engine.start()
    ctx.attach_engine(engine)
    await warm_up(engine)
    ctx.boot_meter.warmed()
    entry = catalog.entries[ctx.model_name]
    entry.memory = ctx.boot_meter.result(engine, entry.mock)  # the default model's footprint, measured as any load's
    entry.counters.loaded(entry.last_load_s or 0.0)
    ctx.ready = True
    ctx.residency.start()  # idle models unload from here on
    for m in cfg.models[1:]:  # every ModelConfig entry is started at boot, in the background, as far as room allows
        why = ctx.residency.no_room(catalog.entries[m.name])
        if why is not None:
            logger.info("model %s not started at boot: %s; the first request naming it loads it", m.name, why)
            continue
        try:
            catalog.start(m.name)
        except Exception as e:  # noqa: BLE001 - one model that cannot start leaves the others serving
            logger.error("model %s not started: %s", m.name, e)
    register_batch_endpoints(ctx.batch_endpoints, ctx)  # before start_jobs: a resumed batch's lines run at once
    ctx.start_jobs()
    facts = memory_facts(engine, ctx.engine_config.cache_block_size)
    logger.info("ready: model %s on %s (%s), %s; %s", ctx.model_name, engine.device_type, engine.device_reason,
                engine.dtype, facts)
    if wiring.ready_banner is not None:
        # the "ready. Try:" line is what scripts (and the tests) look for: the facts go on the line above it
        print(f"\n{facts}\nmindie-service is ready. Try:\n\n  {wiring.ready_banner(cfg)}\n", flush=True)


class StopSignals:
    """SIGTERM / SIGINT: the first (or POST /stopService) sets ``stop``, which starts the drain; one more sets
    ``force``, which cuts the drain short."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop, self.force = stop, asyncio.Event()

    def __call__(self, name: str) -> None:
        if not self.stop.is_set():
            logger.info("%s received", name)
            self.stop.set()
        elif not self.force.is_set():
            logger.warning("%s received again: stopping now, without waiting for the requests in flight", name)
            self.force.set()


async def _wait_drained(ctx: ServerContext, force: asyncio.Event) -> bool:
    """Wait for the requests in flight (bounded) or for ``force``; True when forced (the calls under way are
    cut: each ends with an error, a stream with its error frame)."""
    limit = min(DRAIN_TIMEOUT_S, ctx.settings.e2e_timeout)
    logger.info("draining %d request(s), up to %.0f s; Ctrl-C again to stop now", ctx.in_flight, limit)
    idle = asyncio.ensure_future(ctx.wait_idle(limit))
    forced = asyncio.ensure_future(force.wait())
    await asyncio.wait([idle, forced], return_when=asyncio.FIRST_COMPLETED)
    idle.cancel()
    forced.cancel()
    if force.is_set():
        cut = ctx.frontend.cut_all(UnhealthyError(FORCED_MESSAGE))
        logger.warning("stopping at once: %d call(s) cut, exit code %d", cut, FORCED_EXIT)
        await asyncio.sleep(0.2)  # their error answers and frames go out before the connections close
        return True
    if not idle.result():
        logger.warning("drain timed out with %d request(s) in flight", ctx.in_flight)
    return False


async def _drain(ctx: ServerContext, servers: list[BoundedHTTPServer], engine: EngineClient | None,
                 force: asyncio.Event) -> bool:
    """Stop accepting, let running requests finish (bounded, or cut by ``force``), close connections, stop
    jobs, models, engine. True when ``force`` cut it short."""
    ctx.draining = True
    for srv in servers:
        srv.stop()
    await ctx.pause_responses()  # background responses resume at the next start rather than hold the drain
    forced = await _wait_drained(ctx, force)
    for srv in servers:
        try:
            await asyncio.wait_for(srv.close_all_connections(), 1.0 if forced else 5.0)
        except asyncio.TimeoutError:
            pass
    await ctx.stop_jobs()  # batch jobs stop where they are and resume at the next start
    await ctx.residency.shutdown()
    if ctx.catalog is not None:
        await ctx.catalog.shutdown()
    if engine is not None:
        engine.shutdown()
    ctx.frontend.shutdown()
    return forced


async def _await_load_or_force(load: asyncio.Future[EngineClient], force: asyncio.Event) -> None:
    """A stop came while the model loads: wait for the load, unless a second signal says to stop now (the
    loading thread cannot be interrupted: the process exits at once with FORCED_EXIT)."""
    logger.info("stop requested while loading the model; exiting once it is loaded (Ctrl-C again to stop now)")
    forced = asyncio.ensure_future(force.wait())
    await asyncio.wait([load, forced], return_when=asyncio.FIRST_COMPLETED)
    forced.cancel()
    if force.is_set() and not load.done():
        logger.warning("stopped while loading the model: exit code %d", FORCED_EXIT)
        logging.shutdown()
        os._exit(FORCED_EXIT)


async def _run(cfg: ServiceConfig, contexts: dict[str, ssl.SSLContext], wiring: ServeWiring, auth: Auth) -> int:
    loop = asyncio.get_running_loop()
    ctx = ServerContext(cfg)
    stop = asyncio.Event()
    ctx.request_stop = stop.set
    signals = StopSignals(stop)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signals, sig.name)
    loop.add_signal_handler(signal.SIGHUP, auth.reload)  # ServerConfig.apiKeyFile read again
    try:
        servers = _listen(ctx, cfg, contexts, auth)
    except OSError as e:
        logger.error("cannot listen: %s", e)
        return 1
    code = 0
    engine: EngineClient | None = None
    catalog = ctx.catalog
    assert catalog is not None
    catalog.build, catalog.warm_up = wiring.model_engine, warm_up
    catalog.entries[ctx.model_name].begin_loading()
    try:
        ctx.boot_meter.begin()
        load = loop.run_in_executor(None, build_engine, cfg, wiring)
        await asyncio.wait([load, asyncio.ensure_future(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
        if not load.done():
            await _await_load_or_force(load, signals.force)
        engine = wiring.wrap_engine(await load)
        ctx.boot_meter.built()
        if not stop.is_set():
            await _go_ready(ctx, cfg, engine, wiring)
            watcher = asyncio.ensure_future(watch_engine(ctx, stop))
            await stop.wait()
            code = ENGINE_DEAD_EXIT if watcher.done() and watcher.result() else code
            watcher.cancel()
    except Exception:
        logger.exception("the engine failed to start")
        code = 1
    ctx.boot_meter.stop()  # (its readings end at the warm-up; here also when the load never got that far)
    if await _drain(ctx, servers, engine, signals.force):
        code = FORCED_EXIT
    logger.info("stopped")
    return code


def serve(config_path: str, wiring: ServeWiring = ServeWiring(),
          overrides: Callable[[dict[str, Any]], Mapping[str, str]] | None = None) -> int:
    """Entry point of `mindie-service serve` (the CLI passes its wiring, and what its vLLM flags change in the
    config: ``overrides``, see config.loading.load_config); returns the process exit code."""
    try:
        cfg = load_config(config_path, overrides=overrides)
        _setup_file_logging(cfg)
        if wiring.prepare is not None:
            wiring.prepare(cfg)
        check_files(cfg)
        raise_open_files_limit(cfg.server.max_connections * len(cfg.server.listeners()))
        auth = Auth(cfg.server)  # API keys: a bad ServerConfig.apiKeyFile stops start-up
        contexts: dict[str, ssl.SSLContext] = {}
        if cfg.server.https_enabled:
            from mindie_service.server.tls import plane_contexts

            contexts = plane_contexts(cfg.server)
    except ConfigError as e:
        print(f"mindie-service: {e}", file=sys.stderr)
        return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # The engine thread holds the GIL between torch ops; a shorter switch interval lets the IO
    # thread flush each token as it comes instead of in bursts every 5 ms.
    sys.setswitchinterval(0.001)
    return asyncio.run(_run(cfg, contexts, wiring, auth))
