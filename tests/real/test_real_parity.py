"""SmolLM2-135M-Instruct from its .gguf: our engine matches transformers loading the same file (fp32),
greedy token for token and prompt log-probs within 1e-4, on 5 plain and 5 chat prompts."""
from __future__ import annotations

import pytest
import torch

from mindie_service import SamplingParams

MAX_TOKENS = 32
LOGPROB_TOL = 1e-4

PLAIN = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The three primary colours are",
    "Water boils at 100 degrees Celsius because",
]
CHAT = [
    "What is the capital of France?",
    "Give me three tips for learning to cook.",
    "Write a haiku about autumn leaves.",
    "Explain in two sentences what a neural network is.",
    "How many legs does a spider have?",
]


@pytest.fixture(scope="module")
def prompt_ids(hf_smollm) -> list[list[int]]:
    """Plain prompts tokenized as they are; chat prompts rendered by the GGUF's own chat template (which
    writes <|im_start|> itself, so no special tokens are added on top)."""
    tok, _ = hf_smollm
    ids = [tok(p).input_ids for p in PLAIN]
    for q in CHAT:
        text = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        ids.append(tok(text, add_special_tokens=False).input_ids)
    return ids


@pytest.fixture(scope="module")
def hf_greedy(hf_smollm, prompt_ids) -> list[list[int]]:
    tok, model = hf_smollm
    outs = []
    with torch.inference_mode():
        for ids in prompt_ids:
            x = torch.tensor([ids])
            gen = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_TOKENS, do_sample=False,
                                 pad_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
            outs.append(gen[0, len(ids):].tolist())
    return outs


def test_tokenizer_and_template_come_from_the_gguf(smollm_llm, hf_smollm):
    tok = smollm_llm.tokenizer
    assert tok.bos_token == "<|im_start|>" and tok.eos_token == "<|im_end|>"
    assert "<|im_start|>assistant" in (tok.chat_template or "")
    for p in PLAIN:
        assert tok(p).input_ids == hf_smollm[0](p).input_ids


def test_greedy_matches_transformers_on_the_same_gguf(smollm_llm, prompt_ids, hf_greedy):
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    outs = smollm_llm.generate(prompt_ids, params, use_tqdm=False)
    got = [o.outputs[0].token_ids for o in outs]
    same = sum(g == w for g, w in zip(got, hf_greedy))
    print(f"\ngreedy parity with transformers (same .gguf, fp32): {same}/{len(got)} prompts token-identical")
    for i, (g, w) in enumerate(zip(got, hf_greedy)):
        assert g == w, f"prompt {i}: ours {g} != transformers {w}"
    capital = outs[len(PLAIN)].outputs[0].text
    assert "Paris" in capital, capital


def test_prompt_logprobs_match_transformers(smollm_llm, hf_smollm, prompt_ids):
    _, model = hf_smollm
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=True)
    outs = smollm_llm.generate(prompt_ids, params, use_tqdm=False)
    worst, n = 0.0, 0
    with torch.inference_mode():
        for ids, o in zip(prompt_ids, outs):
            logits = model(torch.tensor([ids])).logits[0].float()
            want = torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
            got = torch.tensor(o.prompt_logprobs[1:], dtype=torch.float32)
            assert o.prompt_logprobs[0] is None and got.shape == want.shape
            worst = max(worst, (got - want).abs().max().item())
            n += len(ids) - 1
    print(f"\nprompt log-probs vs transformers: max |diff| {worst:.2e} per token over {n} tokens")
    assert worst <= LOGPROB_TOL
