"""Management routes (MindIE): liveness, readiness, config, status, stopService; and GET /metrics. The
refusal of a management route asked on the business port (403 naming the management port)."""
from __future__ import annotations

import logging
from typing import Any, Callable, TypeVar
from urllib.parse import urlsplit

from tornado.httputil import HTTPServerRequest

from mindie_service.fleet.gateway_view import gateway_state
from mindie_service.fleet.instances import InstanceStatus
from mindie_service.errors import ForbiddenError, UnhealthyError
from mindie_service.server.gateway_metrics import gateway_json
from mindie_service.server.handlers_base import BaseHandler
from mindie_service.server.metrics import CONTENT_TYPE
from mindie_service.server.residency_view import residency_json

logger = logging.getLogger(__name__)


def same_origin(origin: str, request: HTTPServerRequest) -> bool:
    """True when ``origin`` is this server's own scheme://host:port (as the request's Host names it)."""
    try:
        o = urlsplit(origin)
        port = o.port or (443 if o.scheme == "https" else 80)
    except ValueError:
        return False
    host = request.host or ""
    try:
        h = urlsplit(f"//{host}")
        own_port = h.port or (443 if request.protocol == "https" else 80)
    except ValueError:
        return False
    return (o.scheme == request.protocol and (o.hostname or "").lower() == (h.hostname or "").lower()
            and port == own_port)


F = TypeVar("F", bound=Callable[..., Any])


def management_only(method: F) -> F:
    """Marks a handler method that refuses (403) on this port: /openapi.json does not document it."""
    method.management_only = True  # type: ignore[attr-defined]
    return method


def management_only_message(handler: BaseHandler) -> str:
    r = handler.request
    return (f"{r.method} {r.path} changes what this server serves: it is a management operation, served on the "
            f"management port ({handler.ctx.settings.management_port}), not on the business port")


class ManagementOnlyHandler(BaseHandler):
    """A route that changes what is served (stopService, LoRA load/unload), asked on the business port: 403."""

    def prepare(self) -> None:
        super().prepare()  # (a missing or wrong API key is answered first: 401)
        self.refuse(ForbiddenError(management_only_message(self)))


def model_state(ctx: Any) -> tuple[str, str | None]:
    """(state, load error) of the default model: starting, running, stopping, stopped or failed."""
    e = ctx.catalog.entries.get(ctx.model_name) if ctx.catalog is not None else None
    if e is None:
        return ("running" if ctx.engine is not None else "starting"), None
    state = "stopped" if e.state in ("downloaded", "not_downloaded") else e.state
    return state, e.error if state == "failed" else None


def unhealthy(ctx: Any) -> UnhealthyError:
    """Why the default model does not serve, truthfully: shutting down, starting, stopped, failed (and why)."""
    if ctx.draining:
        return UnhealthyError("unhealthy: the service is shutting down")
    state, error = model_state(ctx)
    name, port = ctx.model_name, ctx.settings.management_port
    if state == "failed":
        return UnhealthyError(f"unhealthy: the default model {name} failed to start: {error} (once the cause is "
                              f"gone, PUT /v1/models/{name}/start on the management port {port})")
    if state in ("stopped", "stopping"):
        return UnhealthyError(f"unhealthy: the default model {name} is {state} (PUT /v1/models/{name}/start on the "
                              f"management port {port})")
    entry = ctx.catalog.entries.get(name) if ctx.catalog is not None else None
    if state == "starting" and entry is not None:
        return UnhealthyError(f"unhealthy: {entry.loading_message()}")
    if state == "starting" or not ctx.ready:
        return UnhealthyError(f"unhealthy: the default model {name} is starting")
    return UnhealthyError(f"unhealthy: the engine of the default model {name} is not running")


class LiveHandler(BaseHandler):
    """GET /v2/health/live: the process answers."""

    def get(self) -> None:
        self.write_json({"status": "live"})


class ReadyHandler(BaseHandler):
    """GET /v2/health/ready: 503 while loading, draining, unhealthy or while the admission queue is full
    (maxLinkNum running and 2 x maxLinkNum waiting: the next request would get a 429)."""

    def get(self) -> None:
        ctx = self.ctx
        if not ctx.healthy() or ctx.draining:
            raise UnhealthyError("not ready")
        if ctx.admission.full:
            raise UnhealthyError(f"not ready: overloaded ({ctx.in_flight} requests running, {ctx.queued} waiting)")
        self.write_json({"status": "ready"})


class ConfigHandler(BaseHandler):
    """GET /v1/config: the deployment's model and limits, MindIE's keys."""

    def get(self) -> None:
        ctx = self.ctx
        m, ec = ctx.config.models[0], ctx.engine_config
        self.write_json({
            "modelName": m.name, "maxSeqLen": ec.max_seq_len, "maxInputTokenLen": ec.effective_max_input_len,
            "npuMemSize": m.npu_mem_size_gb, "cpuMemSize": m.cpu_mem_size_gb, "worldSize": m.world_size,
            "maxOutputLen": ec.max_iter_times, "cacheBlockSize": ec.cache_block_size,
            "maxBatchSize": ec.max_batch_size, "maxPrefillTokens": ec.max_prefill_tokens,
            "maxLinkNum": ctx.settings.max_link_num,
        })


