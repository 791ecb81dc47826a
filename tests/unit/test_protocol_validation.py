"""Protocol validation: POST / (MindIE) and /generate* (TGI) parameters -> GenerationRequest, then the
input processor as the server runs it (tokens, lengths, adapters). Needs only the tiny demo model's tokenizer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from transformers import AutoTokenizer

from mindie_service.engine.contract import EngineRequest
from mindie_service.errors import BadRequestError, ValidationError
from mindie_service.inputs import InputLimits, InputProcessor, PartsPrompt, TextPrompt
from mindie_service.protocol.mindie import parse_generation
from mindie_service.protocol.request import GenerationRequest, ProtocolLimits
from mindie_service.protocol.mindie import parse_mindie_request
from mindie_service.protocol.tgi import parse_tgi_request
from mindie_service.protocol.validation import parse_json_body
from tests.server_utils import SEED_BODY


@pytest.fixture(scope="module")
def tok(tiny_model):
    t = AutoTokenizer.from_pretrained(str(tiny_model))
    return lambda s: list(t(s).input_ids)


@pytest.fixture(scope="module")
def limits():
    return ProtocolLimits(vocab_size=2048)


def processor(tok, max_input_len=32, truncation=False, adapters=()):
    return InputProcessor(tok, InputLimits(max_input_len, truncation, 2048), adapter_names=lambda: adapters)


@pytest.fixture(scope="module")
def proc(tok):
    return processor(tok)


@dataclass
class Parsed:
    """The parsed request and what the input processor made of it; reads fall through to the request."""

    req: GenerationRequest
    engine: EngineRequest

    def __getattr__(self, name: str) -> Any:
        return getattr(self.req, name)

    @property
    def prompt_token_ids(self) -> list[int]:
        return list(self.engine.prompt_token_ids)


def processed(r: GenerationRequest, proc: InputProcessor) -> Parsed:
    return Parsed(r, proc.process(r.prompt, r.params, request_id="t", truncate=r.truncate))


def mindie(body, limits, proc):
    """POST /'s path up to the engine: parse, then the input processor."""
    return processed(parse_mindie_request(body, limits), proc)


def params(**p):
    return {"inputs": "hello world", "parameters": p}


def test_seed_sample_body_parses_to_sampling_request(limits, tok, proc):
    r = mindie(SEED_BODY, limits, proc)
    assert r.prompt_token_ids == tok("My name is Olivier and I")
    assert r.details and r.decoder_input_details and not r.stream and r.sampling
    p = r.params
    assert (p.max_tokens, p.temperature, p.top_k, p.top_p, p.typical_p) == (20, 0.5, 10, 0.95, 0.5)
    assert p.repetition_penalty == 1.03 and p.stop == ["stop1", "stop2"] and p.seed is None
    assert p.prompt_logprobs and p.adapter_id is None


def test_defaults_are_greedy_with_twenty_tokens(limits, proc):
    r = mindie({"inputs": "hello"}, limits, proc)
    assert r.params.max_tokens == 20 and r.params.greedy and not r.sampling
    assert not r.details and not r.stream and r.best_of == 1 and not r.params.prompt_logprobs


@pytest.mark.parametrize("name,value,message", [
    ("max_new_tokens", 0, "Parameter max_new_tokens must be in (0, 2147483647], got 0"),
    ("max_new_tokens", 2**31, "Parameter max_new_tokens must be in (0, 2147483647], got 2147483648"),
    ("max_new_tokens", 2.5, "Parameter max_new_tokens must be an integer, got 2.5"),
    ("max_new_tokens", True, "Parameter max_new_tokens must be an integer, got True"),
    ("repetition_penalty", 0, "Parameter repetition_penalty must be > 0.0, got 0"),
    ("temperature", 1e-7, "Parameter temperature must be > 1e-06, got 1e-07"),
    ("top_k", 0, "Parameter top_k must be in (0, 2147483647], got 0"),
    ("top_p", 1.0, "Parameter top_p must be in (1e-06, 1.0), got 1.0"),
    ("top_p", 0.0, "Parameter top_p must be in (1e-06, 1.0), got 0.0"),
    ("typical_p", 0.0, "Parameter typical_p must be in (0.0, 1.0], got 0.0"),
    ("typical_p", 1.5, "Parameter typical_p must be in (0.0, 1.0], got 1.5"),
    ("seed", 0, "Parameter seed must be in (0, 18446744073709551615], got 0"),
    ("seed", 2**64, "Parameter seed must be in (0, 18446744073709551615], got 18446744073709551616"),
    ("truncate", 0, "Parameter truncate must be in (0, 2147483647], got 0"),
    ("details", "yes", "Parameter details must be a boolean, got 'yes'"),
    ("watermark", 1, "Parameter watermark must be a boolean, got 1"),
    ("stop", [""], "Parameter stop must be a list of non-empty strings"),
    ("stop", 5, "Parameter stop must be a string or a list of strings, got 5"),
    ("adapter_id", "bad id!", "Parameter adapter_id must be a string matching"),
    ("adapter_id", "my-lora", "Parameter adapter_id must name a loaded LoRA adapter"),
    ("best_of", 0, "Parameter best_of must be in (0, 4], got 0"),
    ("top_n_tokens", 21, "Parameter top_n_tokens must be in [0, 20], got 21"),
    ("grammar", {"type": "xml", "value": "a+"}, "Parameter grammar.type must be json or regex"),
    ("frequency_penalty", 3.0, "Parameter frequency_penalty must be in [-2.0, 2.0], got 3.0"),
])
def test_out_of_range_parameters_name_parameter_rule_and_value(limits, proc, name, value, message):
    with pytest.raises(ValidationError) as e:
        mindie(params(**{name: value}), limits, proc)
    assert str(e.value).startswith(message), str(e.value)
    assert e.value.status == 422 and e.value.error_type == "validation"


