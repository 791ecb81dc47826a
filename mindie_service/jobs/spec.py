"""A job's request: the seed's ``Path`` objects and ``options``, validated at submit (422 naming the field)."""
from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any, Mapping

from mindie_service.errors import ValidationError, check
from mindie_service.params.keep_alive import FOREVER, parse_keep_alive
from mindie_service.params.output_cap import output_cap
from mindie_service.params.rule import read_fields
from mindie_service.params.structured_field import read_structured
from mindie_service.params.table import JOB, JOB_OPTIONS, STRUCTURED
from mindie_service.protocol.validation import refuse_unknown

PATH_TYPES = ("filepath", "uri", "raw_bytes")
DEFAULT_MAX_TOKENS = 256
_BODY_KEYS = frozenset({"model", "prompt_file_path", "options", "num_generations", "keep_alive"})


@dataclass(frozen=True)
class PathSpec:
    """The seed's ``Path``: ``{value, type}``."""

    value: str
    type: str

    def to_json(self) -> dict[str, str]:
        return {"value": self.value, "type": self.type}


@dataclass(frozen=True)
class JobOptions:
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    logprobs: bool = False
    response_format: dict[str, Any] | None = None  # OpenAI's, applied to every line (structured.request_forms)
    keep_alive: float | None = None  # the body's top-level keep_alive (Ollama's), given to each line's model hold

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                               "logprobs": self.logprobs}
        if self.response_format is not None:
            out["response_format"] = self.response_format
        if self.keep_alive is not None:  # stored as Ollama writes it: seconds, -1 = keep loaded
            out["keep_alive"] = -1 if self.keep_alive == FOREVER else self.keep_alive
        return out


@dataclass(frozen=True)
class JobRequest:
    model: str
    input_path: PathSpec
    options: JobOptions
    num_generations: int


def parse_path(v: Any, field: str) -> PathSpec:
    check(isinstance(v, dict), field, 'an object {"value", "type"}', v)
    value, kind = v.get("value"), v.get("type")
    check(kind in PATH_TYPES, f"{field}.type", f"one of {', '.join(PATH_TYPES)}", kind)
    check(isinstance(value, str) and value != "", f"{field}.value", "a non-empty string", value)
    return PathSpec(value, kind)


def parse_job_request(body: Mapping[str, Any], max_tokens_cap: int) -> JobRequest:
    """``{model, prompt_file_path, options?, num_generations?, keep_alive?}``; ``options`` and ``num_generations``
    are read through the rule table (``params.table.JOB_OPTIONS``, ``JOB``), max_tokens capped by maxIterTimes
    (``max_tokens_cap``) as every other route's output is (params.output_cap; the engine caps each line again
    by its prompt). ``keep_alive`` (beyond the seed, as on every generation route) applies to each line's hold of
    the model (jobs.runner). Any other top-level key is refused by name (the seed's contract has these four)."""
    refuse_unknown(body, _BODY_KEYS)
    model = body.get("model")
    check(isinstance(model, str) and model != "", "model", "a non-empty string", model)
    path = parse_path(body.get("prompt_file_path"), "prompt_file_path")
    raw_opts = body.get("options") or {}
    check(isinstance(raw_opts, dict), "options", "an object", raw_opts)
    allowed = set(JOB_OPTIONS) | {STRUCTURED["job"][0]}
    unknown = sorted(set(raw_opts) - allowed)
    check(not unknown, "options", f"an object of {', '.join(sorted(allowed))}", unknown)
    read_structured(raw_opts, "job", "options.")  # its shape; the submit handler compiles it (server.handlers_jobs)
    o = read_fields(raw_opts, JOB_OPTIONS, "options.")
    n = read_fields(body, JOB).get("num_generations", 1)
    opts = JobOptions(output_cap(o.get("max_tokens", DEFAULT_MAX_TOKENS), 0, max_iter_times=max_tokens_cap),
                      o.get("temperature", 0.0), o.get("top_p", 1.0), o.get("logprobs", False),
                      raw_opts.get("response_format"), parse_keep_alive(body.get("keep_alive")))
    return JobRequest(model, path, opts, n)


def decode_raw(path: PathSpec, max_bytes: int) -> bytes:
    try:
        data = base64.b64decode(path.value, validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError("Parameter prompt_file_path.value must be base64 for type raw_bytes") from None
    check(len(data) <= max_bytes, "prompt_file_path", f"at most {max_bytes} bytes", f"{len(data)} bytes")
    return data
