"""The pooling dialects: OpenAI's ``/v1/embeddings``, Jina / Cohere's rerank (``/rerank``, ``/v1/rerank``) and
vLLM's ``/score``. Each body -> a neutral ``PoolCall`` (the texts or token ids to run, the task), and the engine's
vectors -> the route's answer. Errors are rendered in OpenAI's shape by the handlers (as vLLM does for all three)."""
from __future__ import annotations

import base64
import struct
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from mindie_service.errors import ValidationError, check
from mindie_service.protocol.openai import peek_model

Task = Literal["embed", "score"]
MAX_INPUTS = 2048  # OpenAI's bound on one embeddings call's inputs (and on a rerank call's documents)


@dataclass(frozen=True)
class PoolCall:
    """One call: ``items`` (texts or token-id lists; for a score, (text_1, text_2) pairs) run as one request."""

    model: str
    task: Task
    items: Sequence[Any]
    pairs: bool = False  # items are (query, document) pairs (rerank, score)
    dimensions: int | None = None
    encoding_format: str = "float"
    top_n: int | None = None
    return_documents: bool = True
    documents: Sequence[Any] = field(default_factory=tuple)  # rerank: the documents as given (returned as given)


def _known(body: dict[str, Any], allowed: set[str], route: str) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:  # never accepted and ignored
        raise ValidationError(f"Parameter {unknown[0]} is not supported by {route} (fields: {sorted(allowed)})")


def _is_ids(v: Any) -> bool:
    return isinstance(v, list) and len(v) > 0 and all(isinstance(t, int) and not isinstance(t, bool) for t in v)


def parse_embeddings(body: dict[str, Any]) -> PoolCall:
    """OpenAI's CreateEmbeddingRequest: ``input`` a string, a list of strings, a list of token ids, or a list of
    token-id lists; ``encoding_format`` float | base64; ``dimensions``; ``user`` (checked, used by nothing here, as on
    the chat route: an end-user id for the caller's own records)."""
    _known(body, {"model", "input", "encoding_format", "dimensions", "user"}, "/v1/embeddings")
    model = peek_model(body)
    raw = body.get("input")
    if isinstance(raw, str):
        items: list[Any] = [raw]
    elif _is_ids(raw):
        items = [raw]
    elif isinstance(raw, list) and raw and (all(isinstance(x, str) for x in raw) or all(_is_ids(x) for x in raw)):
        items = list(raw)
    else:
        raise ValidationError("Parameter input must be a string, a list of strings, a list of token ids or a list "
                              f"of token-id lists (none empty), got {type(raw).__name__}")
    check(len(items) <= MAX_INPUTS, "input", f"at most {MAX_INPUTS} inputs", len(items))
    fmt = body.get("encoding_format", "float")
    check(fmt in ("float", "base64"), "encoding_format", "one of float, base64", fmt)
    dims = body.get("dimensions")
    check(dims is None or (isinstance(dims, int) and not isinstance(dims, bool) and dims >= 1), "dimensions",
          "an integer >= 1", dims)
    user = body.get("user")
    check(user is None or isinstance(user, str), "user", "a string (an end-user id for the caller's records)", user)
    return PoolCall(model, "embed", items, dimensions=dims, encoding_format=fmt)


def _doc_text(d: Any, k: int) -> str:
    if isinstance(d, dict) and isinstance(d.get("text"), str):
        return d["text"]  # Cohere's {"text": ...} documents
    check(isinstance(d, str) and d != "", f"documents[{k}]", 'a non-empty string or {"text": ...}', d)
    return d


def parse_rerank(body: dict[str, Any]) -> PoolCall:
    """Jina / Cohere: ``query``, ``documents`` (strings or {"text"}), ``top_n``, ``return_documents``."""
    _known(body, {"model", "query", "documents", "top_n", "return_documents"}, "rerank")
    model = peek_model(body)
    q, docs = body.get("query"), body.get("documents")
    check(isinstance(q, str) and q != "", "query", "a non-empty string", q)
    check(isinstance(docs, list) and 0 < len(docs) <= MAX_INPUTS, "documents",
          f"a list of 1 to {MAX_INPUTS} documents", docs if not isinstance(docs, list) else len(docs))
    top_n = body.get("top_n")
    check(top_n is None or (isinstance(top_n, int) and not isinstance(top_n, bool) and top_n >= 1), "top_n",
          "an integer >= 1", top_n)
    ret = body.get("return_documents", True)
    check(isinstance(ret, bool), "return_documents", "a boolean", ret)
    items = [(q, _doc_text(d, k)) for k, d in enumerate(docs)]
    return PoolCall(model, "score", items, pairs=True, top_n=top_n, return_documents=ret, documents=docs)


def parse_score(body: dict[str, Any]) -> PoolCall:
    """vLLM's ``/score``: ``text_1`` and ``text_2``, each a string or a list; one to one, one to many (text_1
    a string), or many to many of the same length."""
    _known(body, {"model", "text_1", "text_2"}, "/score")
    model = peek_model(body)
    a, b = body.get("text_1"), body.get("text_2")
    la = [a] if isinstance(a, str) else a
    lb = [b] if isinstance(b, str) else b
    for name, v in (("text_1", la), ("text_2", lb)):
        check(isinstance(v, list) and 0 < len(v) <= MAX_INPUTS and all(isinstance(x, str) and x for x in v), name,
              f"a non-empty string or a list of 1 to {MAX_INPUTS} of them", v if not isinstance(v, list) else len(v))
    if len(la) == 1:
        la = la * len(lb)
    check(len(la) == len(lb), "text_1", f"one text or as many as text_2 ({len(lb)})", len(la))
    return PoolCall(model, "score", list(zip(la, lb)), pairs=True)


