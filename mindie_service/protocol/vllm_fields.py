"""vLLM's extra request fields on the OpenAI routes (vLLM's entrypoints/openai/protocol.py: the sampling block
of ChatCompletionRequest and CompletionRequest, and ``priority``), taken on every deployment, each with its
effect (``ServerConfig.openAiSupport`` only decides whether /info advertises them):

- ``top_k`` (-1 or 0: off), ``min_p``, ``repetition_penalty``, ``min_tokens``, ``ignore_eos``,
  ``stop_token_ids``: the SamplingParams of the same names;
- ``truncate_prompt_tokens``: keep the prompt's last N tokens (as TGI's ``truncate``);
- ``priority``: the scheduler's rank (params.priority: lower first);
- ``structured_outputs`` and the older ``guided_*``: structured output (structured.request_forms).

The others are accepted at vLLM's default, which is what this server does; any other value is refused by name
with the reason (``_AT_DEFAULT``)."""
from __future__ import annotations

from typing import Any

from mindie_service.errors import ValidationError, check
from mindie_service.params.defaults import RequestDefaults
from mindie_service.params.ranges import INT32_MAX
from mindie_service.params.rule import read_fields
from mindie_service.params.table import MAX_STOP_STRINGS, VLLM
from mindie_service.structured.request_forms import GUIDED

# field -> (vLLM's default values, the only ones honoured here; why another value is not)
_AT_DEFAULT: dict[str, tuple[tuple[Any, ...], str]] = {
    "use_beam_search": ((False,), "beam search is served on /api/generate-one (num_beams), not here"),
    "length_penalty": ((1.0, 1), "it weighs beam search's scores, and this route does not search beams"),
    "include_stop_str_in_output": ((False,), "the stop text is always cut from the output here"),
    "skip_special_tokens": ((True,), "special tokens are always left out of the text here"),
    "spaces_between_special_tokens": ((True,), "special tokens are always left out of the text here"),
    "prompt_logprobs": ((), "prompt logprobs are given by echo with logprobs on /v1/completions"),
    "allowed_token_ids": ((), "no token whitelist is applied here (structured_outputs.choice or a regex "
                              "constrains the output)"),
    "bad_words": (([],), "no word blacklist is applied here"),
}
SAMPLING = frozenset({"top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids",
                      "truncate_prompt_tokens"})
FIELDS = frozenset(SAMPLING | set(_AT_DEFAULT) | {"structured_outputs", *GUIDED})


def _token_ids(v: Any, vocab_size: int) -> tuple[int, ...]:
    if v is None:
        return ()
    check(isinstance(v, list) and len(v) <= MAX_STOP_STRINGS
          and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in v),
          "stop_token_ids", f"a list of at most {MAX_STOP_STRINGS} token ids in [0, {vocab_size})", v)
    return tuple(v)


def _at_default(body: dict[str, Any]) -> None:
    for name, (ok, why) in _AT_DEFAULT.items():
        v = body.get(name)
        if v is not None and not any(v == x and type(v) is type(x) for x in ok):
            allowed = ", ".join(repr(x) for x in ok) or "null"
            raise ValidationError(f"Parameter {name} must be absent or {allowed} ({why}), got {v!r}")


def read_vllm(body: dict[str, Any], defaults: RequestDefaults, vocab_size: int) -> dict[str, Any]:
    """vLLM's sampling fields of ``body`` by their neutral names, top_k resolved against the model's default and
    the vocabulary; ``truncate`` is None unless truncate_prompt_tokens asks."""
    _at_default(body)
    v = read_fields(body, VLLM)
    top_k = v.get("top_k", defaults.top_k)
    if top_k is not None and (top_k <= 0 or top_k >= vocab_size):
        top_k = None  # -1 / 0 (Jan's "0") and the whole vocabulary mean off
    trunc = body.get("truncate_prompt_tokens")
    check(trunc is None or (type(trunc) is int and 1 <= trunc <= INT32_MAX), "truncate_prompt_tokens",
          f"an integer in [1, {INT32_MAX}] (the prompt's last N tokens are kept)", trunc)
    return {"top_k": top_k, "repetition_penalty": v.get("repetition_penalty") or defaults.repetition_penalty or 1.0,
            "ignore_eos": v.get("ignore_eos", False), "min_tokens": v.get("min_tokens", 0),
            "min_p": v.get("min_p", defaults.min_p or 0.0), "stop_token_ids": _token_ids(body.get("stop_token_ids"), vocab_size),
            "truncate": trunc}


def advertised_fields(support: str) -> dict[str, Any]:
    """What /info says of the OpenAI routes (ServerConfig.openAiSupport): the dialect, and with "vllm" the
    vLLM fields they take (they take them whatever the setting)."""
    out: dict[str, Any] = {"openai_support": support}
    if support == "vllm":
        out["vllm_request_fields"] = sorted(FIELDS | {"priority", "stream_options.continuous_usage_stats"})
    return out
