"""Every Triton kernel compiles for a Hopper GPU (sm_90) down to machine code, here without a GPU: Triton's compiler
and its bundled ptxas run on the CPU. The interpreter tests hold what the kernels compute; this holds that the real
compiler takes them (types, pointer casts, dot shapes, int8 dots), for the variants the engine launches. Run in a
process of its own: a kernel decorated under TRITON_INTERPRET=1 (another test module's) cannot be compiled."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

ATT = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "out_ptr": "*bf16", "bt_ptr": "*i32", "tiles_ptr": "*i32",
       "scale": "fp32", "stride_qt": "i32", "stride_qh": "i32", "stride_ot": "i32", "stride_oh": "i32",
       "bt_width": "i32", "block_size": "i32", "kv_heads": "i32"}
KV = {"k_ptr": "*bf16", "v_ptr": "*bf16", "kc_ptr": "*i8", "vc_ptr": "*i8", "slot_ptr": "*i64", "stride_kt": "i32",
      "stride_kh": "i32", "stride_vt": "i32", "stride_vh": "i32", "kv_heads": "i32"}
# (module, kernel, signature, constexprs): a decode row's lone tile, a prefill tile over int8 pages, both KV writes,
# the fused norm, rotary, the W8A8 matmul
VARIANTS = [
    ("triton_attention", "_tiles_kernel", ATT,
     {"GROUP": 4, "HEAD_DIM": 64, "ROW": 64, "QUANT": False, "GP": 16, "DP": 64, "BLOCK_M": 1, "BLOCK_N": 32}),
    ("triton_attention", "_tiles_kernel", {**ATT, "k_ptr": "*i8", "v_ptr": "*i8"},
     {"GROUP": 3, "HEAD_DIM": 24, "ROW": 28, "QUANT": True, "GP": 4, "DP": 32, "BLOCK_M": 16, "BLOCK_N": 32}),
    ("triton_kv_write", "_write_kernel", KV, {"HEAD_DIM": 64, "ROW": 68, "QUANT": True, "HP": 8, "DP": 64}),
    ("triton_kv_write", "_write_kernel", {**KV, "kc_ptr": "*fp16", "vc_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16"},
     {"HEAD_DIM": 64, "ROW": 64, "QUANT": False, "HP": 8, "DP": 64}),
    ("triton_rms_norm", "_rms_kernel", {"x_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16",
                                        "res_out_ptr": "*bf16", "stride_x": "i32", "stride_r": "i32", "n": "i32",
                                        "eps": "fp32"}, {"HAS_RES": True, "BLOCK": 2048}),
    ("triton_rotary", "_rotary_kernel", {"x_ptr": "*bf16", "cos_ptr": "*bf16", "sin_ptr": "*bf16", "out_ptr": "*bf16",
                                         "stride_xt": "i32", "stride_xh": "i32", "stride_ct": "i32", "stride_st": "i32",
                                         "heads": "i32"}, {"HALF": 32, "HP": 64, "DP": 32}),
    ("triton_w8a8", "_w8a8_kernel", {"x_ptr": "*i8", "w_ptr": "*i8", "xs_ptr": "*fp32", "ws_ptr": "*fp32",
                                     "b_ptr": "*fp32", "y_ptr": "*bf16", "m": "i32", "n": "i32", "k": "i32"},
     {"HAS_BIAS": True, "BM": 16, "BN": 64, "BK": 64}),
]


def compile_all() -> list[str]:
    """Each variant's name with the stages it reached ("cubin" last), or its compiler error."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    results = []
    for module, kernel, sig, const in VARIANTS:
        fn = getattr(importlib.import_module(f"npu_ops.{module}"), kernel)
        src = ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in const}}, constexprs=const)
        try:
            stages = list(triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm)
            results.append(f"{module}.{kernel} {','.join(stages)}")
        except Exception as exc:  # noqa: BLE001 - reported to the test, which names the variant
            results.append(f"{module}.{kernel} FAILED {type(exc).__name__}: {exc}")
    return results


@pytest.mark.slow
def test_every_kernel_compiles_to_sm90_machine_code():
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TRITON_DEFAULT_FP_FUSION="1", TRITON_CACHE_DIR=os.path.join(
        os.environ.get("TMPDIR", "/tmp"), f"mindie-triton-cache-{os.getuid()}"))
    run = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in run.stdout.splitlines() if line.startswith("triton_")]
    assert run.returncode == 0 and len(lines) == len(VARIANTS), run.stdout + run.stderr[-3000:]
    for line in lines:
        assert line.endswith("cubin"), line


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    print("\n".join(compile_all()))
