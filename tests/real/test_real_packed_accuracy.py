"""SmolLM2-135M-Instruct's Q4_1 file served from its blocks (models/gguf_packed.py) against the same file dequantized
at load (our fp32 path over gguf.quants.dequantize): 511 teacher-forced predictions over 512 tokens of
real_text.txt. The packed kernels take fp32 activations and dequantize each weight to exactly the reference's value,
so only the order of the fp32 sums differs: the bound is top-1 agreement >= 99.8% (at most one near-tie of 511
flipped), mean KL(reference || packed) < 1e-6 nats and the NLLs within 1e-4 nats a token."""
from __future__ import annotations

import torch

from mindie_service.devkit.quant_eval import teacher_forced_logprobs
from mindie_service.models.gguf_checkpoint import load_tokenizer

N_TOKENS = 512


def test_packed_q4_1_matches_the_dequantized_reference_on_real_text(smollm_gguf, real_text):
    tokens = load_tokenizer(smollm_gguf)(real_text).input_ids[:N_TOKENS]
    assert len(tokens) == N_TOKENS
    ref = teacher_forced_logprobs(smollm_gguf, tokens, seq_len=N_TOKENS, chunk=128, gguf_packed=False)
    got = teacher_forced_logprobs(smollm_gguf, tokens, seq_len=N_TOKENS, chunk=128)
    targets = torch.tensor(tokens[1:])[:, None]
    top1 = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    kl = (ref.exp() * (ref - got)).sum(-1).mean().item()
    nll_ref, nll_got = -ref.gather(1, targets).mean().item(), -got.gather(1, targets).mean().item()
    print(f"\npacked Q4_1 vs dequantized fp32, {len(targets)} positions: top-1 agreement {top1:.4f}, mean KL "
          f"{kl:.3e}, NLL {nll_got:.5f} vs {nll_ref:.5f}, max |log-prob diff| {(got - ref).abs().max().item():.2e}")
    assert top1 >= 0.998 and abs(kl) < 1e-6 and abs(nll_got - nll_ref) < 1e-4
