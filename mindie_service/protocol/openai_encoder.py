"""OpenAI's response shapes for /v1/completions and /v1/chat/completions: bodies, SSE chunks ending with
``data: [DONE]`` (with ``stream_options.include_usage`` a last chunk holding ``usage`` and no choices; with
vLLM's ``continuous_usage_stats`` each token's chunk holds its choice's usage so far, as vLLM's do), and
the error object ``{"error": {"message", "type", "param", "code"}}``."""
from __future__ import annotations

import re
import secrets
from typing import Any

from mindie_service.engine.contract import FINISH_LENGTH, TokenEvent, TokenInfo
from mindie_service.errors import MindieError
from mindie_service.protocol.completion_scoring import choice_tokens, completion_count, completion_logprobs
from mindie_service.protocol.encoders import Encoder, StreamState, sse
from mindie_service.protocol.request import GenerationRequest, GenerationResult
from mindie_service.protocol import tool_response
from mindie_service.protocol.openai import OpenAIRequest

DONE = b"data: [DONE]\n\n"
_PARAM = re.compile(r"^Parameter ([A-Za-z0-9_.\[\]]+) ")
# status -> OpenAI's error type (any other 4xx: invalid_request_error, 405 included; 5xx: server_error)
_TYPES = {401: "authentication_error", 403: "permission_error", 424: "server_error", 429: "rate_limit_error",
          503: "service_unavailable_error"}  # 424: the engine failed this request (our fault, not the client's)


def finish_reason(reason: str | None) -> str | None:
    """Ours -> OpenAI's: eos_token and stop_sequence are "stop"."""
    if reason is None:
        return None
    return "length" if reason == FINISH_LENGTH else "stop"


def openai_error(err: MindieError) -> tuple[int, dict[str, Any]]:
    """(status, body): a bad value is a 400 as on OpenAI (our 422); every other status stays."""
    status = 400 if err.status == 422 else err.status
    m = _PARAM.match(err.message)
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return status, {"error": {"message": err.message, "type": kind, "param": m.group(1) if m else None,
                              "code": getattr(err, "code", None) or err.error_type}}


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8", errors="replace"))


def obfuscation() -> str:
    """OpenAI's stream padding (``include_obfuscation``): 1 to 16 random characters, so a frame's size tells
    nothing of its text. Chat chunks and Responses delta events both carry it."""
    return secrets.token_urlsafe(12)[:1 + secrets.randbelow(16)]


