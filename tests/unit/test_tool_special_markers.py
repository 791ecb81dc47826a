"""Tool-call markers that the tokenizer holds as special tokens (Mistral's ``[TOOL_CALLS]``, Llama 3.x's
``<|python_tag|>``): the grammars name the token by id, so the model's one marker token is what is allowed
(forced where a call is required), its text stays in the output, and the calls parse; a tokenizer without
them keeps the spelled-out grammar."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
import torch
from transformers import AutoTokenizer

from mindie_service.llm import LLM
from mindie_service.protocol import tool_response
from mindie_service.protocol.tool_calls import ToolsRequest
from mindie_service.sampling_params import SamplingParams
from mindie_service.server.handlers_openai import tool_format
from mindie_service.structured.backend import StructuredLimits
from mindie_service.structured.grammar_spec import StructuredSpec
from mindie_service.structured.llg_backend import LlgBackend
from mindie_service.structured.tool_formats import FORMATS, for_tokenizer

TC, PY = 2047, 2046  # ids of the tiny vocabulary given to the two markers (the model has 2048 logit rows)
ARGS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                         "n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["city", "n"]}
TOOLS = ({"type": "function", "function": {"name": "weather", "parameters": ARGS}},)


@pytest.fixture(scope="module")
def marker_model(tiny_model, tmp_path_factory) -> Path:
    """The tiny demo model whose last two vocabulary entries are the special tokens [TOOL_CALLS] and
    <|python_tag|> (as in Mistral's and Llama 3's tokenizers)."""
    dst = tmp_path_factory.mktemp("markers") / "tiny-markers"
    shutil.copytree(tiny_model, dst)
    d = json.loads((dst / "tokenizer.json").read_text())
    by_id = {v: k for k, v in d["model"]["vocab"].items()}
    for i, text in ((TC, "[TOOL_CALLS]"), (PY, "<|python_tag|>")):
        old = by_id[i]
        del d["model"]["vocab"][old]
        d["model"]["vocab"][text] = i
        d["model"]["merges"] = [m for m in d["model"]["merges"]
                                if (m if isinstance(m, str) else " ".join(m)).replace(" ", "") != old]
        d["added_tokens"].append({"id": i, "content": text, "single_word": False, "lstrip": False,
                                  "rstrip": False, "normalized": False, "special": True})
    (dst / "tokenizer.json").write_text(json.dumps(d))
    return dst


@pytest.fixture(scope="module")
def tok(marker_model):
    return AutoTokenizer.from_pretrained(str(marker_model))


@pytest.fixture(scope="module")
def llm(marker_model):
    return LLM(str(marker_model))


def _allowed(backend: LlgBackend, spec: StructuredSpec, prefix: list[int] = ()) -> set[int]:
    m = backend.new_matcher(backend.compile(spec))
    assert all(m.consume(t) for t in prefix)
    masks = torch.zeros(1, (backend.vocab_size + 31) // 32, dtype=torch.int32)
    backend.fill_masks([(m, 0)], masks)
    words = masks[0].tolist()
    return {32 * w + b for w, v in enumerate(words) for b in range(32) if (v >> b) & 1}


def test_markers_bind_to_the_special_token_ids_or_stay_text(tok, tiny_model):
    assert for_tokenizer(FORMATS["mistral"], tok).open_id == TC
    assert for_tokenizer(FORMATS["llama3_json"], tok).open_id == PY
    assert for_tokenizer(FORMATS["hermes"], tok).open_id is None  # <tool_call> is not a token of this vocabulary
    plain = AutoTokenizer.from_pretrained(str(tiny_model))
    for name, f in FORMATS.items():  # without the special token: the very grammar spelled out as text
        bound = for_tokenizer(f, plain)
        assert bound.open_id is None
        assert bound.grammar(TOOLS, required=True, parallel=True) == f.grammar(TOOLS, required=True, parallel=True)
        assert "<[" not in bound.grammar(TOOLS, required=False, parallel=False)
    # the server's route binds the format from the model's tokenizer (and the config's parser name)
    engine = SimpleNamespace(input_facts=SimpleNamespace(tokenizer=tok))
    ctx = SimpleNamespace(engine_config=SimpleNamespace(structured=StructuredLimits(tool_call_parser="mistral")))
    assert tool_format(engine, ctx).open_id == TC


def test_grammar_allows_only_the_marker_token_where_a_call_begins(tok):
    backend = LlgBackend(tok, [2], StructuredLimits(), vocab_size=2048)
    mistral = for_tokenizer(FORMATS["mistral"], tok)
    required = ToolsRequest(TOOLS, "required", True, mistral).spec()
    assert required.keep_special == (TC,)
    assert _allowed(backend, required) == {TC}  # one token: forced, never "[TOOL_CALLS]" spelled out
    text_marker = tok("[TOOL", add_special_tokens=False).input_ids
    auto = ToolsRequest(TOOLS, "auto", True, mistral).spec()
    got = _allowed(backend, auto, tok("Sure", add_special_tokens=False).input_ids)
    assert TC in got and text_marker[0] in got  # free text, or the marker token
    llama = for_tokenizer(FORMATS["llama3_json"], tok)
    got = _allowed(backend, ToolsRequest(TOOLS, "required", False, llama).spec())
    assert PY in got and all(tok.decode([t]).startswith("{") for t in got - {PY})  # the tag may lead the JSON
    # unbound (the marker spelled as text), free text never admits the special token: a model that writes its
    # marker token would be refused it
    unbound = ToolsRequest(TOOLS, "auto", True, FORMATS["mistral"]).spec()
    got = _allowed(backend, unbound, tok("Sure", add_special_tokens=False).input_ids)
    assert unbound.keep_special == () and TC not in got and text_marker[0] in got


@pytest.mark.parametrize("fmt,choice", [("mistral", "required"), ("mistral", "weather"),
                                        ("llama3_json", "required")])
def test_model_calls_through_the_special_marker_and_the_calls_parse(llm, tok, fmt, choice):
    req = ToolsRequest(TOOLS, choice, False, for_tokenizer(FORMATS[fmt], tok))
    for seed in (1, 2):
        p = SamplingParams(max_tokens=120, temperature=1.0, seed=seed, structured_outputs=req.spec())
        out = llm.generate(["call the weather tool"], p, use_tqdm=False)[0].outputs[0]
        assert out.finish_reason != "length"
        if fmt == "mistral":
            assert out.token_ids[0] == TC and out.text.startswith("[TOOL_CALLS][{")  # the token, its text kept
        msg, reason = tool_response.message(req, "rid", 0, out.text, "stop")
        assert reason == ("stop" if choice == "weather" else "tool_calls") and msg["content"] is None
        for c in msg["tool_calls"]:
            assert c["function"]["name"] == "weather"
            jsonschema.validate(json.loads(c["function"]["arguments"]), ARGS)
