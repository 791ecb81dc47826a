"""SmolLM2-135M-Instruct with an int8 KV cache: the fused decoder (one C call per step, npu_ops/csrc/layers_f32.c,
quantizing K/V in the loop; a lone row's attention over the whole team, attention_lone_i8.c) gives the very same
tokens and log-probabilities as the op-by-op path (quant_kv's quantize, paged_attention_rows_i8), for one stream
(with multi-step bursts, and step by step with log-probs) and for a batch of decode rows."""
from __future__ import annotations

import pytest

from mindie_service import LLM, SamplingParams
from mindie_service.engine.sched.bursts import BurstPacer
from mindie_service.models import fused_layers
from npu_ops import cpu_kernels

pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")

PROMPTS = ["The capital of France is", "Once upon a time, in a small village by the sea, there lived"]


@pytest.fixture(scope="module")
def kv8_llm(smollm_gguf) -> LLM:
    return LLM(str(smollm_gguf), max_seq_len=256, num_kv_blocks=48, cache_block_size=16, max_batch_size=4,
               kv_cache_dtype="int8")


def _outputs(llm: LLM, fused: bool, batched: bool, logprobs: int | None) -> list[tuple]:
    ids = [llm.tokenizer(p).input_ids for p in PROMPTS]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, logprobs=logprobs)
    fused_layers.set_enabled(fused)
    try:
        outs = (llm.generate(ids, [params] * len(ids), use_tqdm=False) if batched
                else [llm.generate([p], [params], use_tqdm=False)[0] for p in ids])
    finally:
        fused_layers.set_enabled(True)
    return [(list(o.outputs[0].token_ids), [dict(lp) for lp in o.outputs[0].logprobs or []]) for o in outs]


@pytest.mark.parametrize("batched,logprobs", [(False, None), (False, 2), (True, 2)])
def test_int8_kv_cache_fused_equals_op_by_op(kv8_llm, batched, logprobs, monkeypatch):
    # bursts are paced by the measured step time: on a busy machine SmolLM2's steps took over half of the burst
    # budget and ran one a call, so the bursts' C call was never made. A step clock that stands still pins the
    # pacer to decodeSteps (a fresh pacer: the module's engine keeps its history between tests).
    monkeypatch.setattr(kv8_llm.engine, "step_clock", lambda: 0.0)
    monkeypatch.setattr(kv8_llm.engine, "bursts", BurstPacer(kv8_llm.engine.bursts.configured))
    calls: list[int] = []
    lib = cpu_kernels.load()
    real = lib.llama_decode_steps_f32 if logprobs is None else lib.llama_decode_f32
    name = "llama_decode_steps_f32" if logprobs is None else "llama_decode_f32"
    monkeypatch.setattr(lib, name, lambda *a: calls.append(1) or real(*a))
    fused = _outputs(kv8_llm, True, batched, logprobs)
    assert calls  # one stream in bursts (no log-probs), else a C decode step at a time
    assert _outputs(kv8_llm, False, batched, logprobs) == fused
