"""Management routes (MindIE): liveness, readiness, config, status, stopService; and GET /metrics."""
from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

from tornado.httputil import HTTPServerRequest

from mindie_service.engine.instances import InstanceStatus
from mindie_service.errors import ForbiddenError, UnhealthyError
from mindie_service.server.handlers_base import BaseHandler
from mindie_service.server.metrics import CONTENT_TYPE

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
        if st is None:
            raise UnhealthyError("the model is still loading")
        self.write_json({
            "status": "ready" if self.ctx.healthy() else "not ready",
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
        })


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


class StopServiceHandler(BaseHandler):
    """POST /stopService: answer, then drain (stop accepting, finish running requests, exit 0)."""

    def post(self) -> None:
        # A browser can send a cross-site form post (text/plain, urlencoded, multipart) without a
        # preflight; it cannot send application/json, and it always names its page's Origin.
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
