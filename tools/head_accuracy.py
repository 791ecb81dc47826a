#!/usr/bin/env python3
"""Accuracy of the int8 LM head option (``quantize_lm_head``) on the real model: teacher-forced on
tests/real/real_text.txt as tests/real/test_real_quant.py does (sequences of 256, chunks of 64), each scheme
with its float head and with the int8 (W8A16 per-channel) head, against fp32: top-1 agreement, mean KL,
mean |log-prob change| of the true next token, NLL. ``--groups 32 64`` adds a per-group int8 head (one scale
per output row and group of that many inputs), simulated: the head's weight quantized per group and dequantized
to fp32 (the accuracy a per-group kernel would have; no such kernel yet). On the shipped SmolLM2 .gguf the tied
head (token_embd) is stored as Q8_0, blocks of 32 with one scale each: ``--groups 32`` reproduces it exactly, and
its rows equal the float head's to 4 decimals (measured 04:10 UTC, 2026-11-25).

    PYTHONPATH=$PWD .venv/bin/python tools/head_accuracy.py [--schemes w8a16 w8a8] [--groups 32 64]
"""
from __future__ import annotations

import argparse
import copy
import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

import torch  # noqa: E402

from mindie_service.devkit import quant_eval  # noqa: E402
from mindie_service.models import loader, quantize  # noqa: E402
from mindie_service.models.gguf_checkpoint import export_folder  # noqa: E402
from bench_real import make_llm, shipped_gguf  # noqa: E402

SEQ_LEN, CHUNK = 256, 64


def group_fake_quant(w: torch.Tensor, group: int) -> torch.Tensor:
    """[N, K] -> the same weights quantized to int8 with one scale per (row, group of ``group`` inputs), dequantized."""
    n, k = w.shape
    if k % group:
        raise SystemExit(f"--groups {group}: the head's {k} inputs do not split into groups of {group}")
    g = w.detach().float().view(n, k // group, group)
    s = g.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127
    return (torch.round(g / s).clamp(-127, 127) * s).view(n, k)


def with_group_head(group: int):  # noqa: ANN201 - quantize.quantize_loaded's signature
    """quantize_loaded that keeps the head in fp32 but with per-group int8-rounded weights (a copy: a tied
    embedding keeps its own)."""
    plain = quantize.quantize_loaded

    def patched(model: torch.nn.Module, scheme: str, lm_head: bool = False) -> None:
        plain(model, scheme, False)
        head = copy.copy(model.lm_head)
        head._parameters = dict(head._parameters)
        head.weight = torch.nn.Parameter(group_fake_quant(head.weight, group), requires_grad=False)
        quantize.quant.swap_module(model, "lm_head", head)
    return patched


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schemes", nargs="+", default=["w8a16", "w8a8"])
    ap.add_argument("--groups", type=int, nargs="*", default=[], help="per-group int8 heads to simulate")
    ap.add_argument("--no-plain", action="store_true", help="skip the float and per-channel int8 heads")
    args = ap.parse_args()
    gguf = shipped_gguf()
    folder = ROOT / "models-real" / "smollm2-135m-export"
    if not (folder / "config.json").exists():
        export_folder(gguf, folder, with_tokenizer=False)
    text = (ROOT / "tests" / "real" / "real_text.txt").read_text(encoding="utf-8")
    tokens = make_llm(str(gguf), None, 2).tokenizer(text, add_special_tokens=False).input_ids
    n_seq = len(tokens) // SEQ_LEN
    tokens = tokens[:n_seq * SEQ_LEN]
    targets = torch.tensor([t for s in range(0, len(tokens), SEQ_LEN) for t in tokens[s + 1:s + SEQ_LEN]])
    ref = quant_eval.teacher_forced_logprobs(folder, tokens, seq_len=SEQ_LEN, chunk=CHUNK)
    nll = -ref.gather(1, targets[:, None]).mean().item()
    print(f"{'scheme':16} {'top-1':>7} {'mean KL':>9} {'|dlogp|':>8} {'NLL':>7}\n{'fp32':16} {'':>7} {'':>9} {'':>8} {nll:7.4f}")
    plain, plain_quantize = loader.load_model, quantize.quantize_loaded
    heads = ([] if args.no_plain else [("", False, None), ("+int8head", True, None)]) + \
        [(f"+g{g}head", True, g) for g in args.groups]
    try:
        for scheme in args.schemes:
            for suffix, head, group in heads:
                quantize.quantize_loaded = plain_quantize if group is None else with_group_head(group)
                quant_eval.load_model = functools.partial(plain, quantize_lm_head=head)
                got = quant_eval.teacher_forced_logprobs(folder, tokens, scheme, seq_len=SEQ_LEN, chunk=CHUNK)
                r = quant_eval.compare(scheme, ref, got, targets)
                name = f"{scheme}{suffix}"
                nll = -got.gather(1, targets[:, None]).mean().item()
                print(f"{name:16} {r.top1_agreement:7.4f} {r.mean_kl:9.5f} {r.mean_abs_logprob_drift:8.5f} "
                      f"{nll:7.4f}", flush=True)
    finally:
        quant_eval.load_model, quantize.quantize_loaded = plain, plain_quantize


if __name__ == "__main__":
    main()
