"""Issue #16, item 2 on POST /v1/tokenizer: a text longer than the model's whole context could hold
(maxSeqLen tokens of this tokenizer's longest token) is refused before it is tokenized (before this
bound, a 1 MB text was tokenized and answered 200)."""
from __future__ import annotations

import pytest

from tests.server_utils import plain_server


@pytest.fixture(scope="module")
def srv(request, tiny_model):
    return plain_server(request, tiny_model)


def test_tokenizer_route_refuses_a_text_no_context_could_hold(srv):
    ok = srv.post("/v1/tokenizer", {"inputs": "River mountain city"})
    assert ok.status_code == 200 and ok.json()["token_number"] == len(ok.json()["tokens"]) > 0
    huge = "word " * 200_000  # 1 MB: within the body cap, far beyond maxSeqLen (512) tokens of any vocabulary
    r = srv.post("/v1/tokenizer", {"inputs": huge})
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert "maxSeqLen" in err and "characters" in err
    # The route still answers at once afterwards (nothing was left tokenizing).
    assert srv.post("/v1/tokenizer", {"inputs": "River"}).status_code == 200
