"""/v1/embeddings, /rerank, /v1/rerank and /score against a live server holding three models: the tiny causal LM
(generates and embeds, last token; Matryoshka widths from its ModelConfig.pooling), a random-weight
sentence-transformers encoder (embeds only) and a random-weight one-label LlamaForSequenceClassification (scores
only). The pinned `openai` client's embeddings.create, float and base64, matches sentence-transformers; rerank and
score match transformers; each route refuses the wrong kind of model with a 400 in OpenAI's shape; /v1/models
says what each model serves."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import openai
import pytest
import torch

from tests.pooling_models import build_scorer, build_st_model
from tests.server_utils import ServerProcess, shared_server, wait_until, write_config

pytestmark = pytest.mark.slow

TEXTS = ["River mountain city garden", "a short one", "The quick brown fox jumps over the lazy dog."]
DOCS = ["water that flows to the sea", "a city garden", {"text": "mountains and rivers"}]


@pytest.fixture(scope="module")
def folders(tiny_model, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pool-models")
    return {"st": build_st_model(root / "st", tiny_model, "mean", normalize=True),
            "sc": build_scorer(root / "sc", tiny_model)}


@pytest.fixture(scope="module")
def srv(request, tiny_model, folders) -> ServerProcess:
    def make(tmp: Path) -> ServerProcess:
        cfg = write_config(tmp / "config.json", tiny_model)
        raw = json.loads(cfg.read_text())
        models = raw["BackendConfig"]["ModelDeployConfig"]["ModelConfig"]
        models[0]["pooling"] = {"matryoshkaDimensions": [64]}
        models += [{"modelName": "st", "modelWeightPath": str(folders["st"])},
                   {"modelName": "sc", "modelWeightPath": str(folders["sc"])}]
        cfg.write_text(json.dumps(raw))
        return ServerProcess(cfg, tmp / "server.log")
    srv = shared_server("pooling", request, make)
    # /health is green with the default model; the other ModelConfig entries finish starting (and warming up)
    assert wait_until(lambda: {m["id"]: m["state"] for m in srv.get("/v1/models").json()["data"]}
                      == {"tiny": "running", "st": "running", "sc": "running"}, timeout=120), srv.log()
    return srv


@pytest.fixture(scope="module")
def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url() + "/v1", api_key="none", max_retries=0)


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def test_openai_client_embeddings_float_and_base64_match_sentence_transformers(client, folders):
    from sentence_transformers import SentenceTransformer
    want = SentenceTransformer(str(folders["st"]), device="cpu").encode(TEXTS)
    r = client.embeddings.create(model="st", input=TEXTS, encoding_format="float")
    got = np.array([d.embedding for d in r.data])
    assert [d.index for d in r.data] == [0, 1, 2] and r.model == "st"
    assert (1 - _cos(got, want)).max() < 1e-4
    assert r.usage.prompt_tokens == r.usage.total_tokens > len(TEXTS)
    b64 = client.embeddings.create(model="st", input=TEXTS, encoding_format="base64")  # asked for: left as sent
    raw = np.stack([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in b64.data])
    assert np.array_equal(raw, got.astype(np.float32))
    one = client.embeddings.create(model="st", input=TEXTS[0])  # the client's default: base64 on the wire, decoded
    assert np.array_equal(np.array(one.data[0].embedding, dtype=np.float32), raw[0])


def test_token_id_inputs_and_matryoshka_dimensions(srv, client, tiny_model):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    ids = [tok(t).input_ids for t in TEXTS]
    by_text = np.array([d.embedding for d in client.embeddings.create(model="tiny", input=TEXTS).data])
    by_ids = np.array([d.embedding for d in client.embeddings.create(model="tiny", input=ids).data])
    one = client.embeddings.create(model="tiny", input=ids[1]).data[0].embedding
    assert np.allclose(by_text, by_ids, atol=1e-6) and np.allclose(one, by_ids[1], atol=1e-6)
    cut = np.array([d.embedding for d in client.embeddings.create(model="tiny", input=TEXTS, dimensions=64).data])
    assert cut.shape == (3, 64)
    assert np.allclose(cut, by_text[:, :64] / np.linalg.norm(by_text[:, :64], axis=-1, keepdims=True), atol=1e-5)
    for body, msg in ((dict(model="tiny", input="x", dimensions=32), "one of [64]"),
                      (dict(model="st", input="x", dimensions=32), "Matryoshka"),
                      (dict(model="st", input=[[5, 99999]]), "token ids in [0, 2048)"),
                      (dict(model="st", input=[]), "Parameter input must be"),
                      (dict(model="st", input="x", encoding_format="int8"), "encoding_format"),
                      (dict(model="st", input="x", extra=1), "extra is not supported")):
        r = srv.post("/v1/embeddings", body)
        assert r.status_code == 400 and msg in r.json()["error"]["message"], (body, r.text)


def test_rerank_and_score_match_transformers(srv, folders):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(folders["sc"]))
    model = AutoModelForSequenceClassification.from_pretrained(str(folders["sc"]), dtype=torch.float32).eval()
    q = "what is a river"
    texts = [d if isinstance(d, str) else d["text"] for d in DOCS]
    with torch.no_grad():
        want = [torch.sigmoid(model(**tok(q, text_pair=t, return_tensors="pt")).logits[0, 0]).item() for t in texts]
    for path in ("/rerank", "/v1/rerank"):
        r = srv.post(path, {"model": "sc", "query": q, "documents": DOCS, "top_n": 2})
        assert r.status_code == 200, r.text
        res = r.json()["results"]
        order = sorted(range(3), key=lambda k: -want[k])[:2]
        assert [x["index"] for x in res] == order
        assert [x["relevance_score"] for x in res] == pytest.approx([want[k] for k in order], abs=1e-5)
        assert res[0]["document"] == (DOCS[order[0]] if isinstance(DOCS[order[0]], dict) else {"text": DOCS[order[0]]})
    r = srv.post("/rerank", {"model": "sc", "query": q, "documents": DOCS, "return_documents": False}).json()
    assert len(r["results"]) == 3 and all("document" not in x for x in r["results"])
    s = srv.post("/score", {"model": "sc", "text_1": q, "text_2": texts})
    assert s.status_code == 200, s.text
    assert [d["score"] for d in s.json()["data"]] == pytest.approx(want, abs=1e-5)
    pairs = srv.post("/score", {"model": "sc", "text_1": [q, q], "text_2": texts[:2]}).json()
    assert [d["score"] for d in pairs["data"]] == pytest.approx(want[:2], abs=1e-5)
    bad = srv.post("/score", {"model": "sc", "text_1": [q, q], "text_2": texts})
    assert bad.status_code == 400 and "text_1" in bad.json()["error"]["message"]


def test_each_route_refuses_the_wrong_kind_of_model(srv):
    cases = [("/v1/rerank", {"model": "tiny", "query": "q", "documents": ["d"]}, "LlamaForSequenceClassification"),
             ("/score", {"model": "st", "text_1": "q", "text_2": "d"}, "LlamaForSequenceClassification"),
             ("/v1/embeddings", {"model": "sc", "input": "x"}, "sentence-transformers"),
             ("/v1/chat/completions", {"model": "sc", "messages": [{"role": "user", "content": "hi"}]},
              "LlamaForCausalLM"),
             ("/v1/completions", {"model": "st", "prompt": "hi", "max_tokens": 2}, "LlamaForCausalLM")]
    for path, body, names in cases:
        r = srv.post(path, body)
        err = r.json()["error"]
        assert r.status_code == 400 and err["type"] == "invalid_request_error", (path, r.text)
        assert "does not serve" in err["message"] and names in err["message"], (path, err)
    ok = srv.post("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200  # the causal LM still generates


def test_models_list_what_each_serves(srv):
    data = {m["id"]: m for m in srv.get("/v1/models").json()["data"]}
    assert data["tiny"]["tasks"] == ["embed", "generate"] and data["st"]["tasks"] == ["embed"]
    assert data["sc"]["tasks"] == ["score"]
    assert data["st"]["pooling"] == {"pooling": "mean", "normalize": True, "matryoshka_dimensions": False}
    assert data["tiny"]["pooling"]["matryoshka_dimensions"] == [64] and "pooling" not in data["sc"]
    doc = srv.get("/openapi.json").json()
    assert {"/v1/embeddings", "/rerank", "/v1/rerank", "/score"} <= set(doc["paths"])
