"""tools/profile_decode.py on a small packed GGUF: it finds every packed GEMV of each kind (one a layer, the head
once) and counts the bytes each kind's pass reads as the file stores them, so its GB/s and share of the triad are
the weights' own. No timing is asserted (the machine may be loaded)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from mindie_service import LLM
from npu_ops import cpu_kernels
from tests.gguf_files import write_gguf

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")

ROOT = Path(__file__).resolve().parents[2]
KIND_TENSORS = {"qkv_proj": ("attn_q", "attn_k", "attn_v"), "o_proj": ("attn_output",),
                "gate_up_proj": ("ffn_gate", "ffn_up"), "down_proj": ("ffn_down",)}


@pytest.fixture(scope="module")
def tool():
    saved = list(sys.path)
    spec = importlib.util.spec_from_file_location("profile_decode", ROOT / "tools" / "profile_decode.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up there
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = saved
    yield mod
    sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def small_gguf(tiny_model, tmp_path_factory) -> Path:
    T = gguf.GGMLQuantizationType
    types = {"token_embd.weight": T.Q8_0, "output.weight": T.Q8_0}
    for b in range(4):
        types.update({f"blk.{b}.{n}.weight": T.Q4_0 for n in ("attn_q", "attn_k", "attn_v", "attn_output",
                                                               "ffn_gate", "ffn_up")})
        types[f"blk.{b}.ffn_down.weight"] = T.Q4_1
    return write_gguf(Path(tiny_model), tmp_path_factory.mktemp("gguf") / "small-q.gguf", types)


def test_every_packed_gemv_is_found_and_its_bytes_counted(tool, small_gguf):
    llm = LLM(str(small_gguf), dtype="float32", cache_block_size=4, num_kv_blocks=64, max_seq_len=128)
    kinds = tool.linears(llm.engine.runner.model)
    layers = len(llm.engine.runner.model.layers)
    assert {k: len(v) for k, v in kinds.items()} == {**{k: layers for k in KIND_TENSORS}, "lm_head": 1}
    stored = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(small_gguf)).tensors}
    want = {k: sum(stored[f"blk.{b}.{n}.weight"] for b in range(layers) for n in names)
            for k, names in KIND_TENSORS.items()}
    want["lm_head"] = stored["output.weight"]
    passes, triad = tool.gemv_passes(kinds, rounds=1, threads=1)
    assert {p.kind: p.nbytes for p in passes} == want
    assert {p.kind: p.calls for p in passes} == {k: len(v) for k, v in kinds.items()}
    assert triad > 0
    text = tool.report(10.0, 8.0, passes, 0.5, triad)
    assert all(k in text for k in want) and "Python between the C calls 2.00 ms" in text
