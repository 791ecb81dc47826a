"""The real server process over HTTP: MindIE's POST /, TGI routes, management routes, metrics, errors."""
from __future__ import annotations

import copy

import pytest
import requests

from tests.server_utils import SEED_BODY, alt_server, plain_server, sse_frames

FINISH = {"length", "eos_token", "stop_sequence"}
PROMPT = "The river runs past the old mill and"


@pytest.fixture(scope="session")
def srv(request, tiny_model):
    return plain_server(request, tiny_model)


def greedy(srv, inputs=PROMPT, **p):
    r = srv.post("/", {"inputs": inputs, "parameters": {"max_new_tokens": 16, "details": True, **p}})
    assert r.status_code == 200, r.text
    return r.json()[0]


def stream(srv, body, path="/"):
    r = srv.post(path, body, stream=True)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/event-stream")
    return list(sse_frames(r))


def check_token(t, list_id=False):
    assert isinstance(t["id"], list) if list_id else isinstance(t["id"], int)
    assert isinstance(t["text"], str) and isinstance(t["special"], bool)
    assert isinstance(t["logprob"], float) and t["logprob"] <= 0.0


# -- POST / : the seed's samples ---------------------------------------------------------------------
def test_seed_sample_non_stream_has_the_seed_shape_with_real_values(srv):
    r = srv.post("/", SEED_BODY)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("application/json")
    body = r.json()
    assert isinstance(body, list) and len(body) == 1 and set(body[0]) == {"generated_text", "details"}
    d = body[0]["details"]
    assert set(d) == {"prompt_tokens", "finish_reason", "generated_tokens", "prefill", "seed", "tokens"}
    assert d["finish_reason"] in FINISH and 0 < d["generated_tokens"] <= 20
    assert len(d["tokens"]) == d["generated_tokens"] and len(d["prefill"]) == d["prompt_tokens"] > 1
    assert isinstance(d["seed"], int) and d["seed"] > 0  # the random seed the engine chose
    for t in d["tokens"]:
        check_token(t)
    assert d["prefill"][0]["logprob"] is None and all(isinstance(p["logprob"], float) for p in d["prefill"][1:])
    assert "".join(p["text"] for p in d["prefill"][1:]).strip() == SEED_BODY["inputs"]


def test_seed_sample_stream_has_the_seed_shape(srv):
    body = copy.deepcopy(SEED_BODY)
    body["stream"], body["parameters"]["decoder_input_details"] = True, False
    frames = stream(srv, body)
    assert 0 < len(frames) <= 20
    for f in frames[:-1]:
        assert set(f) == {"token", "generated_text", "details"}
        assert f["generated_text"] is None and f["details"] is None
        check_token(f["token"], list_id=True)
        assert len(f["token"]["id"]) == 1
    last = frames[-1]
    assert last["generated_text"] == "".join(f["token"]["text"] for f in frames)
    assert set(last["details"]) == {"prompt_tokens", "finish_reason", "generated_tokens", "seed"}
    assert last["details"]["generated_tokens"] == len(frames) and last["details"]["seed"] > 0


def test_stream_without_details_ends_with_null_details(srv):
    frames = stream(srv, {"inputs": PROMPT, "stream": True, "parameters": {"max_new_tokens": 4}})
    assert frames[-1]["details"] is None and isinstance(frames[-1]["generated_text"], str)


def test_non_stream_without_details_is_generated_text_only(srv):
    r = srv.post("/", {"inputs": PROMPT, "parameters": {"max_new_tokens": 4}})
    assert list(r.json()[0]) == ["generated_text"]


def test_stream_deltas_concatenate_to_the_non_stream_text(srv):
    whole = greedy(srv)["generated_text"]
    frames = stream(srv, {"inputs": PROMPT, "stream": True, "parameters": {"max_new_tokens": 16}})
    assert "".join(f["token"]["text"] for f in frames) == whole == frames[-1]["generated_text"]


@pytest.mark.parametrize("prompt", ["北京是中国的首都，上海是", "Emoji time 🎉🚀 and more 😀"])
def test_cjk_and_emoji_stream_deltas_equal_the_non_stream_text(srv, prompt):
    whole = greedy(srv, prompt, max_new_tokens=24)["generated_text"]
    frames = stream(srv, {"inputs": prompt, "stream": True, "parameters": {"max_new_tokens": 24}})
    assert "".join(f["token"]["text"] for f in frames) == whole


def test_full_text_enabled_frames_carry_the_text_so_far(request, tiny_model):
    """Seed sample "stream 2": ServerConfig.fullTextEnabled (the alt server, which also streams int ids)."""
    alt = alt_server(request, tiny_model)
    frames = stream(alt, {"inputs": PROMPT, "stream": True, "parameters": {"max_new_tokens": 6, "details": True}})
    texts = [f["token"]["text"] for f in frames]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert texts[-1] == frames[-1]["generated_text"] and isinstance(frames[0]["token"]["id"], int)


