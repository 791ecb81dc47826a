"""Tornado applications: one per listener, holding the routes of the planes it serves."""
from __future__ import annotations

from typing import Any

import tornado.web
from tornado.log import access_log

from mindie_service.server.context import ServerContext
from mindie_service.server.handlers_base import NotFoundHandler
from mindie_service.server.handlers_batches import BatchCancelHandler, BatchesHandler, BatchHandler
from mindie_service.server.handlers_files import FileContentHandler, FileHandler, FilesHandler
from mindie_service.server.handlers_jobs import (CancelJobHandler, JobResultsHandler, JobStatusHandler,
                                                 ListJobsHandler, SubmitJobHandler)
from mindie_service.server.auth import ADMIN, Auth
from mindie_service.server.handlers_sessions import SessionHandler
from mindie_service.server.handlers_mgmt import (
    ConfigHandler,
    LiveHandler,
    ManagementOnlyHandler,
    MetricsHandler,
    ReadyHandler,
    StatusHandler,
    StopServiceHandler,
)
from mindie_service.server.handlers_lora import LoadLoraHandler, UnloadLoraHandler
from mindie_service.server.handlers_infer import InferHandler
from mindie_service.server.handlers_mindie import MindieGenerateHandler, TokenizerHandler
from mindie_service.server.handlers_v2 import (ModelMetadataHandler, ModelReadyHandler, OipInferHandler,
                                               ServerMetadataHandler, TritonGenerateHandler,
                                               TritonGenerateStreamHandler)
from mindie_service.server.handlers_sleep import IsSleepingHandler, SleepHandler, WakeUpHandler
from mindie_service.server.handlers_models import (DownloadModelHandler, ManagementOnlyModelHandler, ModelHandler,
                                                   ModelsHandler, ModelViewHandler, StartModelHandler,
                                                   StopModelHandler)
from mindie_service.server.handlers_openai import ChatCompletionsHandler, CompletionsHandler
from mindie_service.server.handlers_anthropic import CountTokensHandler, MessagesHandler
from mindie_service.server.handlers_chat_store import StoredCompletionHandler, StoredMessagesHandler
from mindie_service.server.handlers_pooling import EmbeddingsHandler, RerankHandler, ScoreHandler
from mindie_service.server.handlers_responses import (ResponseCancelHandler, ResponseHandler,
                                                      ResponseInputItemsHandler, ResponsesHandler)
from mindie_service.server.handlers_tokenize import DetokenizeHandler, TokenizeHandler, TokenizerInfoHandler
from mindie_service.server.openapi import OpenApiHandler
from mindie_service.server.handlers_rest import GenerateBatchHandler, GenerateOneHandler
from mindie_service.server.handlers_tgi import (
    HealthHandler,
    InfoHandler,
    TgiGenerateHandler,
    TgiGenerateStreamHandler,
)

Routes = list[tuple[str, type[tornado.web.RequestHandler]]]

# Everything that changes what the server serves: the management plane's (path, handler, its methods that
# change something). On the business port these paths answer 403 naming the management port, unless
# ServerConfig.managementRoutesOnBusinessPort serves them there too (then with a management key only).
MANAGEMENT_ONLY: list[tuple[str, type[tornado.web.RequestHandler], tuple[str, ...]]] = [
    (r"/v1/models/download/([^/]+)", DownloadModelHandler, ("get",)),
    (r"/v1/models/([^/]+)/start", StartModelHandler, ("put",)),
    (r"/v1/models/([^/]+)/stop", StopModelHandler, ("put",)),
    (r"/v1/models/([^/]+)", ModelHandler, ("delete",)),
    (r"/stopService", StopServiceHandler, ("post",)),
    (r"/v1/load_lora_adapter", LoadLoraHandler, ("post",)),
    (r"/v1/unload_lora_adapter", UnloadLoraHandler, ("post",)),
    (r"/sleep", SleepHandler, ("post",)),
    (r"/wake_up", WakeUpHandler, ("post",)),
]

