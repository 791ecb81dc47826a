"""OpenAI request parsing: OpenAI's defaults and ranges, vLLM's fields on every deployment,
unsupported fields refused by name, model.json defaults, counts bounded, bad JSON shapes a 400 (never a 500)."""
from __future__ import annotations

import pytest

from mindie_service.errors import ValidationError
from mindie_service.inputs import ChatPrompt, TextPrompt, TokensPrompt
from mindie_service.protocol.request import ProtocolLimits
from mindie_service.params.defaults import RequestDefaults
from mindie_service.protocol.openai import parse_openai, peek_model
from mindie_service.protocol.openai_encoder import openai_error
from mindie_service.sampling_params import INT32_MAX

LIM = ProtocolLimits(vocab_size=100)


def p(body, kind="completion", **kw):
    return parse_openai({"model": "m", **body}, kind, limits=LIM, model="m", **kw)


def test_defaults_and_prompt_forms() -> None:
    r = p({"prompt": "hi"})
    assert r.params.max_tokens == 16 and r.params.temperature == 1.0 and r.n == 1 and not r.stream
    assert p({"messages": [{"role": "user", "content": "x"}]}, "chat").params.max_tokens == INT32_MAX
    r = p({"prompt": [[1, 2], "a", [3]], "n": 2})
    assert [type(x) for x in r.prompts] == [TokensPrompt, TextPrompt, TokensPrompt] and r.best_of == 2
    assert p({"prompt": [5, 6]}).prompts == (TokensPrompt((5, 6)),)
    r = p({"messages": [{"role": "developer", "content": "s"}, {"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}]},
        "chat")
    assert isinstance(r.prompt, ChatPrompt) and r.prompt.messages[0].role == "system"
    assert r.prompt.messages[1].content[1].kind == "image"
    assert p({"prompt": "x", "temperature": 0}).params.greedy


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "temperature": 2.5}, "temperature"), ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "n": 17}, "n"), ({"prompt": ["x"] * 40, "n": 2}, "n"),
    ({"prompt": "x", "presence_penalty": 3}, "presence_penalty"), ({"prompt": "x", "logit_bias": {"99999": 5}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"1": 500}}, "logit_bias[1]"),
    ({"prompt": "x", "min_p": 1.5}, "min_p"), ({"prompt": "x", "tools": []}, "tools"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": [200]}, "prompt[0]"), ({"prompt": "x", "logprobs": 6}, "logprobs"), ({"prompt": ""}, "prompt[0]"),
])
def test_bad_values_name_their_parameter(body, param) -> None:
    with pytest.raises(ValidationError) as e:
        p(body)
    status, err = openai_error(e.value)
    assert status == 400 and err["error"]["param"] == param, e.value.message


@pytest.mark.parametrize("messages", [[{"role": {}, "content": ""}], [{"role": "tool", "content": "x"}], [],
                                      [{"role": "user", "content": [{"type": "input_audio", "input_audio": {
                                          "data": "AA==", "format": {}}}]}], "x",
                                      [{"role": "assistant", "content": [{"type": "image_url", "image_url": "u"}]}]])
def test_bad_messages_are_validation_errors(messages) -> None:
    with pytest.raises(ValidationError):
        p({"messages": messages}, "chat")


def test_vllm_fields_and_model_defaults() -> None:
    r = p({"prompt": "x", "top_k": 5, "ignore_eos": True, "repetition_penalty": 1.2})
    assert r.params.top_k == 5 and r.params.ignore_eos and r.params.repetition_penalty == 1.2
    assert p({"prompt": "x", "min_tokens": 3, "max_tokens": 5}).params.min_tokens == 3
    with pytest.raises(ValidationError, match="min_tokens"):  # vLLM's rule: at most max_tokens
        p({"prompt": "x", "min_tokens": 6, "max_tokens": 5})
    d = RequestDefaults(temperature=0.0, top_p=0.5, top_k=7, max_tokens=9)
    r = p({"prompt": "x"}, defaults=d)
    assert r.params.greedy and r.params.max_tokens == 9
    r = p({"prompt": "x", "temperature": 0.8}, defaults=d)
    assert r.params.top_p == 0.5 and r.params.top_k == 7 and r.params.temperature == 0.8
    assert peek_model({"model": "abc"}) == "abc"
    with pytest.raises(ValidationError, match="model"):
        peek_model({"model": 3})
