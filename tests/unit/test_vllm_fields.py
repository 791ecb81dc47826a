"""vLLM's request fields on the OpenAI routes, taken on every deployment (protocol.vllm_fields), each with its
effect: min_p in the sampler as transformers' MinPLogitsWarper, stop_token_ids, truncate_prompt_tokens and
priority into the request, continuous_usage_stats as usage in every chunk; the fields this server only honours
at vLLM's default refused by name otherwise; guidellm's own streaming body accepted whole."""
from __future__ import annotations

import json

import pytest
import torch

from mindie_service.engine.contract import TokenEvent, TokenInfo
from mindie_service.engine.sample.sampler import Sampler
from mindie_service.engine.sequence import Sequence
from mindie_service.errors import ValidationError
from mindie_service.protocol.encoders import StreamState
from mindie_service.protocol.openai import parse_openai
from mindie_service.protocol.openai_encoder import OpenAIEncoder
from mindie_service.protocol.request import GenerationResult, ProtocolLimits
from mindie_service.protocol.vllm_fields import advertised_fields
from mindie_service.sampling_params import SamplingParams

LIM = ProtocolLimits(vocab_size=100)
MSGS = [{"role": "user", "content": "hi"}]


def chat(**body):
    return parse_openai({"model": "m", "messages": MSGS, **body}, "chat", limits=LIM, model="m", request_id="r")


def test_min_p_keeps_what_transformers_min_p_warper_keeps():
    from transformers.generation.logits_process import MinPLogitsWarper

    torch.manual_seed(0)
    logits = torch.randn(3, 50, dtype=torch.float64) * 3
    for min_p in (0.05, 0.2, 0.6):
        seqs = [Sequence(f"s{r}", [1], SamplingParams(max_tokens=4, temperature=1.0, min_p=min_p), 4, seed=0)
                for r in range(3)]
        ours = Sampler._warp(logits.clone(), seqs)
        ref = MinPLogitsWarper(min_p)(None, logits.clone()).softmax(-1)
        assert torch.equal(ours > 0, ref > 0)
        assert torch.allclose(ours, ref, atol=1e-12)


def test_sampling_extras_reach_the_request():
    r = chat(min_p=0.1, top_k=-1, stop_token_ids=[5, 7], truncate_prompt_tokens=9, ignore_eos=True, min_tokens=2,
             repetition_penalty=1.1, priority=-3, temperature=0.7)
    p = r.params
    assert (p.min_p, p.top_k, p.stop_token_ids, p.ignore_eos, p.min_tokens, p.repetition_penalty) == \
        (0.1, 0, (5, 7), True, 2, 1.1)
    assert (r.truncate, r.rank) == (9, -3)
    assert chat(min_p=0.1, temperature=0).params.min_p == 0.0  # greedy: nothing to warp


@pytest.mark.parametrize("field, value", [
    ("use_beam_search", False), ("length_penalty", 1.0), ("include_stop_str_in_output", False),
    ("skip_special_tokens", True), ("spaces_between_special_tokens", True), ("bad_words", []),
    ("prompt_logprobs", None), ("allowed_token_ids", None)])
def test_vllm_defaults_are_accepted(field, value):
    chat(**{field: value})


@pytest.mark.parametrize("field, value", [
    ("use_beam_search", True), ("length_penalty", 2.0), ("include_stop_str_in_output", True),
    ("skip_special_tokens", False), ("spaces_between_special_tokens", False), ("bad_words", ["x"]),
    ("prompt_logprobs", 1), ("allowed_token_ids", [1]), ("stop_token_ids", [100]), ("truncate_prompt_tokens", 0),
    ("priority", 1.5), ("priority", 2**31), ("min_p", -0.1)])
def test_other_values_are_refused_naming_the_field(field, value):
    with pytest.raises(ValidationError, match=f"Parameter {field} "):
        chat(**{field: value})


def _stream(req, pieces):
    enc, acc, st = OpenAIEncoder(), GenerationResult(), StreamState()
    out = []
    for i, text in enumerate(pieces):
        ev = TokenEvent("c", TokenInfo(10 + i, None, text, False), text, i, num_prompt_tokens=4 if i == 0 else 0)
        if i == len(pieces) - 1:
            ev.finish_reason, ev.full_text = "length", "".join(pieces)
        acc.add(ev)
        out.append(json.loads(enc.stream_frame(req, ev, acc, st)[len(b"data: "):]))
    tail = enc.stream_end(req, [acc]).decode().split("\n\n")
    return out, tail


def test_continuous_usage_stats_puts_the_usage_so_far_in_every_chunk():
    req = chat(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
    chunks, tail = _stream(req, ["a", "b", "c"])
    assert [c["usage"] for c in chunks] == [{"prompt_tokens": 4, "completion_tokens": k, "total_tokens": 4 + k}
                                            for k in (1, 2, 3)]
    assert json.loads(tail[0][len("data: "):])["usage"]["completion_tokens"] == 3 and tail[1] == "data: [DONE]"
    plain, _ = _stream(chat(stream=True, stream_options={"include_usage": True}), ["a", "b"])
    assert [c["usage"] for c in plain] == [None, None]  # include_usage alone: the last chunk only (OpenAI's)


def test_guidellm_streaming_body_is_taken_whole():
    # what guidellm 0.8.1's chat handler sends (backends/openai/request_handlers.py), and its completions form
    req = chat(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True},
               max_completion_tokens=32, stop=None, ignore_eos=True)
    assert req.continuous_usage and req.include_usage and req.params.ignore_eos and req.params.max_tokens == 32
    comp = parse_openai({"model": "m", "prompt": "x", "stream": True, "max_tokens": 8, "stop": None,
                         "ignore_eos": True, "stream_options": {"include_usage": True,
                                                                "continuous_usage_stats": True}},
                        "completion", limits=LIM, model="m")
    assert comp.continuous_usage and comp.params.ignore_eos


def test_open_ai_support_only_decides_what_info_advertises():
    assert advertised_fields("openai") == {"openai_support": "openai"}
    fields = advertised_fields("vllm")["vllm_request_fields"]
    assert {"ignore_eos", "min_p", "priority", "stream_options.continuous_usage_stats"} <= set(fields)
