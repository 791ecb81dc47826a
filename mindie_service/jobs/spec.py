"""A job's request: the seed's ``Path`` objects and ``options``, validated at submit (422 naming the field)."""
from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any, Mapping

from mindie_service.errors import ValidationError, check

PATH_TYPES = ("filepath", "uri", "raw_bytes")
MAX_GENERATIONS = 16
DEFAULT_MAX_TOKENS = 256


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

    def to_json(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "logprobs": self.logprobs}


@dataclass(frozen=True)
class JobRequest:
    model: str
    input_path: PathSpec
    options: JobOptions
    num_generations: int


def _number(obj: Mapping[str, Any], name: str, field: str, default: float) -> float:
    v = obj.get(name)
    if v is None:
        return default
    check(isinstance(v, (int, float)) and not isinstance(v, bool), field, "a number", v)
    return float(v)


def parse_path(v: Any, field: str) -> PathSpec:
    check(isinstance(v, dict), field, 'an object {"value", "type"}', v)
    value, kind = v.get("value"), v.get("type")
    check(kind in PATH_TYPES, f"{field}.type", f"one of {', '.join(PATH_TYPES)}", kind)
    check(isinstance(value, str) and value != "", f"{field}.value", "a non-empty string", value)
    return PathSpec(value, kind)


def parse_job_request(body: Mapping[str, Any], max_tokens_cap: int) -> JobRequest:
    model = body.get("model")
    check(isinstance(model, str) and model != "", "model", "a non-empty string", model)
    path = parse_path(body.get("prompt_file_path"), "prompt_file_path")
    raw_opts = body.get("options") or {}
    check(isinstance(raw_opts, dict), "options", "an object", raw_opts)
    unknown = sorted(set(raw_opts) - {"logprobs", "max_tokens", "temperature", "top_p"})
    check(not unknown, "options", "an object of logprobs, max_tokens, temperature, top_p", unknown)
    mt = raw_opts.get("max_tokens", DEFAULT_MAX_TOKENS)
    check(isinstance(mt, int) and not isinstance(mt, bool), "options.max_tokens", "an integer", mt)
    check(mt >= 1, "options.max_tokens", ">= 1", mt)
    temperature = _number(raw_opts, "temperature", "options.temperature", 0.0)
    check(0.0 <= temperature <= 2.0, "options.temperature", "in [0, 2] (0 = greedy)", temperature)
    top_p = _number(raw_opts, "top_p", "options.top_p", 1.0)
    check(0.0 < top_p <= 1.0, "options.top_p", "in (0, 1]", top_p)
    lp = raw_opts.get("logprobs", False)
    check(isinstance(lp, bool), "options.logprobs", "a boolean", lp)
    n = body.get("num_generations", 1)
    n = 1 if n is None else n
    check(isinstance(n, int) and not isinstance(n, bool), "num_generations", "an integer", n)
    check(1 <= n <= MAX_GENERATIONS, "num_generations", f"in [1, {MAX_GENERATIONS}]", n)
    # max_tokens is capped by maxIterTimes (documented), as every other route's output is.
    opts = JobOptions(min(mt, max_tokens_cap), temperature, top_p, lp)
    return JobRequest(model, path, opts, n)


def decode_raw(path: PathSpec, max_bytes: int) -> bytes:
    try:
        data = base64.b64decode(path.value, validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError("Parameter prompt_file_path.value must be base64 for type raw_bytes") from None
    check(len(data) <= max_bytes, "prompt_file_path", f"at most {max_bytes} bytes", f"{len(data)} bytes")
    return data
