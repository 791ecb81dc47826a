"""vLLM's tokenizer routes: ``POST /tokenize``, ``POST /detokenize``, ``GET /tokenizer_info``.

Bodies and answers in vLLM's shapes (vllm/entrypoints/openai/protocol.py: TokenizeCompletionRequest,
TokenizeChatRequest, TokenizeResponse, DetokenizeRequest, DetokenizeResponse, TokenizerInfoResponse), so that
clients written for vLLM (lm-eval's ``tokenizer_backend=remote``) tokenize with the served model's own
tokenizer and need no tokenizer folder. ``model`` is optional (the default model)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mindie_service.errors import ValidationError, check
from mindie_service.inputs.types import ChatMessage
from mindie_service.params.keep_alive import OPENAPI_SCHEMA as KEEP_ALIVE
from mindie_service.protocol.openai import chat_messages
from mindie_service.protocol.reasoning_fields import template_kwargs
from mindie_service.protocol.tool_calls import parse_tools
from mindie_service.structured.tool_formats import detect
from multimodal import MediaPolicy

MAX_TOKENS_IN = 1 << 20  # ids one /detokenize takes
_ROLES = ("system", "developer", "user", "assistant", "tool")
_COMPLETION = frozenset({"model", "prompt", "add_special_tokens", "return_token_strs"})
_CHAT = frozenset({"model", "messages", "add_generation_prompt", "add_special_tokens", "return_token_strs",
                   "continue_final_message", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs"})


@dataclass(frozen=True)
class TokenizeRequest:
    """A text (``prompt``) or a conversation (``messages``, rendered by the model's chat template)."""

    model: str | None
    prompt: str | None = None
    messages: tuple[ChatMessage, ...] = ()
    add_special_tokens: bool = True  # vLLM: True for a prompt, False for messages (the template writes them)
    add_generation_prompt: bool = True
    return_token_strs: bool = False
    tools: tuple[dict[str, Any], ...] = ()  # OpenAI's function tools, rendered as the chat route renders them
    template_kwargs: tuple[tuple[str, Any], ...] = ()  # vLLM's chat_template_kwargs (e.g. enable_thinking)


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    v = body.get(name, default)
    check(isinstance(v, bool), name, "a boolean", v)
    return v


def _model(body: dict[str, Any]) -> str | None:
    v = body.get("model")
    check(v is None or (isinstance(v, str) and 0 < len(v) <= 256), "model",
          "absent (the default model) or a model of /v1/models", v)
    return v


def _messages(body: dict[str, Any]) -> tuple[ChatMessage, ...]:
    """The chat route's messages (assistant ``tool_calls`` with ``content: null``, tool results), text only."""
    prompt = chat_messages(body, MediaPolicy())
    return prompt.messages


def parse_tokenize(body: dict[str, Any]) -> TokenizeRequest:
    """``{"prompt", "add_special_tokens"}`` or ``{"messages", "add_generation_prompt", ...}``."""
    chat = "messages" in body
    check(chat != ("prompt" in body), "prompt", "given, or messages instead (one of the two)", None)
    allowed = _CHAT if chat else _COMPLETION
    unknown = sorted(k for k in body if k not in allowed)
    if unknown:
        raise ValidationError(f"Parameter {unknown[0]} is not supported on /tokenize "
                              f"(it takes {', '.join(sorted(allowed))}), got {body[unknown[0]]!r}")
    strs = _flag(body, "return_token_strs", False)
    if chat:
        check(not _flag(body, "continue_final_message", False), "continue_final_message", "false", True)
        tools = parse_tools(body, detect(None))
        shown = tools.tools if tools is not None and tools.active else ()
        kw = tuple(sorted(template_kwargs(body.get("chat_template_kwargs")).items()))
        return TokenizeRequest(_model(body), messages=_messages(body), return_token_strs=strs, tools=shown,
                               template_kwargs=kw,
                               add_special_tokens=_flag(body, "add_special_tokens", False),
                               add_generation_prompt=_flag(body, "add_generation_prompt", True))
    prompt = body["prompt"]
    check(isinstance(prompt, str), "prompt", "a string", prompt)
    return TokenizeRequest(_model(body), prompt=prompt, return_token_strs=strs,
                           add_special_tokens=_flag(body, "add_special_tokens", True))


def parse_detokenize(body: dict[str, Any], vocab_size: int | None = None) -> tuple[str | None, list[int]]:
    """``{"tokens": [ids]}`` -> (model, ids); ids checked against the vocabulary when it is known."""
    unknown = sorted(k for k in body if k not in ("model", "tokens"))
    if unknown:
        raise ValidationError(f"Parameter {unknown[0]} is not supported on /detokenize (it takes model, tokens), "
                              f"got {body[unknown[0]]!r}")
    ids = body.get("tokens")
    check(isinstance(ids, list) and len(ids) <= MAX_TOKENS_IN
          and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids), "tokens",
          f"a list of at most {MAX_TOKENS_IN} token ids", ids if not isinstance(ids, list) else ids[:8])
    return _model(body), ids