_MODEL = r"/v2/models/([^/]+)"
_VERSIONED = r"/v2/models/([^/]+)/versions/([^/]+)"
# Triton's generate extension and the Open Inference Protocol v2 (server/handlers_v2.py), each also per version.
V2_ROUTES: Routes = [
    (r"/v2", ServerMetadataHandler),
    (r"/v2/health/live", LiveHandler),
    (r"/v2/health/ready", ReadyHandler),
    *[(base + tail, cls) for base in (_MODEL, _VERSIONED) for tail, cls in (
        ("/generate", TritonGenerateHandler), ("/generate_stream", TritonGenerateStreamHandler),
        ("/infer", OipInferHandler), ("/ready", ModelReadyHandler), ("", ModelMetadataHandler))],
]

# /health and /info are TGI routes too, so the business port serves them as TGI does (read-only).
PLANE_ROUTES: dict[str, Routes] = {
    "business": [
        (r"/", MindieGenerateHandler),
        (r"/generate", TgiGenerateHandler),
        (r"/generate_stream", TgiGenerateStreamHandler),
        (r"/v1/tokenizer", TokenizerHandler),
        (r"/infer", InferHandler),
        *V2_ROUTES,
        (r"/api/generate-one", GenerateOneHandler),
        (r"/api/generate-batch", GenerateBatchHandler),
        (r"/batch_inference/submit_job", SubmitJobHandler),
        (r"/batch_inference/job_status", JobStatusHandler),
        (r"/batch_inference/jobs", ListJobsHandler),
        (r"/batch_inference/cancel_job", CancelJobHandler),
        (r"/batch_inference/job_results", JobResultsHandler),
        (r"/v1/completions", CompletionsHandler),
        (r"/v1/chat/completions", ChatCompletionsHandler),
        (r"/v1/chat/completions/([^/]+)", StoredCompletionHandler),
        (r"/v1/chat/completions/([^/]+)/messages", StoredMessagesHandler),
        (r"/v1/messages", MessagesHandler),
        (r"/v1/messages/count_tokens", CountTokensHandler),
        (r"/v1/embeddings", EmbeddingsHandler),
        (r"/rerank", RerankHandler),
        (r"/v1/rerank", RerankHandler),
        (r"/score", ScoreHandler),
        (r"/v1/responses", ResponsesHandler),
        (r"/v1/responses/([^/]+)", ResponseHandler),
        (r"/v1/responses/([^/]+)/input_items", ResponseInputItemsHandler),
        (r"/v1/responses/([^/]+)/cancel", ResponseCancelHandler),
        (r"/v1/files", FilesHandler),
        (r"/v1/files/([^/]+)", FileHandler),
        (r"/v1/files/([^/]+)/content", FileContentHandler),
        (r"/v1/batches", BatchesHandler),
        (r"/v1/batches/([^/]+)", BatchHandler),
        (r"/v1/batches/([^/]+)/cancel", BatchCancelHandler),
        (r"/tokenize", TokenizeHandler),
        (r"/detokenize", DetokenizeHandler),
        (r"/tokenizer_info", TokenizerInfoHandler),
        (r"/v1/models", ModelsHandler),
        (r"/v1/models/([^/]+)", ModelViewHandler),  # DELETE: 403 (management port)
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
        (r"/v1/sessions/([^/]+)", SessionHandler),  # GET export / PUT import (server/handlers_sessions.py)
        (r"/is_sleeping", IsSleepingHandler),  # POST /sleep and /wake_up: MANAGEMENT_ONLY
        (r"/v1/models", ModelsHandler),
        *[(path, cls) for path, cls, _ in MANAGEMENT_ONLY],
    ],
    "metrics": [
        (r"/metrics", MetricsHandler),
    ],
    # ServerConfig.probePort: plain HTTP, the health routes only (a kubelet probe presents no client certificate)
    "probe": [
        (r"/health", HealthHandler),
        (r"/v2/health/live", LiveHandler),
        (r"/v2/health/ready", ReadyHandler),
    ],
}


def business_extras(admin_routes: bool) -> tuple[Routes, dict[type, dict[str, str]]]:
    """The business port's management routes: each answering 403 (its path's error dialect), or with
    ``admin_routes`` the handlers themselves, their changing methods asking for a management key."""
    if not admin_routes:
        return [(path, ManagementOnlyModelHandler if path.startswith("/v1/models") else ManagementOnlyHandler)
                for path, cls, _ in MANAGEMENT_ONLY if cls is not ModelHandler], {}
    access = {cls: {m: ADMIN for m in methods} for _, cls, methods in MANAGEMENT_ONLY}
    return [(path, cls) for path, cls, _ in MANAGEMENT_ONLY], access


