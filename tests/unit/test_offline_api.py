"""The offline API (vLLM's shape): sampling, seeds, caps, stop strings, logprobs, bad input."""
from __future__ import annotations

import json
import math
import shutil

import pytest

from mindie_service import LLM, SamplingParams
from tests.prompts import word_prompts


@pytest.fixture(scope="module")
def llm(tiny_model):
    return LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=512, max_iter_times=64, max_seq_len=512)


def _sampled(seed: int | None, n: int = 24) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.9, top_k=50, top_p=0.9, seed=seed, ignore_eos=True)


def test_seeded_sampling_is_the_same_alone_and_in_a_batch(llm):
    prompts = word_prompts(6, 5, 40, seed=3)
    alone = llm.generate([prompts[0]], _sampled(1234), use_tqdm=False)[0].outputs[0].token_ids
    params = [_sampled(1234)] + [_sampled(None) for _ in prompts[1:]]
    batched = llm.generate(prompts, params, use_tqdm=False)[0].outputs[0].token_ids
    shuffled = llm.generate(prompts[::-1], params[::-1], use_tqdm=False)[-1].outputs[0].token_ids
    assert alone == batched == shuffled
    other = llm.generate([prompts[0]], _sampled(99), use_tqdm=False)[0].outputs[0].token_ids
    assert other != alone  # the seed matters


def test_unseeded_requests_report_a_seed_that_reproduces_them(llm):
    first = llm.generate(["Quiet market engine"], _sampled(None), use_tqdm=False)[0]
    again = llm.generate(["Quiet market engine"], _sampled(first.seed), use_tqdm=False)[0]
    assert first.outputs[0].token_ids == again.outputs[0].token_ids


def test_output_is_capped_by_max_iter_times_and_max_seq_len(tiny_model):
    small = LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=64, max_iter_times=10, max_seq_len=40,
                max_input_token_len=39, max_prefill_tokens=64)
    p = SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True)
    short = small.generate(["River"], p, use_tqdm=False)[0]
    assert len(short.outputs[0].token_ids) == 10 and short.outputs[0].finish_reason == "length"
    long_prompt = " ".join(["river"] * 34)
    out = small.generate([long_prompt], p, use_tqdm=False)[0]
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 40


def test_stop_string_ends_generation_and_is_not_in_the_text(llm):
    p = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    full = llm.generate(["Winter bridge orange violin"], p, use_tqdm=False)[0].outputs[0]
    stop = full.text[10:14]
    assert stop and full.text.index(stop) == 10
    cut = llm.generate(["Winter bridge orange violin"], SamplingParams(max_tokens=40, temperature=0.0,
                       ignore_eos=True, stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert cut.finish_reason == "stop_sequence" and cut.text == full.text[:10]


def test_logprobs_are_real_and_top_n_is_sorted(llm):
    p = SamplingParams(max_tokens=5, temperature=0.0, logprobs=3, prompt_logprobs=True)
    out = llm.generate(["Candle meadow pilot ocean"], p, use_tqdm=False)[0]
    assert out.prompt_logprobs[0] is None and all(lp <= 0 for lp in out.prompt_logprobs[1:])
    for tid, lps in zip(out.outputs[0].token_ids, out.outputs[0].logprobs):
        assert len(lps) == 3  # greedy: the chosen token is the top alternative
        assert max(lps, key=lps.get) == tid
    assert math.isclose(out.outputs[0].cumulative_logprob,
                        sum(d[t] for t, d in zip(out.outputs[0].token_ids, out.outputs[0].logprobs)), rel_tol=1e-5)


@pytest.mark.parametrize("kwargs, needle", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"top_p": 1.5}, "top_p"),
    ({"temperature": -1.0}, "temperature"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"seed": -1}, "seed"),
])
def test_bad_sampling_params_raise_value_error_naming_the_parameter(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        SamplingParams(**kwargs)


def test_empty_prompt_is_a_value_error(llm):
    with pytest.raises(ValueError, match="prompt"):
        llm.generate([""], SamplingParams(), use_tqdm=False)


def test_unknown_model_path_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="model"):
        LLM(str(tmp_path / "nope"))


def test_checkpoint_without_vocab_size_is_a_value_error(tiny_model, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_model, bad)
    cfg = json.loads((bad / "config.json").read_text())
    del cfg["vocab_size"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="vocab_size"):
        LLM(str(bad))


def test_unknown_override_is_a_value_error(tiny_model):
    with pytest.raises(ValueError, match="max_bach_size"):
        LLM(str(tiny_model), max_bach_size=3)


def test_offline_prompts_go_through_the_input_processor(llm):
    ids = llm.tokenizer("River mountain").input_ids
    p = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    by_text, by_ids = llm.generate(["River mountain", ids], p, use_tqdm=False)
    assert by_text.prompt_token_ids == by_ids.prompt_token_ids == ids
    assert by_text.outputs[0].token_ids == by_ids.outputs[0].token_ids
    with pytest.raises(ValueError, match=r"token ids in \[0, "):
        llm.generate([[1, 2, 10**9]], p, use_tqdm=False)
    with pytest.raises(ValueError, match="adapter_id"):
        llm.generate(["River"], p, adapter_id="nope", use_tqdm=False)
    with pytest.raises(ValueError, match="media"):
        llm.generate({"parts": [{"type": "text", "text": "hi"}]}, p, use_tqdm=False)
    with pytest.raises(ValueError, match="at most 511 tokens"):  # maxSeqLen 512: the input limit is 511
        llm.generate(["river " * 600], p, use_tqdm=False)
    # A bad prompt in a batch fails the call before anything is queued.
    with pytest.raises(ValueError):
        llm.generate(["River", [10**9]], p, use_tqdm=False)
    assert not llm.engine.has_work()
    assert llm.generate(["River"], SamplingParams(adapter_id="None", max_tokens=2), use_tqdm=False)[0].outputs


def test_request_metrics_stamp_arrival_first_and_last_token(llm):
    """RequestOutput.metrics (vLLM's times): arrival <= first token < last token, and a request that finishes
    earlier in the same batch has its last token stamped earlier."""
    import time
    before = time.time()
    short, long = llm.generate(["Amber canyon", "Amber canyon river"],
                               [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (2, 24)],
                               use_tqdm=False)
    after = time.time()
    for out in (short, long):
        m = out.metrics
        assert before <= m["arrival_time"] <= m["first_token_time"] <= m["last_token_time"] <= after
    assert long.metrics["first_token_time"] < long.metrics["last_token_time"]
    assert short.metrics["last_token_time"] < long.metrics["last_token_time"]
