#!/usr/bin/env python3
"""Accuracy of the int8 LM head option (``quantize_lm_head``) on the real model: teacher-forced on
tests/real/real_text.txt as tests/real/test_real_quant.py does (sequences of 256, chunks of 64), each scheme
with its float head and with the int8 (W8A16 per-channel) head, against fp32: top-1 agreement, mean KL,
mean |log-prob change| of the true next token, NLL.

    PYTHONPATH=$PWD .venv/bin/python tools/head_accuracy.py
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

import torch  # noqa: E402

from mindie_service.devkit import quant_eval  # noqa: E402
from mindie_service.models import loader  # noqa: E402
from mindie_service.models.gguf_checkpoint import export_folder  # noqa: E402
from bench_real import make_llm, shipped_gguf  # noqa: E402

SEQ_LEN, CHUNK = 256, 64


def main() -> None:
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
    plain = loader.load_model
    try:
        for scheme in ("w8a16", "w8a8"):
            for head in (False, True):
                quant_eval.load_model = functools.partial(plain, quantize_lm_head=head)
                got = quant_eval.teacher_forced_logprobs(folder, tokens, scheme, seq_len=SEQ_LEN, chunk=CHUNK)
                r = quant_eval.compare(scheme, ref, got, targets)
                name = f"{scheme}{'+int8head' if head else ''}"
                nll = -got.gather(1, targets[:, None]).mean().item()
                print(f"{name:16} {r.top1_agreement:7.4f} {r.mean_kl:9.5f} {r.mean_abs_logprob_drift:8.5f} "
                      f"{nll:7.4f}", flush=True)
    finally:
        quant_eval.load_model = plain


if __name__ == "__main__":
    main()
