#!/usr/bin/env python3
"""llama.cpp side of tools/bench_quant.py; runs in llama-cpp-python's own venv (kept outside the repo).

Continuous batching through the low-level API: one context with ``n_seq_max = P`` slots; each step is
one ``llama_decode`` over a batch holding every decoding sequence's next token plus prompt chunks of
newly admitted sequences (up to ``n_batch`` tokens), greedy sampling from each sequence's logits row,
EOS ignored. Reads the workload (prompt token ids, output lengths) as JSON on stdin, prints
``{"tok_s": ..., "decode_tok_s": ..., "slots": P}`` per P, one JSON line each (decode_tok_s: tokens after each
request's first over the time from its first token to its last, i.e. without its prefill). With
``--probe-bytes B``, one slot: each decode step is followed by a read of B bytes (tools/membw.py), and one line
``{"step_s": ..., "probe_s": ..., "triad_s": ..., "steps": ...}`` gives the paired shares of the bandwidth bounds
(``--triad-bytes``: a STREAM triad moving that many bytes after the read). With ``--rss``, a last line
``{"rss_load": ..., "rss_end": ...}``: resident bytes after the model loaded and at the end (every weight touched).

    python llamacpp_harness.py MODEL.gguf --slots 8 16 32 < workload.json
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time

import llama_cpp as L
import numpy as np


def run(model: object, prompts: list[list[int]], outs: list[int], slots: int, threads: int, n_batch: int,
        kv_unified: bool | None = None, flash_attn: int | None = None) -> tuple[float, float]:
    cp = L.llama_context_default_params()
    if kv_unified is not None:  # one KV stream per sequence (False) or one shared buffer (True)
        cp.kv_unified = kv_unified
    if flash_attn is not None:  # -1 auto, 0 off, 1 on
        cp.flash_attn_type = flash_attn
    per_seq = max(len(p) + n for p, n in zip(prompts, outs)) + 8
    cp.n_ctx = per_seq * slots
    cp.n_batch = cp.n_ubatch = n_batch
    cp.n_seq_max = slots
    cp.n_threads = cp.n_threads_batch = threads
    ctx = L.llama_init_from_model(model, cp)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    mem = L.llama_get_memory(ctx)
    batch = L.llama_batch_init(n_batch + slots, 0, 1)
    queue = list(range(len(prompts)))
    free = list(range(slots))
    live: dict[int, dict] = {}  # slot -> {req, pos, fed, produced, next}
    produced = 0
    decode_tokens, decode_s = 0, 0.0
    t0 = time.perf_counter()
    while queue or live:
        while queue and free:
            s = free.pop()
            L.llama_memory_seq_rm(mem, s, -1, -1)
            live[s] = {"req": queue.pop(0), "pos": 0, "produced": 0, "next": None}
        n = 0
        rows: list[tuple[int, int]] = []  # (batch index, slot) of rows whose logits are sampled

        def add(tok: int, pos: int, s: int, want: bool) -> None:
            nonlocal n
            batch.token[n], batch.pos[n], batch.n_seq_id[n] = tok, pos, 1
            batch.seq_id[n][0], batch.logits[n] = s, want
            if want:
                rows.append((n, s))
            n += 1

        for s, st in live.items():  # decodes first
            if st["next"] is not None:
                add(st["next"], st["pos"], s, True)
                st["pos"] += 1
        for s, st in live.items():  # then prompt chunks
            p = prompts[st["req"]]
            if st["next"] is None and st["pos"] < len(p) and n < n_batch:
                take = min(len(p) - st["pos"], n_batch - n)
                for i in range(take):
                    add(p[st["pos"] + i], st["pos"] + i, s, st["pos"] + i == len(p) - 1)
                st["pos"] += take
        batch.n_tokens = n
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        now = time.perf_counter()
        for i, s in rows:
            ptr = L.llama_get_logits_ith(ctx, i)
            logits = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))
            st = live[s]
            st["next"] = int(logits.argmax())
            st["produced"] += 1
            produced += 1
            st.setdefault("first", now)
            if st["produced"] >= outs[st["req"]]:
                decode_tokens += st["produced"] - 1
                decode_s += now - st["first"]
                del live[s]
                free.append(s)
    dt = time.perf_counter() - t0
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    return produced / dt, decode_tokens / decode_s if decode_s > 0 else 0.0


def probed(model: object, prompts: list[list[int]], outs: list[int], threads: int, probe_bytes: int,
           triad_bytes: int) -> dict:
    """One request at a time; every decode step (after the prefill) timed and followed by a probe read and a
    triad (tools/membw.py)."""
    import membw  # tools/membw.py (this script's folder), no torch needed
    probe = membw.Probe(probe_bytes, threads, triad_bytes)
    cp = L.llama_context_default_params()
    cp.n_ctx = max(len(p) + n for p, n in zip(prompts, outs)) + 8
    cp.n_batch = cp.n_ubatch = cp.n_ctx
    cp.n_threads = cp.n_threads_batch = threads
    ctx = L.llama_init_from_model(model, cp)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    mem = L.llama_get_memory(ctx)
    batch = L.llama_batch_init(cp.n_ctx, 0, 1)
    step_s = probe_s = triad_s = 0.0
    steps = 0

    def decode(tokens: list[int], pos: int) -> int:
        for i, tok in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos + i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, i == len(tokens) - 1
        batch.n_tokens = len(tokens)
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        ptr = L.llama_get_logits_ith(ctx, len(tokens) - 1)
        return int(np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,)).argmax())

    for prompt, n in zip(prompts, outs):
        L.llama_memory_seq_rm(mem, 0, -1, -1)
        tok, pos = decode(prompt, 0), len(prompt)
        for i in range(n - 1):
            t = time.perf_counter()
            tok = decode([tok], pos)
            step_s += time.perf_counter() - t
            pos += 1
            steps += 1
            if (i + 1) % membw.PAIR_STEPS == 0 or i == n - 2:  # steps and probes alternate in runs, as bench_real's
                owed = (i % membw.PAIR_STEPS) + 1
                probe_s += sum(probe.read() for _ in range(owed))
                triad_s += sum(probe.triad() for _ in range(owed))
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    probe.close()
    return {"step_s": step_s, "probe_s": probe_s, "triad_s": triad_s, "steps": steps}


def rss_bytes() -> int:
    """VmRSS of this process (Linux), the file-backed pages of the mmapped model included."""
    for line in open("/proc/self/status", encoding="ascii"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--slots", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-batch", type=int, default=512)
    ap.add_argument("--kv-unified", type=int, choices=[0, 1], default=None, help="default: llama.cpp's")
    ap.add_argument("--flash-attn", type=int, choices=[-1, 0, 1], default=None, help="default: llama.cpp's")
    ap.add_argument("--probe-bytes", type=int, default=0, help="one slot, each decode step paired with a read")
    ap.add_argument("--triad-bytes", type=int, default=0, help="with --probe-bytes: and with a triad moving these")
    ap.add_argument("--rss", action="store_true", help="a last line with the resident bytes after load and at the end")
    a = ap.parse_args()
    kv = None if a.kv_unified is None else bool(a.kv_unified)
    work = json.load(sys.stdin)
    L.llama_backend_init()
    model = L.llama_model_load_from_file(a.gguf.encode(), L.llama_model_default_params())
    rss_load = rss_bytes()
    if a.probe_bytes:
        print(json.dumps(probed(model, work["prompts"], work["outs"], a.threads, a.probe_bytes, a.triad_bytes)),
              flush=True)
        return
    warm = [w[:8] for w in work["prompts"][:2]]
    run(model, warm, [2, 2], 2, a.threads, a.n_batch, kv, a.flash_attn)
    for p in a.slots:
        tok_s, decode = run(model, work["prompts"], work["outs"], p, a.threads, a.n_batch, kv, a.flash_attn)
        print(json.dumps({"slots": p, "tok_s": tok_s, "decode_tok_s": decode}), flush=True)
    if a.rss:
        print(json.dumps({"rss_load": rss_load, "rss_end": rss_bytes()}), flush=True)


if __name__ == "__main__":
    main()
