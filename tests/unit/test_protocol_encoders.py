"""Response shapes: MindIE's `/` (list body, list ids in stream frames) and TGI's /generate*."""
from __future__ import annotations

import json

from mindie_service.engine.contract import TokenEvent, TokenInfo
from mindie_service.protocol.encoders import MindieEncoder, StreamState, TgiEncoder
from mindie_service.errors import GenerationError
from mindie_service.inputs import TextPrompt
from mindie_service.protocol.request import GenerationRequest, GenerationResult, select_best
from mindie_service.sampling_params import SamplingParams

PROMPT = [TokenInfo(1, None, "<s>", True), TokenInfo(10, -2.5, "Hi", False)]


def events(texts, finish="length", seed=7, rid="r", logprob=-0.5, top=()):
    out = []
    for i, t in enumerate(texts):
        ev = TokenEvent(request_id=rid, token=TokenInfo(100 + i, logprob, t, False, top), text_delta=t, index=i)
        if i == 0:
            ev.prompt_tokens, ev.num_prompt_tokens, ev.seed = PROMPT, 2, seed
        if i == len(texts) - 1:
            ev.finish_reason, ev.full_text = finish, "".join(texts)
        out.append(ev)
    return out


def result(texts, **kw):
    r = GenerationResult()
    for ev in events(texts, **kw):
        r.add(ev)
    return r


def req(**kw):
    base = dict(prompt=TextPrompt("Hi"), params=SamplingParams(max_tokens=3))
    base.update(kw)
    return GenerationRequest(**base)


def frames(enc, r, evs):
    acc, st = GenerationResult(), StreamState()
    out = []
    for ev in evs:
        acc.add(ev)
        raw = enc.stream_frame(r, ev, acc, st).decode()
        assert raw.endswith("\n\n")
        prefix = enc.sse_prefix
        assert raw.startswith(prefix)
        out.append(json.loads(raw[len(prefix):]))
    return out


def test_mindie_non_stream_without_details_is_a_list_of_generated_text():
    body = MindieEncoder().complete(req(), [result(["a", "b"])])
    assert body == [{"generated_text": "ab"}]


def test_mindie_details_have_the_seed_shape_with_real_values():
    body = MindieEncoder().complete(req(details=True), [result(["a", "b"])])
    d = body[0]["details"]
    assert set(d) == {"prompt_tokens", "finish_reason", "generated_tokens", "prefill", "seed", "tokens"}
    assert d["prompt_tokens"] == 2 and d["generated_tokens"] == 2 and d["finish_reason"] == "length"
    assert d["seed"] == 7  # reported even for greedy, as MindIE does
    assert d["prefill"] == [{"id": 1, "text": "<s>", "logprob": None, "special": True},
                            {"id": 10, "text": "Hi", "logprob": -2.5, "special": False}]
    assert d["tokens"][0] == {"id": 100, "text": "a", "logprob": -0.5, "special": False}


def test_return_full_text_prepends_inputs():
    body = MindieEncoder().complete(req(return_full_text=True), [result(["a"])])
    assert body[0]["generated_text"] == "Hia"


def test_mindie_stream_frames_list_ids_and_final_details():
    r = req(details=True, stream=True)
    fs = frames(MindieEncoder(), r, events(["a", "b", "c"], finish="eos_token"))
    assert fs[0] == {"token": {"id": [100], "text": "a", "logprob": -0.5, "special": False},
                     "generated_text": None, "details": None}
    assert fs[-1]["generated_text"] == "abc"
    assert fs[-1]["details"] == {"prompt_tokens": 2, "finish_reason": "eos_token", "generated_tokens": 3, "seed": 7}


def test_mindie_stream_without_details_has_null_details_at_the_end():
    fs = frames(MindieEncoder(), req(stream=True), events(["a", "b"]))
    assert fs[-1]["generated_text"] == "ab" and fs[-1]["details"] is None


def test_full_text_enabled_sends_text_so_far():
    fs = frames(MindieEncoder(full_text=True), req(stream=True), events(["a", "b", "c"]))
    assert [f["token"]["text"] for f in fs] == ["a", "ab", "abc"]


def test_int_id_format_for_tgi_client():
    fs = frames(MindieEncoder(list_ids=False), req(stream=True), events(["a"]))
    assert fs[0]["token"]["id"] == 100


def test_tgi_generate_shape():
    enc = TgiEncoder()
    assert enc.complete(req(), [result(["a"])]) == {"generated_text": "a"}
    d = enc.complete(req(details=True), [result(["a"])])["details"]
    assert d["prefill"] == [] and d["seed"] is None  # greedy: TGI reports no seed
    assert "prompt_tokens" not in d
    d = enc.complete(req(details=True, decoder_input_details=True, sampling=True), [result(["a"])])["details"]
    assert d["prefill"] == [{"id": 1, "text": "<s>", "logprob": None}, {"id": 10, "text": "Hi", "logprob": -2.5}]
    assert d["seed"] == 7


def test_tgi_stream_frames_integer_ids():
    fs = frames(TgiEncoder(), req(details=True, stream=True, sampling=True), events(["a", "b"]))
    assert fs[0]["token"]["id"] == 100 and fs[0]["details"] is None
    assert fs[-1]["details"] == {"finish_reason": "length", "generated_tokens": 2, "seed": 7}


def test_top_tokens_in_details_and_frames():
    top = (TokenInfo(100, -0.5, "a", False), TokenInfo(5, -1.5, "z", False))
    r = req(details=True, top_n_tokens=2)
    d = TgiEncoder().complete(r, [result(["a"], top=top)])["details"]
    assert d["top_tokens"] == [[{"id": 100, "text": "a", "logprob": -0.5, "special": False},
                                {"id": 5, "text": "z", "logprob": -1.5, "special": False}]]
    fs = frames(TgiEncoder(), req(stream=True, top_n_tokens=2), events(["a"], top=top))
    assert len(fs[0]["top_tokens"]) == 2


def test_best_of_picks_highest_mean_logprob_and_returns_the_others():
    worse, better = result(["x", "y"], logprob=-3.0, seed=1), result(["p"], logprob=-0.1, seed=2)
    best, others = select_best([worse, better])
    assert best is better and others == [worse]
    d = TgiEncoder().complete(req(details=True, best_of=2, sampling=True), [worse, better])
    assert d["generated_text"] == "p" and d["details"]["seed"] == 2
    [seq] = d["details"]["best_of_sequences"]
    assert seq["generated_text"] == "xy" and seq["seed"] == 1 and seq["generated_tokens"] == 2


def test_error_frame():
    raw = MindieEncoder().stream_error(GenerationError("boom")).decode()
    assert json.loads(raw[len("data: "):]) == {"error": "boom", "error_type": "generation"}