def ids(out):
    return [t["id"] for t in out["details"]["tokens"]]


def test_seeded_sampling_is_reproducible(srv):
    p = {"do_sample": True, "temperature": 1.5, "seed": 1234}
    a, b = greedy(srv, **p), greedy(srv, **p)
    assert a["generated_text"] == b["generated_text"] and a["details"]["seed"] == 1234
    assert ids(a) == ids(b)
    # The seed decides the draw: another seed, and greedy decoding, give other tokens (a server that always
    # decoded greedily, or ignored the seed, would pass the check above).
    assert ids(greedy(srv, **{**p, "seed": 4321})) != ids(a)
    assert ids(greedy(srv)) != ids(a)


def test_stop_sequence_is_cut_from_the_output(srv):
    text = greedy(srv, max_new_tokens=24)["generated_text"]
    stop = text[len(text) // 2: len(text) // 2 + 3]
    assert stop.strip(), text
    expected = text[: text.index(stop)]
    out = greedy(srv, max_new_tokens=24, stop=stop)
    assert out["details"]["finish_reason"] == "stop_sequence" and out["generated_text"] == expected
    frames = stream(srv, {"inputs": PROMPT, "stream": True, "parameters": {"max_new_tokens": 24, "stop": [stop]}})
    assert "".join(f["token"]["text"] for f in frames) == expected == frames[-1]["generated_text"]


def test_return_full_text_prepends_the_inputs(srv):
    plain = greedy(srv)["generated_text"]
    assert greedy(srv, return_full_text=True)["generated_text"] == PROMPT + plain


def test_output_is_capped_by_max_iter_times(srv):
    d = greedy(srv, max_new_tokens=100000)["details"]
    assert d["generated_tokens"] <= 128  # ScheduleConfig.maxIterTimes of the test config
    assert d["finish_reason"] == "length" or d["generated_tokens"] < 128


def test_input_longer_than_max_input_token_len_is_a_422_naming_count_and_limit(srv):
    r = srv.post("/", {"inputs": "word " * 400})
    assert r.status_code == 422 and r.json()["error_type"] == "validation"
    assert "at most 256 tokens" in r.json()["error"]
    r = srv.post("/", {"inputs": "word " * 400, "parameters": {"truncate": 10, "details": True,
                                                                "max_new_tokens": 2}})
    assert r.status_code == 200 and r.json()[0]["details"]["prompt_tokens"] == 10


def test_top_n_tokens_and_best_of_on_root(srv):
    r = srv.post("/", {"inputs": PROMPT, "parameters": {"max_new_tokens": 4, "details": True, "top_n_tokens": 3,
                                                        "best_of": 2, "do_sample": True}})
    assert r.status_code == 200, r.text
    d = r.json()[0]["details"]
    assert all(len(tops) == 3 for tops in d["top_tokens"])
    assert len(d["best_of_sequences"]) == 1
    assert len(d["top_tokens"]) == d["generated_tokens"] == len(d["tokens"])  # one list per generated token
    for tok, tops in zip(d["tokens"], d["top_tokens"]):
        lps = [t["logprob"] for t in tops]
        assert lps == sorted(lps, reverse=True) and tok["logprob"] <= lps[0] + 1e-6
    g = srv.post("/", {"inputs": PROMPT, "parameters": {"max_new_tokens": 4, "details": True, "top_n_tokens": 3}})
    d = g.json()[0]["details"]
    assert len(d["top_tokens"]) == d["generated_tokens"] == 4
    for tok, tops in zip(d["tokens"], d["top_tokens"]):  # greedy: the chosen token is the most likely one
        assert tops[0]["id"] == tok["id"] and tops[0]["logprob"] == pytest.approx(tok["logprob"], abs=1e-6)


def test_logprobs_equal_transformers_log_softmax(srv, tiny_model):
    """Every generated and prompt token's logprob against transformers' log_softmax over the same weights."""
    import torch
    from transformers import AutoModelForCausalLM

    r = srv.post("/generate", {"inputs": PROMPT, "parameters": {"max_new_tokens": 8, "details": True,
                                                                "decoder_input_details": True}})
    assert r.status_code == 200, r.text
    d = r.json()["details"]
    prompt_ids, gen_ids = [t["id"] for t in d["prefill"]], [t["id"] for t in d["tokens"]]
    hf = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    with torch.inference_mode():
        logp = hf(torch.tensor([prompt_ids + gen_ids])).logits[0].log_softmax(-1)
    seq = prompt_ids + gen_ids
    want = [logp[i - 1, seq[i]].item() for i in range(1, len(seq))]
    got = [t["logprob"] for t in d["prefill"][1:]] + [t["logprob"] for t in d["tokens"]]
    assert got == pytest.approx(want, abs=1e-4)


# -- TGI routes ------------------------------------------------------------------------------------
def test_tgi_generate_returns_one_object(srv):
    r = srv.post("/generate", {"inputs": PROMPT, "parameters": {"max_new_tokens": 5, "details": True}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"generated_text", "details"}
    d = body["details"]
    assert d["prefill"] == [] and d["seed"] is None and d["generated_tokens"] == len(d["tokens"])
    r = srv.post("/generate", {"inputs": PROMPT, "parameters": {"max_new_tokens": 5, "decoder_input_details": True}})
    assert len(r.json()["details"]["prefill"]) > 1
    assert r.json()["generated_text"] == body["generated_text"]


def test_tgi_generate_stream_frames_have_integer_ids(srv):
    frames = stream(srv, {"inputs": PROMPT, "parameters": {"max_new_tokens": 5, "details": True}}, "/generate_stream")
    for f in frames:
        check_token(f["token"])
    assert frames[-1]["details"]["generated_tokens"] == len(frames)
    assert set(frames[-1]["details"]) == {"finish_reason", "generated_tokens", "seed"}


def test_tgi_generate_best_of_returns_best_of_sequences(srv):
    r = srv.post("/generate", {"inputs": PROMPT, "parameters": {"max_new_tokens": 6, "details": True, "best_of": 3,
                                                                "do_sample": True}})
    assert r.status_code == 200, r.text
    seqs = r.json()["details"]["best_of_sequences"]
    assert len(seqs) == 2 and all(s["seed"] for s in seqs)
    r = srv.post("/generate_stream", {"inputs": PROMPT, "parameters": {"best_of": 2, "do_sample": True}})
    assert r.status_code == 422 and "best_of must be 1 when stream is true" in r.json()["error"]


def test_info_has_every_required_field_with_real_values(srv):
    info = srv.get("/info").json()
    required = ["model_id", "model_dtype", "model_device_type", "max_concurrent_requests", "max_best_of",
                "max_stop_sequences", "max_input_length", "max_total_tokens", "waiting_served_ratio",
                "max_batch_total_tokens", "max_waiting_tokens", "validation_workers", "version"]
    assert all(k in info for k in required)
    assert info["model_id"] == "tiny" and info["model_device_type"] == "cpu" and info["model_dtype"] == "torch.float32"
    assert info["max_input_length"] == 256 and info["max_total_tokens"] == 512 and info["max_concurrent_requests"] == 64
    assert info["max_batch_total_tokens"] == 256 * 16
    assert isinstance(info["rss_mib"], int) and info["rss_mib"] > 0  # the process's RSS, as the ready line reads it
    assert srv.get("/info", "management").json()["model_id"] == "tiny"


def test_health_and_management_routes(srv):
    assert srv.get("/health").status_code == 200
    assert srv.get("/health", "management").status_code == 200
    assert srv.get("/v2/health/live", "management").status_code == 200
    assert srv.get("/v2/health/ready", "management").status_code == 200
    cfg = srv.get("/v1/config", "management").json()
    assert cfg["modelName"] == "tiny" and cfg["maxSeqLen"] == 512 and cfg["maxOutputLen"] == 128
    assert cfg["cacheBlockSize"] == 16
    st = srv.status()
    assert st["blocks"]["total"] == 256 and set(st["requests"]) >= {"running", "waiting", "swapped"}
    # management routes live on the management port only
    assert srv.get("/v1/status").status_code == 404
    assert srv.post("/stopService", {}).status_code == 403


def test_tokenizer_route(srv):
    r = srv.post("/v1/tokenizer", {"inputs": PROMPT})
    assert r.status_code == 200
    body = r.json()
    assert body["token_number"] == len(body["tokens"]) > 1
    assert greedy(srv)["details"]["prompt_tokens"] == body["token_number"]


def test_metrics_use_mindie_names_labelled_by_model(srv):
    greedy(srv)
    text = srv.get("/metrics", "metrics").text
    for name in ("request_received_total", "request_success_total", "request_failed_total", "num_requests_running",
                 "num_requests_waiting", "num_requests_swapped", "prompt_tokens_total", "generation_tokens_total",
                 "npu_cache_usage_perc", "npu_prefix_cache_hit_rate", "num_preemptions_total",
                 "time_to_first_token_seconds_bucket", "time_per_output_token_seconds_bucket",
                 "e2e_request_latency_seconds_bucket", "request_prompt_tokens_bucket",
                 "request_generation_tokens_bucket"):
        assert f'{name}{{' in text and f'model_name="tiny"' in text, name
    values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line and not line.startswith("#") and "_bucket" not in line}
    assert values["request_received_total"] >= 1 and values["generation_tokens_total"] >= 1
    assert srv.get("/metrics").status_code == 404  # the metrics port only


def scrape(srv) -> dict[tuple[str, str], float]:
    """Every sample of the metrics page: (name, labels) -> value."""
    out = {}
    for line in srv.get("/metrics", "metrics").text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            name, _, labels = series.partition("{")
            out[(name, labels.rstrip("}"))] = float(value)
    return out


HISTOGRAMS = ("time_to_first_token_seconds", "time_per_output_token_seconds", "e2e_request_latency_seconds",
              "request_prompt_tokens", "request_generation_tokens")


def test_metrics_move_by_exactly_one_request_per_model(srv):
    label = 'model_name="tiny"'
    before = scrape(srv)
    d = greedy(srv, max_new_tokens=6)["details"]
    after = scrape(srv)

    def delta(name: str) -> float:
        return after[(name, label)] - before.get((name, label), 0.0)

    assert delta("request_received_total") == 1 and delta("request_success_total") == 1
    assert delta("request_failed_total") == 0
    assert delta("prompt_tokens_total") == d["prompt_tokens"] and delta("generation_tokens_total") == 6
    for h in HISTOGRAMS:
        assert delta(f"{h}_count") == 1, h
    assert delta("request_prompt_tokens_sum") == d["prompt_tokens"] and delta("request_generation_tokens_sum") == 6
    # every sample of ours is labelled with the model's name and nothing else
    ours = {name for name, _ in after if not name.startswith(("python_", "process_"))}
    unlabelled = [(name, labels) for name, labels in after if name in ours and label not in labels.split(",")]
    assert not unlabelled


# -- errors ----------------------------------------------------------------------------------------
def error(r, status, error_type):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "error_type"} and body["error_type"] == error_type
    return body["error"]