class StatusHandler(BaseHandler):
    """GET /v1/status: scheduler queues and KV blocks."""

    def get(self) -> None:
        st = self.ctx.stats()
        state, error = model_state(self.ctx)
        if st is None and state == "starting" and not self.ctx.draining:
            self.write_json(self._starting_json())
            return
        if st is None and self.ctx.default_parked():  # unloaded by residency; the next request loads it
            self.write_json({"status": "ready", "model": {"id": self.ctx.model_name, "state": state, "error": None},
                             "residency": residency_json(self.ctx.residency)})
            return
        if st is None:
            raise unhealthy(self.ctx)
        self.write_json({
            "status": "ready" if self.ctx.healthy() else "not ready",
            "model": {"id": self.ctx.model_name, "state": state, "error": error},
            "requests": {"running": st.running, "waiting": st.waiting, "swapped": st.swapped,
                         "in_flight": self.ctx.in_flight, "queued": self.ctx.queued},
            # batch-job lines, counted apart (they are also in running / waiting above)
            "batch": {"running": st.batch_running, "waiting": st.batch_waiting,
                      "jobs_active": len(self.ctx.jobs.store.active()) if self.ctx.jobs else 0},
            # this handler is one of them; every other one is a request not yet answered or abandoned
            "connections": {"open": self.ctx.open_connections, "handlers": self.ctx.open_handlers},
            "blocks": {"total": st.total_blocks, "free": st.free_blocks, "used": st.total_blocks - st.free_blocks},
            "cacheUsage": st.cache_usage, "prefixCacheHitRate": st.prefix_cache_hit_rate,
            # BackendConfig.modelInstanceNumber: each instance (the figures above are their sums)
            "instances": [_instance_json(i) for i in self.ctx.instances() or ()],
            **gateway_json(gateway_state(self.ctx.engine)),  # what /metrics' vllm:* families show
            "residency": residency_json(self.ctx.residency),  # every catalog model's state and memory (issue 46)
        })


    def _starting_json(self) -> dict[str, Any]:
        """The status body while the default model loads: its state, the load's phase, time so far and ETA."""
        ctx = self.ctx
        entry = ctx.catalog.entries.get(ctx.model_name) if ctx.catalog is not None else None
        return {"status": "not ready",
                "model": {"id": ctx.model_name, "state": "starting", "error": None,
                          "loading": entry.loading_json() if entry is not None else None},
                "requests": {"running": 0, "waiting": 0, "swapped": 0, "in_flight": ctx.in_flight,
                             "queued": ctx.queued},
                "connections": {"open": ctx.open_connections, "handlers": ctx.open_handlers}}


def _instance_json(i: InstanceStatus) -> dict[str, Any]:
    st = i.stats
    out: dict[str, Any] = {
        "instance": i.index, "status": "ready" if i.healthy else "not ready",
        "requests": {"running": st.running, "waiting": st.waiting, "swapped": st.swapped},
        "blocks": {"total": st.total_blocks, "free": st.free_blocks, "used": st.total_blocks - st.free_blocks},
        "cacheUsage": st.cache_usage, "sessionsHeld": st.sessions_held,
        "sessionHits": st.session_hits}
    if i.routed is not None:  # the router's counts (several instances)
        out["requests"].update(routed=i.routed, in_flight=i.in_flight)
    return out


def _json_type(content_type: str) -> bool:
    mime = content_type.split(";", 1)[0].strip().lower()
    return mime == "application/json" or mime.endswith("+json")


class StopServiceHandler(BaseHandler):
    """POST /stopService: answer, then drain (stop accepting, finish running requests, exit 0)."""

    def post(self) -> None:
        # A browser can send a cross-site form post (text/plain, urlencoded, multipart) without a
        # preflight; it cannot send application/json, and it always names its page's Origin. An empty
        # body with no Content-Type (`curl -X POST`) or a JSON one is taken as {}: no form sends that.
        ctype = self.request.headers.get("Content-Type")
        if self.body() or (ctype is not None and not _json_type(ctype)):
            self.json_body()
        origin = self.request.headers.get("Origin")
        if origin is not None and not same_origin(origin, self.request):
            raise ForbiddenError(f"POST /stopService from a foreign Origin {origin!r} is refused")
        logger.info("stopService received from %s", self.request.remote_ip)
        self.write_json({"status": "stopping"})
        self.ctx.request_stop()


class MetricsHandler(BaseHandler):
    """GET /metrics: Prometheus text of this service's registry."""

    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE)
        self.finish(self.ctx.metrics.render())
