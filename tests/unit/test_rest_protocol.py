"""The seed REST API's parsing: field-naming messages, HF generate's ranges, the defaults' precedence."""
from __future__ import annotations

import json

import pytest

from mindie_service.config.gen_defaults import generation_defaults, parse_dotenv
from mindie_service.errors import BadRequestError, ConfigError, ValidationError
from mindie_service.generation_config import GenerationConfig
from mindie_service.protocol.rest import (MAX_BATCH_PROMPTS, parse_generate_batch, parse_generate_one,
                                          parse_rest_body)

HF = GenerationConfig()

SEED_ONE = {
    "request_id": "YmFzZTY0", "prompt": "[INST] Generate a very long poem about 1000 cats [/INST]\n\n",
    "only_new_tokens": True, "stream_response": True,
    "generation_config": {"num_beams": 1, "do_sample": True, "temperature": 1, "top_p": 1, "top_k": 50,
                          "max_new_tokens": 2048, "repetition_penalty": 1, "length_penalty": 1},
}


def test_the_seed_example_is_valid_and_samples():
    req = parse_generate_one(SEED_ONE, HF)
    assert req.stream and req.only_new_tokens and req.prompts[0].request_id == "YmFzZTY0"
    p = req.params()
    assert p.temperature == 1.0 and p.top_k == 50 and p.top_p == 1.0 and p.max_tokens == 2048 and not p.greedy


def test_defaults_are_hf_generate_and_greedy():
    req = parse_generate_one({"request_id": "a", "prompt": "x"}, HF)
    p = req.params()
    assert p.greedy and p.num_beams == 1 and p.max_tokens == 20 and req.stream and req.only_new_tokens


@pytest.mark.parametrize("gc, field", [
    ({"num_beams": 9}, "generation_config.num_beams"),
    ({"num_beams": 0}, "generation_config.num_beams"),
    ({"top_p": 0}, "generation_config.top_p"),
    ({"top_p": 1.5}, "generation_config.top_p"),
    ({"top_k": -1}, "generation_config.top_k"),
    ({"max_new_tokens": 0}, "generation_config.max_new_tokens"),
    ({"repetition_penalty": 0}, "generation_config.repetition_penalty"),
    ({"temperature": "hot"}, "generation_config.temperature"),
    ({"do_sample": "yes"}, "generation_config.do_sample"),
    ({"beams": 2}, "generation_config.beams"),
    ({"do_sample": True, "temperature": 0}, "generation_config.temperature"),
])
def test_bad_generation_config_names_the_field(gc, field):
    with pytest.raises(ValidationError) as e:
        parse_generate_one({"request_id": "a", "prompt": "x", "generation_config": gc}, HF)
    assert e.value.status == 422 and f"Parameter {field} " in e.value.message


def test_beams_with_sampling_is_refused_naming_the_rule():
    with pytest.raises(ValidationError, match=r"num_beams must be 1 when generation_config.do_sample is true"):
        parse_generate_one({"request_id": "a", "prompt": "x",
                            "generation_config": {"num_beams": 2, "do_sample": True}}, HF)


def test_batch_errors_name_the_prompt_index():
    ok = {"request_id": "a", "prompt": "x"}
    with pytest.raises(ValidationError, match=r"prompts\[3\]\.request_id"):
        parse_generate_batch({"prompts": [ok, {"request_id": "b", "prompt": "y"}, {"request_id": "c", "prompt": ""},
                                          {"request_id": 7, "prompt": "z"}]}, HF)
    with pytest.raises(ValidationError, match=r"prompts\[1\]\.prompt"):
        parse_generate_batch({"prompts": [ok, {"request_id": "b"}]}, HF)
    with pytest.raises(ValidationError, match=r"prompts\[2\]\.request_id must be unique.*prompts\[0\]"):
        parse_generate_batch({"prompts": [ok, {"request_id": "b", "prompt": "y"}, ok]}, HF)
    with pytest.raises(ValidationError, match="at most 256 prompts"):
        parse_generate_batch({"prompts": [{"request_id": str(i), "prompt": "x"}
                                          for i in range(MAX_BATCH_PROMPTS + 1)]}, HF)
    with pytest.raises(ValidationError, match=r"request_id must be a string of 1 to 256"):
        parse_generate_one({"request_id": "x" * 257, "prompt": "x"}, HF)


def test_body_is_json_whatever_the_content_type():
    assert parse_rest_body(json.dumps(SEED_ONE).encode())["request_id"] == "YmFzZTY0"
    with pytest.raises(BadRequestError):
        parse_rest_body(b"{not json")
    with pytest.raises(ValidationError):
        parse_rest_body(b"[1, 2]")


def test_request_overrides_defaults_field_by_field():
    defaults = HF.merged({"max_new_tokens": 7, "temperature": 0.5, "do_sample": True})
    req = parse_generate_one({"request_id": "a", "prompt": "x", "generation_config": {"temperature": 0.9}}, defaults)
    p = req.params()
    assert p.max_tokens == 7 and p.temperature == 0.9 and not p.greedy


def test_dotenv_syntax():
    env = parse_dotenv('# c\nexport MINDIE_GEN_TOP_K=7\nMINDIE_GEN_TEMPERATURE="0.5"\nX = a b # tail\n\nbad line\n')
    assert env == {"MINDIE_GEN_TOP_K": "7", "MINDIE_GEN_TEMPERATURE": "0.5", "X": "a b"}


def test_precedence_env_over_dotenv_over_section_over_model_json(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.json").write_text(json.dumps({"parameters": {"max_tokens": 11, "top_k": 3, "temperature": "0.2",
                                                                 "top_p": 0.3, "stream": True}}))
    (tmp_path / ".env").write_text("MINDIE_GEN_TOP_K=5\nMINDIE_GEN_TEMPERATURE=0.4\n")
    cfg = tmp_path / "config.json"
    got = generation_defaults(cfg, {"top_k": 4, "top_p": 0.6, "num_beams": 2}, {"MINDIE_GEN_TOP_K": "6"}, str(model))
    assert got == {"max_new_tokens": 11, "top_k": 6, "temperature": 0.4, "top_p": 0.6, "num_beams": 2}


def test_bad_env_value_stops_start_up_naming_the_variable(tmp_path):
    with pytest.raises(ConfigError, match="MINDIE_GEN_NUM_BEAMS must be an integer in"):
        generation_defaults(tmp_path / "c.json", {}, {"MINDIE_GEN_NUM_BEAMS": "12"}, str(tmp_path))
    with pytest.raises(ConfigError, match="MINDIE_GEN_BEAMS is not a generation_config field"):
        generation_defaults(tmp_path / "c.json", {}, {"MINDIE_GEN_BEAMS": "2"}, str(tmp_path))
