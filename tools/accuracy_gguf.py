#!/usr/bin/env python3
"""Issue 44's accuracy table: on one .gguf file (default: the shipped SmolLM2-135M Q4_1), 511 teacher-forced
predictions over 512 tokens of real English (tests/real/real_text.txt), each engine's log-probs against the
reference (our fp32 path over ``gguf.quants.dequantize``: the file's exact weight values):

- ours, packed (the file's blocks; fp32 activations, weights dequantized in registers);
- ours, packed with int8 activations (each row of x quantized per 16 columns by llama.cpp's Q8_0 rule with an fp32
  scale; ggufActivations int8 takes them in decode steps, int8-all in prefill pieces too; teacher forcing is a
  prefill, so it runs int8-all here: every prediction on the int8 path, each row's result its own, as a decode
  step's row would be);
- llama.cpp on the same file (``llama-cpp-python``, ``logits_all=True``; its CPU path quantizes the activations
  to 8 bits per block for Q4/Q5/Q8 weights), in its own venv (``--llama-venv``; PEERS.md says how to build it).

Prints top-1 agreement, mean KL(reference || engine) and each NLL. Accuracy, not speed: a busy machine does not
change the figures.

    PYTHONPATH=$PWD .venv/bin/python tools/accuracy_gguf.py --llama-venv /work/llama-venv [--model FILE.gguf]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

import torch  # noqa: E402

from mindie_service.devkit.quant_eval import teacher_forced_logprobs  # noqa: E402
from mindie_service.models.gguf_checkpoint import load_tokenizer  # noqa: E402

N_TOKENS = 512
LLAMA_SIDE = """
import json, sys
import numpy as np
import llama_cpp
model, tokens, out, threads = sys.argv[1], json.loads(open(sys.argv[2]).read()), sys.argv[3], int(sys.argv[4])
llm = llama_cpp.Llama(model_path=model, n_ctx=len(tokens) + 8, n_batch=len(tokens), n_ubatch=len(tokens),
                      logits_all=True, n_threads=threads, n_threads_batch=threads, verbose=False)
llm.eval(tokens)
np.save(out, np.asarray(llm.scores[:len(tokens)], dtype=np.float32))
"""


def llama_logprobs(venv: Path, model: Path, tokens: list[int]) -> torch.Tensor:
    """llama.cpp's log-probs of the positions that predict tokens[1:] (rows 0 .. n-2)."""
    with tempfile.TemporaryDirectory() as tmp:
        tok_file, out = Path(tmp) / "tokens.json", Path(tmp) / "scores.npy"
        tok_file.write_text(json.dumps(tokens))
        subprocess.run([str(venv / "bin" / "python"), "-c", LLAMA_SIDE, str(model), str(tok_file), str(out),
                        str(torch.get_num_threads())], check=True)
        import numpy as np
        logits = torch.from_numpy(np.load(out))
    return logits[:-1].double().log_softmax(-1).float()


def compare(name: str, ref: torch.Tensor, got: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    top1 = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    kl = (ref.exp() * (ref - got)).sum(-1).mean().item()
    nll_ref, nll = -ref.gather(1, targets).mean().item(), -got.gather(1, targets).mean().item()
    print(f"{name:<34} {top1:>8.4f} {kl:>12.3e} {nll:>9.5f} {nll_ref:>9.5f}")
    return {"top1": top1, "kl": kl, "nll": nll, "nll_ref": nll_ref}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="a .gguf file (default: the shipped SmolLM2-135M Q4_1)")
    ap.add_argument("--llama-venv", default="", help="llama-cpp-python's venv (none: our rows only)")
    args = ap.parse_args()
    from bench_gguf_files import shipped_gguf
    model = Path(args.model) if args.model else shipped_gguf()
    text = (ROOT / "tests" / "real" / "real_text.txt").read_text(encoding="utf-8")
    tokens = load_tokenizer(model)(text).input_ids[:N_TOKENS]
    targets = torch.tensor(tokens[1:])[:, None]
    ref = teacher_forced_logprobs(model, tokens, seq_len=N_TOKENS, chunk=128, gguf_packed=False)
    ours = teacher_forced_logprobs(model, tokens, seq_len=N_TOKENS, chunk=128)
    ours_i8 = teacher_forced_logprobs(model, tokens, seq_len=N_TOKENS, chunk=128, gguf_activations="int8-all")
    print(f"{model.name}: {len(tokens) - 1} teacher-forced predictions; reference = our fp32 path over the "
          "file's dequantized weights")
    print(f"{'engine':<34} {'top-1':>8} {'mean KL':>12} {'NLL':>9} {'ref NLL':>9}")
    compare("ours, packed (fp32 activations)", ref, ours, targets)
    compare("ours, packed (int8 activations)", ref, ours_i8, targets)
    if args.llama_venv:
        compare("llama.cpp (same file)", ref, llama_logprobs(Path(args.llama_venv), model, tokens), targets)


if __name__ == "__main__":
    main()
