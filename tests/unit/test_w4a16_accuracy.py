"""W4A16's accuracy against the float model it was made from (devkit/w4a16_eval.py, the engine of
tools/accuracy_w4a16.py) on the tiny demo model: 512 teacher-forced corpus tokens, the float checkpoint requantized at
load (``quantization: w4a16``) and written by the devkit as compressed-tensors (group 128 and channel-wise, symmetric
and asymmetric), AutoAWQ gemm and msModelSlim (ascendV1 and MindIE layouts) checkpoints.

The bound: against its own weights dequantized to float every checkpoint agrees to the order of fp32 sums (top-1 >=
0.998, |KL| < 1e-6: the CPU blocks hold its exact values and take fp32 activations); against the float model, int4
rounding's share on these random weights (measured: top-1 agreement 0.902 asymmetric g128, 0.886 symmetric
channel-wise; mean KL 0.016 and 0.023; NLL within 0.01 of the float model's) is held at top-1 >= 0.85, mean KL <=
0.04 and NLL at most 0.05 above the float model's. The same int4 values in three layouts, and requantized at load,
give the same log-probs."""
from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from mindie_service.devkit.quant_eval import corpus_tokens
from mindie_service.devkit.w4a16_eval import VARIANTS, Bound, evaluate
from npu_ops import cpu_kernels

pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")

BOUND = Bound(min_top1=0.85, max_kl=0.04, max_nll_rise=0.05)
# at load; the writer's asymmetric g128 in compressed-tensors, AutoAWQ and msModelSlim ascendV1 (the same values);
# symmetric channel-wise in msModelSlim's MindIE layout
CHOSEN = ("w4a16 at load (g128 asym)", "compressed-tensors g128 asym", "AutoAWQ gemm g128",
          "msModelSlim ascendV1 g128 asym", "msModelSlim MindIE channel sym")


def test_w4a16_variants_hold_the_bound_against_the_float_model(tiny_model, tmp_path):
    tokens = corpus_tokens(AutoTokenizer.from_pretrained(str(tiny_model)), 512)
    variants = tuple(v for v in VARIANTS if v.name in CHOSEN)
    rows = {a.variant: a for a in evaluate(Path(tiny_model), tokens, tmp_path, variants)}
    assert list(rows) == list(CHOSEN)
    for a in rows.values():
        assert a.positions == 511
        assert not BOUND.failures(a), (a, BOUND.failures(a))
        assert (a.top1_own is None) == (a.variant == CHOSEN[0])
    same = [rows[name] for name in CHOSEN[:4]]
    assert all(a.top1 == same[0].top1 and abs(a.mean_kl - same[0].mean_kl) < 1e-7 and a.nll == same[0].nll
               for a in same), same