class OpenAIEncoder(Encoder):
    """One instance per process; the request says which route (completion or chat) it answers."""

    def __init__(self) -> None:
        super().__init__(full_text=False, list_ids=False)

    # -- pieces ----------------------------------------------------------------------------------
    @staticmethod
    def _ids(req: OpenAIRequest, rid: str) -> dict[str, Any]:
        chat = req.kind == "chat"
        return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{rid}",
                "object": "chat.completion.chunk" if chat and req.stream else
                ("chat.completion" if chat else "text_completion"),
                "created": req.created, "model": req.model}

    @staticmethod
    def _chat_logprobs(tokens: list[TokenInfo], k: int) -> dict[str, Any]:
        return {"content": [{"token": t.text, "logprob": t.logprob, "bytes": _bytes(t.text),
                             "top_logprobs": [{"token": a.text, "logprob": a.logprob, "bytes": _bytes(a.text)}
                                              for a in t.top[:k]]} for t in tokens], "refusal": None}

    @staticmethod
    def usage(req: OpenAIRequest, results: list[GenerationResult]) -> dict[str, int]:
        """Prompt tokens counted once per prompt (not per choice), completion tokens over every choice."""
        n = req.n
        prompt = sum(results[i].num_prompt_tokens for i in range(0, len(results), n))
        completion = sum(completion_count(r.tokens, req.score_only) for r in results)
        out: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                               "total_tokens": prompt + completion}
        if any(r.full_reasoning is not None for r in results):  # OpenAI's count of the thinking tokens
            out["completion_tokens_details"] = {"reasoning_tokens": sum(r.reasoning_tokens for r in results)}
        return out

    def _echo(self, req: OpenAIRequest, k: int, r: GenerationResult) -> str:
        p = req.prompts[k // req.n]
        return p.text if getattr(p, "text", "") else "".join(t.text for t in r.prompt_tokens)

    # -- non-stream ------------------------------------------------------------------------------
    def complete(self, req: GenerationRequest, results: list[GenerationResult]) -> Any:
        assert isinstance(req, OpenAIRequest)
        out = self._ids(req, req.request_id)
        choices = []
        for k, r in enumerate(results):
            fr = finish_reason(r.finish_reason)
            if req.kind == "chat":
                msg, fr = tool_response.message(req.tools, req.request_id, k, r.text, fr)
                if r.full_reasoning is not None:  # vLLM's field: the thinking apart from the answer
                    msg["reasoning_content"] = r.full_reasoning or None
                choices.append({"index": k, "message": msg,
                                "logprobs": (self._chat_logprobs(r.tokens, req.logprobs)
                                             if req.logprobs is not None else None), "finish_reason": fr})
                continue
            text = (self._echo(req, k, r) if req.echo else "") + ("" if req.score_only else r.text)
            lp = None
            if req.logprobs is not None:
                toks = choice_tokens(r.prompt_tokens, r.tokens, echo=req.echo, score_only=req.score_only)
                lp = completion_logprobs(toks, req.logprobs, text)
            choices.append({"index": k, "text": text, "logprobs": lp,
                            "finish_reason": "length" if req.score_only else fr})
        out["choices"] = choices
        out["usage"] = self.usage(req, results)
        return out

    # -- stream ----------------------------------------------------------------------------------
    def _chunk(self, req: OpenAIRequest, choices: list[dict[str, Any]],
               result: GenerationResult | None = None) -> bytes:
        body = {**self._ids(req, req.request_id), "choices": choices}
        if req.continuous_usage and result is not None:
            body["usage"] = self.usage(req, [result])  # this choice's tokens so far (vLLM's continuous usage)
        elif req.include_usage:
            body["usage"] = None
        if req.obfuscate:  # stream_options.include_obfuscation: random padding, so a chunk's size tells nothing
            body["obfuscation"] = obfuscation()
        return sse(body)

    def stream_start(self, req: GenerationRequest, n_samples: int, first: GenerationResult | None = None) -> bytes:
        assert isinstance(req, OpenAIRequest)
        if req.kind != "chat":
            return b""
        # vLLM's role chunk carries, with continuous usage, the prompt's usage and no completion tokens yet (its
        # serving_chat.py); a chat has one prompt, so every choice's prompt count is the first token's.
        prompt = GenerationResult(num_prompt_tokens=first.num_prompt_tokens) if first is not None else None
        return b"".join(self._chunk(req, [{"index": k, "delta": {"role": "assistant", "content": ""},
                                           "logprobs": None, "finish_reason": None}], prompt)
                        for k in range(n_samples))

    def stream_frame(self, req: GenerationRequest, ev: TokenEvent, result: GenerationResult,
                     state: StreamState) -> bytes:
        assert isinstance(req, OpenAIRequest)
        k = state.index
        delta = "" if req.score_only else ev.text_delta
        text = delta
        if req.kind == "completion" and req.echo and state.count == 0:
            text = self._echo(req, k, result) + text
        state.count += 1
        start = len(state.text)
        state.text += text
        fr = "length" if req.score_only and ev.finish_reason else finish_reason(ev.finish_reason)
        if req.kind == "chat":
            lp = self._chat_logprobs([ev.token], req.logprobs) if req.logprobs is not None else None
            choice: dict[str, Any] = {"index": k, "delta": {"content": text} if text or fr is None else {},
                                      "logprobs": lp, "finish_reason": fr}
            if req.tools is not None and req.tools.active:  # tool calls: content and calls from one parser
                state.tool_parser = state.tool_parser or tool_response.parser_for(req.tools, req.request_id, k)
                choice["delta"], choice["finish_reason"] = tool_response.stream_delta(
                    req.tools, state.tool_parser, text, fr)
                if not (choice["delta"] or ev.reasoning_delta) and choice["finish_reason"] is None and lp is None:
                    return b""  # a call marker held back: nothing to say yet (no run of empty deltas)
            if ev.reasoning_delta:  # vLLM's streamed thinking, before this token's answer text (if any)
                rest = {k: v for k, v in choice["delta"].items() if k != "content" or v}
                choice["delta"] = {"reasoning_content": ev.reasoning_delta, **rest}
        else:
            lp = None
            if req.logprobs is not None:
                toks = choice_tokens(result.prompt_tokens if state.count == 1 else [], [ev.token], echo=req.echo,
                                     score_only=req.score_only)
                lp = completion_logprobs(toks, req.logprobs, text, start)
            choice = {"index": k, "text": text, "logprobs": lp, "finish_reason": fr}
        return self._chunk(req, [choice], result)

    def stream_end(self, req: GenerationRequest, results: list[GenerationResult]) -> bytes:
        assert isinstance(req, OpenAIRequest)
        tail = b""
        if req.include_usage:
            tail = sse({**self._ids(req, req.request_id), "choices": [], "usage": self.usage(req, results)})
        return tail + DONE

    def stream_error(self, err: MindieError) -> bytes:
        return sse(self.error_json(err)) + DONE

    def error_json(self, err: MindieError) -> dict[str, Any]:
        return openai_error(err)[1]
