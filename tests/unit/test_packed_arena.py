"""The packed weights' huge-page arena (npu_ops.memory.HugeArena, models.packed_arena): copies in order, aligned,
equal to their originals, and a loaded model's packed weights all in one arena in the order a step reads them."""
from __future__ import annotations

import pytest
import torch

from mindie_service.models.loader import load_model
from mindie_service.models.packed_arena import _cpu_packed
from npu_ops import cpu_kernels
from npu_ops.memory import HugeArena


def test_arena_copies_in_order_aligned_and_equal():
    ts = [torch.randn(3, 5), torch.randint(-127, 128, (77,), dtype=torch.int8), torch.randn(1000)]
    arena = HugeArena(HugeArena.room(ts))
    copies = [arena.copy_in(t) for t in ts]
    for t, c in zip(ts, copies):
        assert torch.equal(t, c) and c.dtype == t.dtype and c.shape == t.shape and c.data_ptr() % 64 == 0
        assert c.untyped_storage().data_ptr() == arena.buf.untyped_storage().data_ptr()
    assert [c.data_ptr() for c in copies] == sorted(c.data_ptr() for c in copies)
    assert copies[0].data_ptr() % (2 << 20) == 0  # the arena starts on a huge page
    with pytest.raises(ValueError, match="arena full"):
        arena.copy_in(torch.zeros(64))


@pytest.mark.skipif(cpu_kernels.load() is None, reason="no C compiler: nothing is packed")
@pytest.mark.parametrize("quantization", [None, "w8a8"])
def test_loaded_packed_weights_share_one_arena_in_step_order(tiny_model, quantization):
    model = load_model(tiny_model, "float32", torch.device("cpu"), 64, quantization=quantization,
                       quantize_lm_head=quantization is not None).model
    packed = [m.packed for m in model.modules() if _cpu_packed(m)]
    assert len(packed) == 4 * model.dims.layers + 1  # every projection and the head
    assert len({p.untyped_storage().data_ptr() for p in packed}) == 1
    ptrs = [p.data_ptr() for p in packed]
    assert ptrs == sorted(ptrs) and ptrs[0] < model.layers[-1].mlp.down_proj.packed.data_ptr() < ptrs[-1]
