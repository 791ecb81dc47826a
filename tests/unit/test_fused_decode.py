"""A decode step in one C call (npu_ops/csrc/decode_f32.c, models/fused_decode.py): the same tokens and the very
same log-probabilities (so the same logits, bit for bit) as the op-by-op step around the fused layers, for
batched decode rows of different lengths, with the fp32 head and with the W8I16 head over W8A8 layers; steps it
does not take (prefills, LoRA, drafts) still run; a bad token id fails the call, not the process."""
from __future__ import annotations

import pytest
import torch

from mindie_service import LLM, SamplingParams
from mindie_service.engine.runner.model_runner import ModelRunner
from npu_ops import cpu_kernels

# a team of two threads, whatever the worker's: the fused decoder's splits and barriers are under test
pytestmark = [
    pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here"),
    pytest.mark.usefixtures("two_threads"),
]

PROMPTS = [[5, 9, 13, 2, 7], list(range(3, 40)), [11] * 20]


def _generate(llm: LLM) -> list[tuple[list[int], list[dict]]]:
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=5)
    out = llm.generate(PROMPTS, [params] * len(PROMPTS), use_tqdm=False)
    return [(list(o.outputs[0].token_ids), [dict(lp) for lp in o.outputs[0].logprobs])
            for o in out]


def count_fused_steps(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Spies on the runner's fused decode step: one entry a decode step, True where the one C call ran it."""
    calls: list[bool] = []
    real = ModelRunner._fused_decode

    def spy(self: ModelRunner, decodes: list) -> torch.Tensor | None:
        got = real(self, decodes)
        calls.append(got is not None)
        return got

    monkeypatch.setattr(ModelRunner, "_fused_decode", spy)
    return calls


@pytest.mark.parametrize("quantization", [None, "w8a8"])
def test_fused_decode_step_gives_the_op_by_op_logits(tiny_model, quantization, monkeypatch):
    llm = LLM(str(tiny_model), dtype="float32", cache_block_size=4, num_kv_blocks=128, max_seq_len=256,
              quantization=quantization, quantize_lm_head=quantization is not None)
    calls = count_fused_steps(monkeypatch)
    fused = _generate(llm)
    assert sum(calls) >= 11  # the decode steps took the C call
    monkeypatch.setattr(ModelRunner, "_fused_decode", lambda self, decodes: None)
    assert _generate(llm) == fused


def test_a_bad_token_id_fails_the_call(tiny_model):
    llm = LLM(str(tiny_model), dtype="float32", cache_block_size=4, num_kv_blocks=64, max_seq_len=128)
    runner = llm.engine.runner
    assert runner.fused is not None and runner.fused.usable(1)
    with pytest.raises(RuntimeError, match="code 4"):
        runner.fused.run([runner.model.dims.vocab], [0], [0], [(1,)])
    with pytest.raises(RuntimeError, match="code 4"):
        runner.fused.run([1], [10 ** 6], [0], [(1,)])