def test_null_parameters_mean_defaults(limits, proc):
    r = mindie(params(seed=None, truncate=None, temperature=None, top_k=None, top_p=None, typical_p=None,
                      stop=None, best_of=None, top_n_tokens=None, grammar=None, do_sample=None), limits, proc)
    assert r.params.greedy and r.params.stop == [] and r.best_of == 1


def test_stop_accepts_a_string(limits, proc):
    assert mindie(params(stop="end"), limits, proc).params.stop == ["end"]


def test_decoder_input_details_with_stream_is_refused(limits, proc):
    body = {"inputs": "hi", "stream": True, "parameters": {"decoder_input_details": True}}
    with pytest.raises(ValidationError, match="decoder_input_details must be false when stream is true"):
        mindie(body, limits, proc)


@pytest.mark.parametrize("inputs,match", [
    ([{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": "/x.png"}], r"inputs\[1\].*takes no image"),
    ([{"type": "sound_url", "sound_url": "/x.wav"}], "sound_url"),
    ([{"type": "text", "text": ""}], "text"),
    ("", "inputs must be a non-empty string"),
    (5, "inputs must be a string"),
    (None, "inputs is required"),
])
def test_bad_inputs(limits, proc, inputs, match):
    with pytest.raises(ValidationError, match=match):
        mindie({"inputs": inputs}, limits, proc)


def test_stream_must_be_boolean(limits, proc):
    with pytest.raises(ValidationError, match="Parameter stream must be a boolean, got 'true'"):
        mindie({"inputs": "hi", "stream": "true"}, limits, proc)


def test_parameters_must_be_an_object(limits, proc):
    with pytest.raises(ValidationError, match="parameters must be a JSON object"):
        mindie({"inputs": "hi", "parameters": [1]}, limits, proc)


def test_sampling_follows_tgi_rule(limits, proc):
    assert mindie(params(do_sample=True), limits, proc).params.temperature == 1.0
    assert not mindie(params(do_sample=False), limits, proc).sampling
    assert mindie(params(temperature=0.7), limits, proc).sampling  # a warper turns sampling on
    assert mindie(params(do_sample=False, top_k=5), limits, proc).sampling
    assert not mindie(params(temperature=1.0), limits, proc).sampling  # neutral values stay greedy
    greedy = mindie(params(repetition_penalty=1.2), limits, proc).params
    assert greedy.greedy and greedy.repetition_penalty == 1.2


def test_top_k_at_or_above_vocab_means_off(limits, proc):
    assert mindie(params(top_k=2048), limits, proc).params.top_k == 0
    assert mindie(params(top_k=2047), limits, proc).params.top_k == 2047


def test_truncate_keeps_last_tokens(limits, tok, proc):
    ids = tok("one two three four five six")
    r = mindie(params(truncate=3) | {"inputs": "one two three four five six"}, limits, proc)
    assert r.prompt_token_ids == ids[-3:]
    r = mindie(params(truncate=1000) | {"inputs": "one two three four five six"}, limits, proc)
    assert r.prompt_token_ids == ids


def test_too_long_input_names_count_and_limit(limits, tok):
    short = processor(tok, max_input_len=4, truncation=False)
    text = "one two three four five six seven"
    n = len(tok(text))
    with pytest.raises(ValidationError) as e:
        mindie({"inputs": text}, limits, short)
    assert f"at most 4 tokens" in str(e.value) and f"got {n} tokens" in str(e.value)
    # truncate below the limit makes it fit
    assert len(mindie({"inputs": text, "parameters": {"truncate": 4}}, limits, short).prompt_token_ids) == 4


def test_truncation_config_cuts_instead_of_refusing(limits, tok):
    cutting = processor(tok, max_input_len=4, truncation=True)
    text = "one two three four five six seven"
    assert mindie({"inputs": text}, limits, cutting).prompt_token_ids == tok(text)[-4:]


def test_best_of_rules(limits, proc):
    assert mindie(params(best_of=2, do_sample=True), limits, proc).best_of == 2
    with pytest.raises(ValidationError, match="best_of must be 1 when stream is true"):
        mindie({"inputs": "hi", "stream": True, "parameters": {"best_of": 2, "do_sample": True}}, limits, proc)
    with pytest.raises(ValidationError, match="best_of must be 1 when a seed is given"):
        mindie(params(best_of=2, do_sample=True, seed=3), limits, proc)
    with pytest.raises(ValidationError, match="best_of must be 1 unless sampling"):
        mindie(params(best_of=2), limits, proc)
    with pytest.raises(ValidationError, match=r"best_of must be in \(0, 4\], got 5"):
        mindie(params(best_of=5, do_sample=True), limits, proc)


def test_top_n_tokens_asks_for_alternatives(limits, proc):
    r = mindie(params(top_n_tokens=3), limits, proc)
    assert r.top_n_tokens == 3 and r.params.logprobs == 3
    assert mindie(params(top_n_tokens=0), limits, proc).params.logprobs is None


def test_text_generation_client_body_is_accepted(limits, proc):
    """Exactly what text-generation 0.7's Client.generate sends to `/`."""
    from text_generation.types import Parameters, Request

    req = Request(inputs="hello", stream=False, parameters=Parameters(
        details=True, max_new_tokens=5, stop=[], best_of=None, top_n_tokens=None, grammar=None))
    r = mindie(req.dict(), limits, proc)
    assert r.details and r.params.max_tokens == 5 and not r.sampling


def test_tgi_dialect_ranges(limits, proc):
    r = parse_tgi_request(params(top_p=1.0, temperature=1e-7), limits, stream=False)
    assert r.sampling and r.params.top_p == 1.0  # TGI: top_p in (0, 1], temperature > 0
    assert not r.params.prompt_logprobs  # TGI: prefill only with decoder_input_details
    r = parse_tgi_request(params(details=True), limits, stream=False)
    assert r.details and not r.params.prompt_logprobs
    r = parse_tgi_request(params(decoder_input_details=True), limits, stream=False)
    assert r.details and r.params.prompt_logprobs
    assert parse_tgi_request({"inputs": "hi"}, limits, stream=True).stream  # the route decides
    assert parse_tgi_request({"inputs": "hi", "stream": True}, limits, stream=True).stream  # TGI's client sends it
    with pytest.raises(ValidationError, match="decoder_input_details must be false when stream is true"):
        parse_tgi_request(params(decoder_input_details=True), limits, stream=True)


def test_mindie_details_asks_for_prompt_logprobs(limits, proc):
    assert mindie(params(details=True), limits, proc).params.prompt_logprobs


def test_adapter_known_to_the_processor_is_accepted(limits, tok):
    with_lora = processor(tok, adapters=frozenset({"my-lora"}))
    r = parse_generation(params(adapter_id="my-lora"), dialect="mindie", stream=False, limits=limits)
    assert processed(r, with_lora).params.adapter_id == "my-lora"


def test_base_adapter_name_means_no_adapter(limits, proc):
    assert mindie(params(adapter_id="None"), limits, proc).engine.params.adapter_id is None


@pytest.mark.parametrize("dialect", ["mindie", "tgi"])
def test_watermark_is_refused_as_unsupported(limits, dialect):
    with pytest.raises(ValidationError) as e:
        parse_generation(params(watermark=True), dialect=dialect, stream=False, limits=limits)
    assert str(e.value) == "Parameter watermark must be false (watermarking is not supported), got True"
    assert e.value.status == 422
    assert parse_generation(params(watermark=False), dialect=dialect, stream=False, limits=limits).sampling is False


def test_parsing_does_not_tokenize(limits):
    r = parse_mindie_request({"inputs": "hello world", "parameters": {"truncate": 5}}, limits)
    assert r.prompt == TextPrompt("hello world") and r.truncate == 5 and r.inputs == "hello world"
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": "/x.png"},
             {"type": "text", "text": "here"}]
    r = parse_mindie_request({"inputs": parts}, limits)
    assert isinstance(r.prompt, PartsPrompt) and len(r.prompt.parts) == 3 and r.inputs == "look\nhere"
    r = parse_mindie_request({"inputs": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, limits)
    assert r.prompt == TextPrompt("a\nb")  # text parts alone are plain text


def test_json_body_errors():
    assert parse_json_body(b'{"a": 1}', "application/json; charset=utf-8") == {"a": 1}
    with pytest.raises(BadRequestError, match="Content-Type must be application/json"):
        parse_json_body(b'{"a": 1}', "text/plain")
    with pytest.raises(BadRequestError, match="Content-Type must be application/json"):
        parse_json_body(b'{"a": 1}', None)
    with pytest.raises(BadRequestError, match="not valid JSON"):
        parse_json_body(b'{"a": ', "application/json")
    with pytest.raises(BadRequestError, match="not valid JSON"):
        parse_json_body(b'{"a": NaN}', "application/json")
    with pytest.raises(BadRequestError, match="not valid UTF-8"):
        parse_json_body(b'{"a": "\xff"}', "application/json")
    with pytest.raises(ValidationError, match="must be a JSON object, got list"):
        parse_json_body(b'[1]', "application/json")
