"""POST /generate and /generate_stream (Text Generation Inference 1.1): parse + validate, and /info."""
from __future__ import annotations

from typing import Any

from mindie_service.errors import check
from mindie_service.protocol.mindie import BODY_KEYS, parse_generation
from mindie_service.protocol.request import GenerationRequest, ProtocolLimits
from mindie_service.protocol.validation import refuse_unknown


def parse_tgi_request(body: dict[str, Any], limits: ProtocolLimits, *, stream: bool) -> GenerationRequest:
    """TGI's GenerateRequest ``{"inputs", "parameters"?}``; the route decides streaming. A ``stream`` key (TGI's
    client sends it to ``/``) is taken when it says what the route does, refused otherwise. Any other key, at the
    top or in ``parameters`` (TGI has no priority), is refused by name with a 422: TGI's own router would
    deserialize past it and ignore it, which this server never does with a field it was sent."""
    refuse_unknown(body, BODY_KEYS)
    said = body.get("stream")
    route = "/generate_stream" if stream else "/generate"
    check(said is None or said is stream, "stream", f"{str(stream).lower()} or absent on {route}", said)
    return parse_generation(body, dialect="tgi", stream=stream, limits=limits, extra_keys=frozenset())


def info_payload(*, model_id: str, dtype: str, device_type: str, max_concurrent_requests: int, max_best_of: int,
                 max_stop_sequences: int, max_input_length: int, max_total_tokens: int,
                 max_batch_total_tokens: int, validation_workers: int, version: str,
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """TGI's Info object: every required field of the 1.1 schema, plus project extras."""
    out: dict[str, Any] = {
        "model_id": model_id,
        "model_sha": None,
        "model_dtype": dtype if dtype.startswith("torch.") else f"torch.{dtype}",
        "model_device_type": device_type,
        "model_pipeline_tag": "text-generation",
        "max_concurrent_requests": max_concurrent_requests,
        "max_best_of": max_best_of,
        "max_stop_sequences": max_stop_sequences,
        "max_input_length": max_input_length,
        "max_total_tokens": max_total_tokens,
        # The scheduler has no TGI-style waiting ratio or waiting-token budget: it prefills whenever
        # requests wait (maxQueueDelayMicroseconds bounds the wait), which these values describe.
        "waiting_served_ratio": 0.0,
        "max_batch_total_tokens": max_batch_total_tokens,
        "max_waiting_tokens": 0,
        "validation_workers": validation_workers,
        "version": version,
        "sha": None,
        "docker_label": None,
    }
    if extra:
        out.update(extra)
    return out
