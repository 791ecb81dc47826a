"""Response encoders: one per API family, one interface (complete body, stream frames, error frame).

`/` speaks MindIE's shapes (a one-element list; stream ids as lists unless configured otherwise);
`/generate` and `/generate_stream` speak TGI 1.1's. Unlike MindIE, logprob/special/text are real.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mindie_service.engine.contract import TokenEvent, TokenInfo
from mindie_service.errors import MindieError
from mindie_service.protocol.request import GenerationRequest, GenerationResult, select_best


def _dumps(obj: Any) -> str:
    # allow_nan=False: NaN and Infinity are not JSON (strict parsers reject the whole frame); the sampler
    # floors logprobs at -9999.0 and fails requests with non-finite logits, so this never fires in service.
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def sse(obj: Any, prefix: str = "data: ") -> bytes:
    """One Server-Sent Events frame: ``data: {json}`` and a blank line."""
    return f"{prefix}{_dumps(obj)}\n\n".encode()


def token_json(t: TokenInfo, *, text: str | None = None, list_id: bool = False) -> dict[str, Any]:
    return {"id": [t.id] if list_id else t.id, "text": t.text if text is None else text,
            "logprob": t.logprob, "special": t.special}


def prefill_json(t: TokenInfo, *, with_special: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"id": t.id, "text": t.text, "logprob": t.logprob}
    if with_special:
        out["special"] = t.special
    return out


def top_tokens_json(t: TokenInfo) -> list[dict[str, Any]]:
    return [token_json(a) for a in t.top]


@dataclass
class StreamState:
    """What a stream has sent so far (for fullTextEnabled and the final frame)."""

    text: str = ""
    count: int = 0
    index: int = 0  # which sample (OpenAI: which choice) this stream carries
    tool_parser: Any = None  # OpenAI chat with tools: the choice's protocol.tool_parser.ToolCallParser
    dialect: Any = None  # a dialect's own stream state (Anthropic's content blocks: anthropic_encoder.BlockBuilder)


class Encoder:
    """Shared shape of both families; subclasses fill the differences."""

    sse_prefix = "data: "
    mindie = False  # MindIE `/` shapes (prompt_tokens count, prefill with `special`)

    def __init__(self, *, full_text: bool = False, list_ids: bool = False) -> None:
        self.full_text = full_text
        self.list_ids = list_ids

    # -- non-stream ------------------------------------------------------------------------------
    def _details(self, req: GenerationRequest, r: GenerationResult) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if self.mindie:
            d["prompt_tokens"] = r.num_prompt_tokens
        d["finish_reason"] = r.finish_reason
        d["generated_tokens"] = len(r.tokens)
        want_prefill = req.decoder_input_details or (self.mindie and req.details)
        d["prefill"] = [prefill_json(t, with_special=self.mindie) for t in r.prompt_tokens] if want_prefill else []
        d["seed"] = r.seed if (req.sampling or self.mindie) else None
        d["tokens"] = [token_json(t) for t in r.tokens]
        if req.top_n_tokens:
            d["top_tokens"] = [top_tokens_json(t) for t in r.tokens]
        return d

    def complete_one(self, req: GenerationRequest, results: list[GenerationResult]) -> dict[str, Any]:
        best, others = select_best(results) if len(results) > 1 else (results[0], [])
        out: dict[str, Any] = {"generated_text": req.prefix + best.text}
        if req.details:
            d = self._details(req, best)
            if req.best_of > 1:
                seqs = []
                for r in others:
                    s = self._details(req, r)
                    s.pop("prompt_tokens", None)
                    seqs.append({"generated_text": req.prefix + r.text, **s})
                d["best_of_sequences"] = seqs
            out["details"] = d
        return out

    def complete(self, req: GenerationRequest, results: list[GenerationResult]) -> Any:
        raise NotImplementedError

    # -- stream ----------------------------------------------------------------------------------
    def stream_frame(self, req: GenerationRequest, ev: TokenEvent, result: GenerationResult,
                     state: StreamState) -> bytes:
        """The frame for ``ev`` (``result`` already holds it)."""
        state.text += ev.text_delta
        state.count += 1
        text = state.text if self.full_text else ev.text_delta
        frame: dict[str, Any] = {"token": token_json(ev.token, text=text, list_id=self.list_ids)}
        if req.top_n_tokens:
            frame["top_tokens"] = top_tokens_json(ev.token)
        frame["generated_text"] = None
        frame["details"] = None
        if ev.finish_reason is not None:
            frame["generated_text"] = req.prefix + result.text
            if req.details:
                d: dict[str, Any] = {}
                if self.mindie:
                    d["prompt_tokens"] = result.num_prompt_tokens
                d["finish_reason"] = ev.finish_reason
                d["generated_tokens"] = len(result.tokens)
                d["seed"] = result.seed if (req.sampling or self.mindie) else None
                frame["details"] = d
        return sse(frame, self.sse_prefix)

    def stream_start(self, req: GenerationRequest, n_samples: int, first: GenerationResult | None = None) -> bytes:
        """Sent before the first frame (OpenAI chat: the role chunk); nothing for MindIE and TGI. ``first``: the
        result the first token began (its prompt's token count)."""
        return b""

    def stream_end(self, req: GenerationRequest, results: list[GenerationResult]) -> bytes:
        """Sent after the last frame (OpenAI: the usage chunk and ``data: [DONE]``); nothing for MindIE and TGI."""
        return b""

    def stream_error(self, err: MindieError) -> bytes:
        return sse(self.error_json(err), self.sse_prefix)

    def error_json(self, err: MindieError) -> dict[str, Any]:
        """The error body of this API family (``{"error", "error_type"}`` for MindIE and TGI)."""
        return err.to_json()


class MindieEncoder(Encoder):
    """`/`: ``[{"generated_text", "details"?}]``; stream ids are lists unless ``list_ids`` is False
    (ServerConfig.streamTokenIdFormat = "int", which TGI's client needs)."""

    mindie = True

    def __init__(self, *, full_text: bool = False, list_ids: bool = True) -> None:
        super().__init__(full_text=full_text, list_ids=list_ids)

    def complete(self, req: GenerationRequest, results: list[GenerationResult]) -> Any:
        return [self.complete_one(req, results)]


class TgiEncoder(Encoder):
    """`/generate` (one object) and `/generate_stream` (integer ids, ``data:`` frames like TGI's)."""

    sse_prefix = "data:"

    def __init__(self) -> None:
        super().__init__(full_text=False, list_ids=False)

    def complete(self, req: GenerationRequest, results: list[GenerationResult]) -> Any:
        return self.complete_one(req, results)