def log_request(handler: tornado.web.RequestHandler) -> None:
    """Access log: errors of the server itself (5xx but 503) as warnings, the rest as info; 499 for a
    request whose client closed the connection first; the request id (the client's X-Request-Id when it sent
    one); the end user and cache key a client named; for a generation, its prompt and output token counts and
    the time to its first token; an error answer ends with its reason (``error_type: message``). Never the
    prompt's text."""
    status = handler.get_status()
    if getattr(handler, "aborted", False):
        status = 499  # nginx's "client closed request": the client left, nothing was answered
    log = access_log.warning if status >= 500 and status != 503 else access_log.info
    r = handler.request
    reason = getattr(handler, "error_reason", None)
    log("%d %s %s (%s) %.2fms%s%s%s%s", status, r.method, r.path, r.remote_ip, 1000.0 * r.request_time(),
        _id_part(handler), _client_part(getattr(handler, "client_ids", None)),
        _usage_part(getattr(handler, "run", None)),
        f": {reason}" if reason and status >= 400 else "")


def _client_part(ids: Any) -> str:
    """`` user=... cache_key=...``: the end user the client names (OpenAI's safety_identifier, Anthropic's
    metadata.user_id) and its prompt_cache_key, as the client sent them (printable, bounded when parsed)."""
    if ids is None:
        return ""
    out = f" user={ids.safety_identifier}" if ids.safety_identifier else ""
    return out + (f" cache_key={ids.prompt_cache_key}" if ids.prompt_cache_key else "")


def _id_part(handler: tornado.web.RequestHandler) -> str:
    rid, own = getattr(handler, "request_id", None), getattr(handler, "engine_id", None)
    if rid is None:
        return ""
    return f" id={rid}" if rid == own else f" id={rid} ({own})"


def _usage_part(run: Any) -> str:
    """`` prompt_tokens=N output_tokens=M ttft=Xms`` of a generation's Run (ttft once a token came)."""
    usage = getattr(run, "usage", None)
    if usage is None:
        return ""
    ttft = "" if usage.ttft is None else f" ttft={1000.0 * usage.ttft:.2f}ms"
    return f" prompt_tokens={usage.prompt_tokens} output_tokens={usage.output_tokens}{ttft}"


def make_app(ctx: ServerContext, planes: tuple[str, ...] | list[str],
             auth: Auth | None = None) -> tornado.web.Application:
    """The application for one listener serving ``planes`` (business, management, metrics). ``auth``: the API
    keys in force (shared by the listeners, so that SIGHUP reloads them once); default: the config's."""
    table: Routes = []
    access: dict[type, dict[str, str]] = {}
    for plane in planes:
        table += PLANE_ROUTES[plane]
        if plane == "business":
            extra, access = business_extras(ctx.settings.management_routes_on_business_port)
            # the handlers themselves replace the read-only model route; the refusals go after every plane's
            table = [r for r in table if r[1] is not ModelViewHandler or not access] + extra
    routes: list[Any] = []
    seen: set[str] = set()
    # a plane's own handler wins over another plane's refusal or read-only view (planes sharing a listener)
    for path, handler in sorted(table, key=lambda r: r[1] is ModelViewHandler
                                or issubclass(r[1], ManagementOnlyHandler)):
        if path not in seen:
            seen.add(path)
            routes.append((path, handler, {"ctx": ctx}))
            access.setdefault(handler, {}).setdefault("*", _plane_of(handler, planes))
    # the refusals (403) are not what this port serves: its document leaves them out
    served = [(path, handler) for path, handler, _ in routes if not issubclass(handler, ManagementOnlyHandler)]
    routes.append((r"/openapi.json", OpenApiHandler, {"ctx": ctx, "routes": served}))  # each port documents its own
    return tornado.web.Application(routes, default_handler_class=NotFoundHandler,
                                   default_handler_args={"ctx": ctx}, compress_response=False,
                                   log_function=log_request, auth=auth or Auth(ctx.settings), access=access,
                                   default_plane=planes[0])


def _plane_of(handler: type, planes: tuple[str, ...] | list[str]) -> str:
    """The plane whose keys ``handler`` asks for on this listener: the first of ``planes`` serving it."""
    for plane in planes:
        if any(cls is handler for _, cls in PLANE_ROUTES[plane]):
            return plane
    return planes[0]
