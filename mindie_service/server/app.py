"""Tornado applications: one per listener, holding the routes of the planes it serves."""
from __future__ import annotations

from typing import Any

import tornado.web
from tornado.log import access_log

from mindie_service.server.context import ServerContext
from mindie_service.server.handlers_base import NotFoundHandler
from mindie_service.server.handlers_jobs import (CancelJobHandler, JobResultsHandler, JobStatusHandler,
                                                 ListJobsHandler, SubmitJobHandler)
from mindie_service.server.handlers_mgmt import (
    ConfigHandler,
    LiveHandler,
    MetricsHandler,
    ReadyHandler,
    StatusHandler,
    StopServiceHandler,
)
from mindie_service.server.handlers_lora import LoadLoraHandler, UnloadLoraHandler
from mindie_service.server.handlers_mindie import MindieGenerateHandler, TokenizerHandler
from mindie_service.server.handlers_models import (DownloadModelHandler, ModelHandler, ModelsHandler,
                                                   StartModelHandler, StopModelHandler)
from mindie_service.server.handlers_openai import ChatCompletionsHandler, CompletionsHandler
from mindie_service.server.openapi import OpenApiHandler
from mindie_service.server.handlers_rest import GenerateBatchHandler, GenerateOneHandler
from mindie_service.server.handlers_tgi import (
    HealthHandler,
    InfoHandler,
    TgiGenerateHandler,
    TgiGenerateStreamHandler,
)

# /health and /info are TGI routes too, so the business port serves them as TGI does (read-only).
PLANE_ROUTES: dict[str, list[tuple[str, type[tornado.web.RequestHandler]]]] = {
    "business": [
        (r"/", MindieGenerateHandler),
        (r"/generate", TgiGenerateHandler),
        (r"/generate_stream", TgiGenerateStreamHandler),
        (r"/v1/tokenizer", TokenizerHandler),
        (r"/api/generate-one", GenerateOneHandler),
        (r"/api/generate-batch", GenerateBatchHandler),
        (r"/batch_inference/submit_job", SubmitJobHandler),
        (r"/batch_inference/job_status", JobStatusHandler),
        (r"/batch_inference/jobs", ListJobsHandler),
        (r"/batch_inference/cancel_job", CancelJobHandler),
        (r"/batch_inference/job_results", JobResultsHandler),
        (r"/v1/completions", CompletionsHandler),
        (r"/v1/chat/completions", ChatCompletionsHandler),
        (r"/v1/models", ModelsHandler),
        (r"/v1/models/download/([^/]+)", DownloadModelHandler),
        (r"/v1/models/([^/]+)/start", StartModelHandler),
        (r"/v1/models/([^/]+)/stop", StopModelHandler),
        (r"/v1/models/([^/]+)", ModelHandler),
        (r"/health", HealthHandler),
        (r"/info", InfoHandler),
    ],
    "management": [
        (r"/health", HealthHandler),
        (r"/info", InfoHandler),
        (r"/v2/health/live", LiveHandler),
        (r"/v2/health/ready", ReadyHandler),
        (r"/v1/config", ConfigHandler),
        (r"/v1/status", StatusHandler),
        (r"/stopService", StopServiceHandler),
        (r"/v1/load_lora_adapter", LoadLoraHandler),
        (r"/v1/unload_lora_adapter", UnloadLoraHandler),
    ],
    "metrics": [
        (r"/metrics", MetricsHandler),
    ],
}


def log_request(handler: tornado.web.RequestHandler) -> None:
    """Access log: errors of the server itself (5xx but 503) as warnings, the rest as info; 499 for a
    request whose client closed the connection first."""
    status = handler.get_status()
    if getattr(handler, "aborted", False):
        status = 499  # nginx's "client closed request": the client left, nothing was answered
    log = access_log.warning if status >= 500 and status != 503 else access_log.info
    r = handler.request
    log("%d %s %s (%s) %.2fms", status, r.method, r.path, r.remote_ip, 1000.0 * r.request_time())


def make_app(ctx: ServerContext, planes: tuple[str, ...] | list[str]) -> tornado.web.Application:
    """The application for one listener serving ``planes`` (business, management, metrics)."""
    routes: list[Any] = []
    seen: set[str] = set()
    for plane in planes:
        for path, handler in PLANE_ROUTES[plane]:
            if path not in seen:
                seen.add(path)
                routes.append((path, handler, {"ctx": ctx}))
    served = [(path, handler) for path, handler, _ in routes]
    routes.append((r"/openapi.json", OpenApiHandler, {"ctx": ctx, "routes": served}))  # each port documents its own
    return tornado.web.Application(routes, default_handler_class=NotFoundHandler,
                                   default_handler_args={"ctx": ctx}, compress_response=False,
                                   log_function=log_request)
