"""The pooling dialects (protocol/pooling_api.py): OpenAI's embeddings input forms and base64 (OpenAI's bytes:
little-endian float32), Jina / Cohere rerank (sorted, top_n, documents as given), vLLM's score (one to many, pairs),
and every refusal naming its field."""
from __future__ import annotations

import base64

import numpy as np
import pytest

from mindie_service.errors import ValidationError
from mindie_service.protocol.pooling_api import (embeddings_answer, parse_embeddings, parse_rerank, parse_score,
                                                 rerank_answer, score_answer)


def test_embeddings_input_forms():
    assert parse_embeddings({"model": "m", "input": "a"}).items == ["a"]
    assert parse_embeddings({"model": "m", "input": ["a", "b"]}).items == ["a", "b"]
    assert parse_embeddings({"model": "m", "input": [1, 2, 3]}).items == [[1, 2, 3]]
    call = parse_embeddings({"model": "m", "input": [[1], [2, 3]], "dimensions": 8, "encoding_format": "base64",
                             "user": "u"})
    assert call.items == [[1], [2, 3]] and call.dimensions == 8 and call.encoding_format == "base64"
    assert call.task == "embed" and not call.pairs


@pytest.mark.parametrize("body, field", [
    ({"input": "a"}, "model"), ({"model": "m", "input": []}, "input"), ({"model": "m", "input": [[]]}, "input"),
    ({"model": "m", "input": ["a", [1]]}, "input"), ({"model": "m", "input": [True]}, "input"),
    ({"model": "m", "input": "a", "dimensions": 0}, "dimensions"),
    ({"model": "m", "input": "a", "dimensions": True}, "dimensions"),
    ({"model": "m", "input": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"model": "m", "input": "a", "truncate": 3}, "truncate")])
def test_embeddings_refusals_name_the_field(body, field):
    with pytest.raises(ValidationError, match=f"Parameter {field}"):
        parse_embeddings(body)


def test_embeddings_answer_float_and_base64():
    vecs = [[0.5, -1.25, 3.0e-8], [1.0, 2.0, 3.0]]
    call = parse_embeddings({"model": "m", "input": ["a", "b"]})
    out = embeddings_answer(call, vecs, 7)
    assert out["data"][1] == {"object": "embedding", "index": 1, "embedding": vecs[1]}
    assert out["usage"] == {"prompt_tokens": 7, "total_tokens": 7} and out["object"] == "list"
    b64 = embeddings_answer(parse_embeddings({"model": "m", "input": ["a", "b"], "encoding_format": "base64"}),
                            vecs, 7)
    raw = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in b64["data"]]
    assert np.array_equal(np.stack(raw), np.array(vecs, dtype=np.float32))


def test_rerank_sorted_top_n_and_documents_as_given():
    docs = ["d0", {"text": "d1", "id": 7}, "d2"]
    call = parse_rerank({"model": "m", "query": "q", "documents": docs, "top_n": 2})
    assert call.items == [("q", "d0"), ("q", "d1"), ("q", "d2")] and call.pairs and call.task == "score"
    out = rerank_answer(call, "r", [0.2, 0.9, 0.5], 11)
    assert [(r["index"], r["relevance_score"]) for r in out["results"]] == [(1, 0.9), (2, 0.5)]
    assert out["results"][0]["document"] == {"text": "d1", "id": 7} and out["results"][1]["document"] == {"text": "d2"}
    bare = rerank_answer(parse_rerank({"model": "m", "query": "q", "documents": docs, "return_documents": False}),
                         "r", [0.2, 0.9, 0.5], 11)
    assert len(bare["results"]) == 3 and all("document" not in r for r in bare["results"])
    for body, field in (({"model": "m", "query": "", "documents": ["a"]}, "query"),
                        ({"model": "m", "query": "q", "documents": []}, "documents"),
                        ({"model": "m", "query": "q", "documents": [""]}, "documents\\[0\\]"),
                        ({"model": "m", "query": "q", "documents": ["a"], "top_n": 0}, "top_n")):
        with pytest.raises(ValidationError, match=f"Parameter {field}"):
            parse_rerank(body)


def test_score_one_to_many_pairs_and_mismatch():
    assert parse_score({"model": "m", "text_1": "q", "text_2": ["a", "b"]}).items == [("q", "a"), ("q", "b")]
    assert parse_score({"model": "m", "text_1": ["x", "y"], "text_2": ["a", "b"]}).items == [("x", "a"), ("y", "b")]
    with pytest.raises(ValidationError, match="Parameter text_1"):
        parse_score({"model": "m", "text_1": ["x", "y"], "text_2": ["a", "b", "c"]})
    with pytest.raises(ValidationError, match="Parameter text_2"):
        parse_score({"model": "m", "text_1": "x", "text_2": []})
    out = score_answer(parse_score({"model": "m", "text_1": "q", "text_2": ["a", "b"]}), "r", 5, [0.25, 0.75], 9)
    assert [d["score"] for d in out["data"]] == [0.25, 0.75] and out["usage"]["prompt_tokens"] == 9