def test_validation_error_names_parameter_rule_and_value(srv):
    msg = error(srv.post("/", {"inputs": "hi", "parameters": {"max_new_tokens": 0}}), 422, "validation")
    assert msg == "Parameter max_new_tokens must be in (0, 2147483647], got 0"
    error(srv.post("/generate", {"inputs": "hi", "parameters": {"top_p": 1.5}}), 422, "validation")
    error(srv.post("/generate_stream", {"inputs": "hi", "parameters": {"temperature": 0}}), 422, "validation")


def test_media_list_inputs_on_a_text_model_are_a_clear_422(srv):
    body = {"inputs": [{"type": "text", "text": "hi"}, {"type": "audio_url", "audio_url": "/x.wav"}]}
    msg = error(srv.post("/", body), 422, "validation")
    assert "inputs[1]" in msg and "audio" in msg


def test_decoder_input_details_with_stream_is_a_422(srv):
    body = {"inputs": "hi", "stream": True, "parameters": {"decoder_input_details": True}}
    error(srv.post("/", body), 422, "validation")


def test_unknown_adapter_is_a_422(srv):
    assert "adapter_id" in error(srv.post("/", {"inputs": "hi", "parameters": {"adapter_id": "x"}}), 422, "validation")


def test_malformed_json_and_wrong_content_type_are_400(srv):
    r = requests.post(srv.url() + "/", data=b'{"inputs": ', headers={"Content-Type": "application/json"}, timeout=10)
    error(r, 400, "validation")
    r = requests.post(srv.url() + "/", data=b'{"inputs": "hi"}', headers={"Content-Type": "text/plain"}, timeout=10)
    assert "Content-Type" in error(r, 400, "validation")