# -- answers -------------------------------------------------------------------------------------------
def _vector(v: list[float], fmt: str) -> list[float] | str:
    if fmt == "base64":  # little-endian float32, as OpenAI sends (its client decodes with numpy's frombuffer)
        return base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode("ascii")
    return v


def embeddings_answer(call: PoolCall, vectors: list[list[float]], prompt_tokens: int) -> dict[str, Any]:
    return {"object": "list", "model": call.model,
            "data": [{"object": "embedding", "index": k, "embedding": _vector(v, call.encoding_format)}
                     for k, v in enumerate(vectors)],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}


def rerank_answer(call: PoolCall, rid: str, scores: list[float], prompt_tokens: int) -> dict[str, Any]:
    """Jina's shape (vLLM's too): results sorted by relevance, ``top_n`` of them, documents as given."""
    order = sorted(range(len(scores)), key=lambda k: -scores[k])[:call.top_n or len(scores)]
    results = []
    for k in order:
        r: dict[str, Any] = {"index": k, "relevance_score": scores[k]}
        if call.return_documents:
            d = call.documents[k]
            r["document"] = d if isinstance(d, dict) else {"text": d}
        results.append(r)
    return {"id": f"rerank-{rid}", "model": call.model, "results": results,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}


def score_answer(call: PoolCall, rid: str, created: int, scores: list[float], prompt_tokens: int) -> dict[str, Any]:
    """vLLM's ScoreResponse."""
    return {"id": f"score-{rid}", "object": "list", "created": created, "model": call.model,
            "data": [{"index": k, "object": "score", "score": s} for k, s in enumerate(scores)],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens, "completion_tokens": 0}}


# -- /openapi.json (server/openapi.py) -------------------------------------------------------------------
_OBJ_ANY = {"type": "object"}
_USAGE = {"type": "object", "required": ["prompt_tokens", "total_tokens"],
          "properties": {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}}}
_TEXTS = {"oneOf": [{"type": "string", "minLength": 1},
                    {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS, "items": {"type": "string", "minLength": 1}}]}
OPENAPI_SCHEMAS: dict[str, Any] = {
    "EmbeddingsRequest": {"type": "object", "required": ["model", "input"], "additionalProperties": False,
                          "properties": {
        "model": {"type": "string"},
        "input": {"oneOf": [_TEXTS, {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
                            {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS, "items": {
                                "type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}}]},
        "encoding_format": {"enum": ["float", "base64"],
                            "description": "base64: little-endian float32 bytes, as OpenAI sends"},
        "dimensions": {"type": "integer", "minimum": 1, "description": "Matryoshka truncation, renormalised; only "
                       "for a model whose config allows it (else 400)"},
        "user": {"type": "string"}},
        "description": "OpenAI's CreateEmbeddingRequest. Pooling follows the checkpoint (GET /v1/models/{id} "
                       "pooling): sentence-transformers' modules where present, else the last token."},
    "EmbeddingsResponse": {"type": "object", "required": ["object", "data", "model", "usage"], "properties": {
        "object": {"const": "list"}, "model": {"type": "string"}, "usage": _USAGE,
        "data": {"type": "array", "items": {"type": "object", "required": ["object", "index", "embedding"],
                                            "properties": {"object": {"const": "embedding"},
                                                           "index": {"type": "integer"},
                                                           "embedding": {"oneOf": [{"type": "array"},
                                                                                   {"type": "string"}]}}}}}},
    "RerankRequest": {"type": "object", "required": ["model", "query", "documents"], "additionalProperties": False,
                      "properties": {
        "model": {"type": "string"}, "query": {"type": "string", "minLength": 1},
        "documents": {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS, "items": {"oneOf": [
            {"type": "string", "minLength": 1}, {"type": "object", "required": ["text"]}]}},
        "top_n": {"type": "integer", "minimum": 1}, "return_documents": {"type": "boolean"}},
        "description": "Jina / Cohere rerank, for a one-label sequence-classification checkpoint (a cross-encoder)."},
    "RerankResponse": {"type": "object", "required": ["id", "model", "results", "usage"], "properties": {
        "id": {"type": "string"}, "model": {"type": "string"}, "usage": _USAGE,
        "results": {"type": "array", "items": {"type": "object", "required": ["index", "relevance_score"],
                                               "properties": {"index": {"type": "integer"},
                                                              "relevance_score": {"type": "number"},
                                                              "document": _OBJ_ANY}}}},
        "description": "Sorted by relevance_score (the sigmoid of the one-label head), top_n of them."},
    "ScoreRequest": {"type": "object", "required": ["model", "text_1", "text_2"], "additionalProperties": False,
                     "properties": {"model": {"type": "string"}, "text_1": _TEXTS, "text_2": _TEXTS},
                     "description": "vLLM's /score: one text_1 against each text_2, or pairs of equal lists."},
    "ScoreResponse": {"type": "object", "required": ["id", "object", "model", "data", "usage"], "properties": {
        "id": {"type": "string"}, "object": {"const": "list"}, "model": {"type": "string"}, "usage": _USAGE,
        "created": {"type": "integer"},
        "data": {"type": "array", "items": {"type": "object", "required": ["index", "score"], "properties": {
            "index": {"type": "integer"}, "object": {"const": "score"}, "score": {"type": "number"}}}}}},
}
OPENAPI_SHAPES: dict[str, dict[str, tuple[str | None, str | None]]] = {
    "/v1/embeddings": {"post": ("EmbeddingsRequest", "EmbeddingsResponse")},
    "/rerank": {"post": ("RerankRequest", "RerankResponse")},
    "/v1/rerank": {"post": ("RerankRequest", "RerankResponse")},
    "/score": {"post": ("ScoreRequest", "ScoreResponse")},
}
