"""Speculative decoding's settings (engine.spec.speculator), in the two shapes people bring them in.

* vLLM's offline shape: ``LLM(model, speculative_config={"method": "ngram", "num_speculative_tokens": k,
  "prompt_lookup_max": n, "prompt_lookup_min": m})`` or ``{"method": "draft_model", "model": path,
  "num_speculative_tokens": k}``.
* MindIE's config shape: ``ModelConfig.plugin_params``, a JSON-encoded string
  ``{"plugin_type": "memory_decoding", "decoding_length": 16, "dynamic_algo": true}`` (our n-gram proposer
  over the sequence and the recent text of finished requests), with ``speculationGamma`` >=
  ``decoding_length``; ``{"plugin_type": "draft_model", "draft_model_path": ..., "decoding_length": k}``
  is this project's addition for a draft checkpoint.

Unknown keys are refused, naming the known ones: a misspelt key must not silently turn speculation off.
Plain Python: the scheduler reads it."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from mindie_service.errors import ValidationError, check

NGRAM, DRAFT_MODEL = "ngram", "draft_model"
MAX_SPECULATIVE_TOKENS = 16  # MindIE's decoding_length range is [1, 16]
_VLLM_KEYS = {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "model",
              "dynamic", "memory"}
_PLUGIN_KEYS = {"plugin_type", "decoding_length", "dynamic_algo", "draft_model_path", "prompt_lookup_max",
                "prompt_lookup_min", "memory"}


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str  # "ngram" | "draft_model"
    num_speculative_tokens: int  # k: the most draft tokens a row verifies in one step
    prompt_lookup_max: int = 4  # n-gram: longest suffix matched
    prompt_lookup_min: int = 1  # n-gram: shortest suffix matched
    model: str | None = None  # draft_model: the draft checkpoint (same tokenizer as the target)
    dynamic: bool = True  # k per sequence follows its acceptance, per step the measured step costs
    memory: bool = True  # n-gram: also look in the recent text of finished requests (MindIE's "memory")

    def validate(self, where: str = "speculative_config", names: Mapping[str, str] | None = None) -> None:
        """ValidationError naming the key as the caller knows it: ``where`` + ``names[field]`` (or the field)."""
        def key(f: str) -> str:
            return f"{where}.{(names or {}).get(f, f)}"

        check(self.method in (NGRAM, DRAFT_MODEL), key("method"), f"one of {NGRAM}, {DRAFT_MODEL}", self.method)
        k = self.num_speculative_tokens
        check(isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= MAX_SPECULATIVE_TOKENS,
              key("num_speculative_tokens"), f"an integer in [1, {MAX_SPECULATIVE_TOKENS}]", k)
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        check(isinstance(lo, int) and lo >= 1, key("prompt_lookup_min"), "an integer >= 1", lo)
        check(isinstance(hi, int) and isinstance(lo, int) and hi >= lo, key("prompt_lookup_max"),
              f"an integer >= prompt_lookup_min ({lo})", hi)
        if self.method == DRAFT_MODEL:
            check(isinstance(self.model, str) and self.model != "", key("model"),
                  "the draft checkpoint's path (method draft_model)", self.model)
        check(isinstance(self.dynamic, bool), key("dynamic"), "true or false", self.dynamic)
        check(isinstance(self.memory, bool), key("memory"), "true or false", self.memory)

    @classmethod
    def from_vllm(cls, d: Mapping[str, Any]) -> "SpeculativeConfig":
        """vLLM's ``speculative_config`` dict. ValidationError for unknown keys or bad values."""
        check(isinstance(d, Mapping), "speculative_config", "a dict", type(d).__name__)
        _refuse_unknown("speculative_config", d, _VLLM_KEYS)
        method = d.get("method", NGRAM if "model" not in d else DRAFT_MODEL)
        cfg = cls(method=method, num_speculative_tokens=d.get("num_speculative_tokens", 4),
                  prompt_lookup_max=d.get("prompt_lookup_max", 4), prompt_lookup_min=d.get("prompt_lookup_min", 1),
                  model=d.get("model"), dynamic=d.get("dynamic", True), memory=d.get("memory", True))
        cfg.validate()
        return cfg

    @classmethod
    def from_plugin_params(cls, raw: str, gamma: int | None, key: str = "plugin_params") -> "SpeculativeConfig | None":
        """MindIE's ``ModelConfig.plugin_params`` (a JSON string; "" = none) and ``speculationGamma``."""
        if raw is None or raw.strip() == "":
            return None
        try:
            d = json.loads(raw)
        except ValueError as exc:
            raise ValidationError(f"{key} must be a JSON-encoded object, got {raw!r} ({exc})") from None
        check(isinstance(d, dict), key, "a JSON-encoded object", raw)
        ptype = d.get("plugin_type")
        check(ptype in ("memory_decoding", DRAFT_MODEL), f"{key}.plugin_type",
              "memory_decoding or draft_model (lookahead, 'la', is not supported)", ptype)
        _refuse_unknown(key, d, _PLUGIN_KEYS)
        k = d.get("decoding_length", MAX_SPECULATIVE_TOKENS)
        if gamma is not None and isinstance(k, int):
            check(isinstance(k, int) and gamma >= k, "speculationGamma", f">= {key}.decoding_length ({k})", gamma)
        cfg = cls(method=NGRAM if ptype == "memory_decoding" else DRAFT_MODEL, num_speculative_tokens=k,
                  prompt_lookup_max=d.get("prompt_lookup_max", 4), prompt_lookup_min=d.get("prompt_lookup_min", 1),
                  model=d.get("draft_model_path"), dynamic=d.get("dynamic_algo", False),
                  memory=d.get("memory", ptype == "memory_decoding"))
        cfg.validate(key, {"num_speculative_tokens": "decoding_length", "model": "draft_model_path",
                           "dynamic": "dynamic_algo"})
        return cfg


def as_speculative_config(v: Any) -> SpeculativeConfig | None:
    """EngineConfig.speculative_config from what a caller passed: None, a SpeculativeConfig, or vLLM's dict."""
    if v is None or isinstance(v, SpeculativeConfig):
        return v
    return SpeculativeConfig.from_vllm(v)


def _refuse_unknown(where: str, d: Mapping[str, Any], known: set[str]) -> None:
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValidationError(f"{where}: unknown key(s) {unknown}; the known keys are {sorted(known)} "
                              f"(an unknown key is refused rather than ignored, so a typo cannot silently "
                              f"change how speculation runs)")