def test_unknown_route_404_and_wrong_method_405(srv):
    error(srv.get("/nope"), 404, "not_found")
    r = srv.post("/v1/nope", {})  # under /v1/: OpenAI's shape, so OpenAI clients show the message
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error", r.text
    assert r.json()["error"]["code"] == "not_found" and "unknown route" in r.json()["error"]["message"]
    error(srv.get("/generate"), 405, "method_not_allowed")
    error(requests.delete(srv.url() + "/", timeout=10), 405, "method_not_allowed")


def test_body_over_max_request_length_is_413(srv):
    big = b'{"inputs": "' + b"a" * (1024 * 1024 + 10) + b'"}'
    r = requests.post(srv.url() + "/", data=big, headers={"Content-Type": "application/json"}, timeout=30)
    assert "maxRequestLength" in error(r, 413, "validation")
    assert greedy(srv)["generated_text"] is not None  # still serving


def test_failed_requests_are_counted(srv):
    before = srv.get("/metrics", "metrics").text
    srv.post("/", {"inputs": "hi", "parameters": {"max_new_tokens": -1}})
    after = srv.get("/metrics", "metrics").text

    def failed(text):
        return float(next(line for line in text.splitlines() if line.startswith("request_failed_total")).split()[-1])

    assert failed(after) == failed(before) + 1
