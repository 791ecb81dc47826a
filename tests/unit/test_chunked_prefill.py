"""Chunked prefill through the real engine: maxPrefillTokens is one step's prompt-token budget.

A long prompt is computed over several steps while running requests keep decoding, and the
tokens are the same as with one whole prefill (and as transformers')."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from mindie_service import LLM, SamplingParams
from mindie_service.engine.contract import EngineRequest
from tests.prompts import word_prompts

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def _long_ids(llm: LLM, n: int) -> list[int]:
    text = " ".join(word_prompts(1, n, n, seed=7)[0] for _ in range(3))
    ids = llm.tokenizer(text).input_ids
    assert len(ids) >= n
    return ids[:n]


def test_long_prompt_does_not_stall_a_running_stream(tiny_model):
    """With maxPrefillTokens=256 a 2,000-token prompt takes 8 steps, and a stream that was already
    running gets its next token in each of them: it waits one chunk, not the whole prefill."""
    llm = LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=400, max_seq_len=2560,
              max_input_token_len=2048, max_prefill_tokens=256)
    eng = llm.engine
    eng.add_request(EngineRequest("stream", tuple(llm.tokenizer("River mountain city").input_ids),
                                  SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)))
    eng.step()  # the stream is running
    eng.add_request(EngineRequest("long", tuple(_long_ids(llm, 2000)), GREEDY))
    steps: list[list[str]] = []
    while True:
        events = eng.step()
        steps.append([ev.request_id for ev in events])
        if "long" in steps[-1]:
            break
    assert len(steps) == 8  # ceil(2000 / 256) chunks, the last one samples
    assert all("stream" in s for s in steps)  # a token every step
    assert steps[-1] == ["stream", "long"]


def test_chunked_prefill_matches_transformers_and_whole_prefill(tiny_model):
    """Chunks that end mid-block (37 tokens, blocks of 16) and prompts that also hit the prefix cache."""
    whole = LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=512, max_prefill_tokens=4096)
    chunked = LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=512, max_prefill_tokens=37)
    prompts = word_prompts(6, 40, 150, seed=3)
    prompts += [prompts[0] + " and then the river", prompts[1] + " ocean castle"]  # prefix-cache hits
    a = [o.outputs[0].token_ids for o in whole.generate(prompts, GREEDY, use_tqdm=False)]
    b = [o.outputs[0].token_ids for o in chunked.generate(prompts, GREEDY, use_tqdm=False)]
    assert a == b
    hf = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    with torch.inference_mode():
        for p, got in zip(prompts[:2], b):
            ids = chunked.tokenizer(p, return_tensors="pt").input_ids
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, min_new_tokens=12,
                              do_sample=False, pad_token_id=chunked.tokenizer.pad_token_id)
            assert got == ref[0, ids.shape[1]:].tolist()
    assert chunked.engine.stats().free_blocks == 512


@pytest.mark.parametrize("budget", [5, 64])
def test_prompt_logprobs_are_gathered_across_chunks(tiny_model, budget):
    prompt = word_prompts(1, 30, 30, seed=4)[0]
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, prompt_logprobs=True)
    ref = LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=64).generate(prompt, params, use_tqdm=False)[0]
    got = LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=64,
              max_prefill_tokens=budget).generate(prompt, params, use_tqdm=False)[0]
    assert got.prompt_logprobs[0] is None and None not in got.prompt_logprobs[1:]
    assert len(got.prompt_logprobs) == len(got.prompt_token_ids)
    assert got.prompt_logprobs[1:] == pytest.approx(ref.prompt_logprobs[1:], abs=1e-4)
    assert got.outputs[0].token_ids == ref.outputs[0].token_ids
