"""TGI 1.1 routes: POST /generate, POST /generate_stream, GET /info, GET /health."""
from __future__ import annotations

from typing import Any

from mindie_service.models.demo_marker import demo_checkpoint
from mindie_service.protocol.encoders import Encoder
from mindie_service.protocol.request import GenerationRequest
from mindie_service.protocol.tgi import info_payload, parse_tgi_request
from mindie_service.protocol.vllm_fields import advertised_fields
from mindie_service.server.generation import GenerationHandler
from mindie_service.server.handlers_base import BaseHandler
from mindie_service.server.handlers_mgmt import unhealthy
from npu_ops.memory import rss_mib


def service_version() -> str:
    try:
        from importlib.metadata import version

        return version("mindie-service")
    except Exception:  # not installed as a distribution (running from a checkout)
        return "0.1.0"


class TgiGenerateHandler(GenerationHandler):
    """POST /generate: one JSON object."""

    stream = False

    def parse(self, body: dict[str, Any]) -> GenerationRequest:
        return parse_tgi_request(body, self.ctx.limits, stream=self.stream)

    @property
    def encoder(self) -> Encoder:
        return self.ctx.tgi_encoder


class TgiGenerateStreamHandler(TgiGenerateHandler):
    """POST /generate_stream: Server-Sent Events with integer token ids."""

    stream = True


class HealthHandler(BaseHandler):
    """GET /health: 200 once the engine answers, 503 otherwise (loading, dead engine thread, draining)."""

    def get(self) -> None:
        if not self.ctx.healthy() or self.ctx.draining:
            raise unhealthy(self.ctx)  # says stopped, failed (and why) or starting
        self.set_status(200)
        self.finish()


class InfoHandler(BaseHandler):
    """GET /info: TGI's Info, with real values."""

    async def get(self) -> None:
        ctx = self.ctx
        if ctx.engine is None and not (ctx.ready and ctx.default_parked()):
            raise unhealthy(ctx)
        eng = await ctx.default_engine()  # a default model parked by residency loads, as for a request
        ec, limits = ctx.engine_config, ctx.limits
        st = eng.stats()
        self.write_json(info_payload(
            model_id=ctx.model_name, dtype=eng.dtype, device_type=eng.device_type,
            max_concurrent_requests=ctx.settings.max_link_num, max_best_of=limits.max_best_of,
            max_stop_sequences=limits.max_stop_sequences, max_input_length=ec.effective_max_input_len,
            max_total_tokens=ec.max_seq_len, max_batch_total_tokens=int(st.total_blocks) * ec.cache_block_size,
            validation_workers=ctx.tokenizer_workers, version=service_version(),
            extra={"model_device_reason": eng.device_reason,
                   "max_new_tokens_cap": ec.max_iter_times, "max_batch_size": ec.max_batch_size,
                   "max_top_n_tokens": limits.max_top_n_tokens, "modalities": sorted(eng.modalities),
                   "adapters": sorted(eng.adapter_names()),
                   "weights_report": dict(getattr(eng, "weights_report", None) or {}),
                   "rss_mib": rss_mib(),
                   "demo_weights": demo_checkpoint(ctx.config.models[0].weight_path) is not None,
                   **advertised_fields(ctx.settings.open_ai_support)},
        ))