def check_vocab(ids: list[int], vocab_size: int) -> None:
    bad = [t for t in ids if t >= vocab_size]
    check(not bad, "tokens", f"token ids in [0, {vocab_size})", bad[:8])


def tokenize_response(ids: list[int], max_model_len: int, token_strs: list[str] | None) -> dict[str, Any]:
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": token_strs}


def _token_str(tok: Any) -> str | None:
    if tok is None:
        return None
    return str(getattr(tok, "content", tok))


def tokenizer_info(tokenizer: Any, max_model_len: int, vocab_size: int) -> dict[str, Any]:
    """vLLM's TokenizerInfoResponse: the tokenizer's configuration as tokenizer_config.json spells it
    (``tokenizer_class``, the special tokens as strings, ``chat_template``, ``model_max_length``). Without a
    Hugging Face tokenizer (the StandardMock's bytes) the special tokens are null."""
    info: dict[str, Any] = {"tokenizer_class": type(tokenizer).__name__ if tokenizer is not None else "bytes"}
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        info[name] = _token_str(getattr(tokenizer, name, None)) if tokenizer is not None else None
    info["chat_template"] = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    info["model_max_length"] = max_model_len  # what the service takes (maxSeqLen), not the tokenizer's default
    info["vocab_size"] = vocab_size
    return info


_STR_OR_NULL = {"type": ["string", "null"]}
# The routes' schemas in /openapi.json (server/openapi.py).
OPENAPI_SCHEMAS: dict[str, Any] = {
    "TokenizeRequest": {"type": "object", "properties": {
        "model": {"type": "string"}, "prompt": {"type": "string"},
        "messages": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["role", "content"], "properties": {
                "role": {"enum": list(_ROLES)}, "content": {"oneOf": [{"type": "string"}, {"type": "array"}]}}}},
        "add_special_tokens": {"type": "boolean"}, "add_generation_prompt": {"type": "boolean"},
        "return_token_strs": {"type": "boolean"}, "keep_alive": KEEP_ALIVE},
        "description": "vLLM's TokenizeCompletionRequest ({prompt}) or TokenizeChatRequest ({messages}); Ollama's "
                       "keep_alive beside them."},
    "TokenizeResponse": {"type": "object", "required": ["count", "max_model_len", "tokens"], "properties": {
        "count": {"type": "integer"}, "max_model_len": {"type": "integer"},
        "tokens": {"type": "array", "items": {"type": "integer"}},
        "token_strs": {"type": ["array", "null"], "items": {"type": "string"}}}},
    "DetokenizeRequest": {"type": "object", "required": ["tokens"], "properties": {
        "model": {"type": "string"}, "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "keep_alive": KEEP_ALIVE}},
    "DetokenizeResponse": {"type": "object", "required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
    "TokenizerInfoResponse": {"type": "object", "required": ["tokenizer_class", "eos_token"], "properties": {
        "tokenizer_class": {"type": "string"}, "bos_token": _STR_OR_NULL, "eos_token": _STR_OR_NULL,
        "pad_token": _STR_OR_NULL, "unk_token": _STR_OR_NULL, "chat_template": _STR_OR_NULL,
        "model_max_length": {"type": "integer"}, "vocab_size": {"type": "integer"}},
        "description": "vLLM's TokenizerInfoResponse: the tokenizer's configuration."},
}
OPENAPI_SHAPES: dict[str, dict[str, tuple[str | None, str | None]]] = {
    "/tokenize": {"post": ("TokenizeRequest", "TokenizeResponse")},
    "/detokenize": {"post": ("DetokenizeRequest", "DetokenizeResponse")},
    "/tokenizer_info": {"get": (None, "TokenizerInfoResponse")},
}
