"""Teacher-forced accuracy of a quantized model against the same weights in fp32: top-1 agreement
(over positions where fp32's top-1 leads its top-2 by more than ``margin`` in log-probability: random
demo weights have near-ties), mean KL(fp32 || quantized) and mean |log-prob drift| of the true next
token. Used by tests/unit/test_quant_accuracy.py and tools/bench_quant.py."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from mindie_service.engine.runner.model_runner import ModelRunner
from mindie_service.engine.step import ScheduledChunk, SchedulerOutput
from mindie_service.models.loader import load_model


@dataclass(frozen=True)
class Agreement:
    scheme: str
    positions: int  # positions counted (fp32 margin > threshold)
    top1_agreement: float
    mean_kl: float
    mean_abs_logprob_drift: float


def corpus_tokens(tokenizer: object, n: int) -> list[int]:
    from mindie_service.devkit.corpus import corpus_lines
    ids: list[int] = []
    for line in corpus_lines():
        ids.extend(tokenizer.encode(line + "\n", add_special_tokens=False))  # type: ignore[attr-defined]
        if len(ids) >= n:
            break
    return ids[:n]


@torch.inference_mode()
def teacher_forced_logprobs(model_dir: str | Path, tokens: list[int], quantization: str | None = None,
                            kv_cache_dtype: str = "auto", seq_len: int = 512, chunk: int = 128,
                            block_size: int = 16, gguf_packed: bool = True,
                            gguf_activations: str = "fp32") -> torch.Tensor:
    """Log-probabilities [len(tokens) - n_seqs, vocab]: the tokens cut into sequences of ``seq_len``, each
    prefilled in chunks of ``chunk`` (later chunks read the earlier ones from the KV cache, so an int8 cache
    shows), row i predicting token i + 1 of its sequence. ``gguf_packed=False``: a GGUF's quantized weights
    dequantized at load (the fp32 reference of the packed path); ``gguf_activations`` the packed linears'
    (models/gguf_packed.set_activations; every chunk here is a prefill piece, so "int8" leaves them on fp32 and
    "int8-all" puts every row on int8, as a decode step's row would be)."""
    loaded = load_model(model_dir, "float32", torch.device("cpu"), seq_len, quantization=quantization,
                        kv_cache_dtype=kv_cache_dtype, gguf_packed_weights=gguf_packed,
                        gguf_activations=gguf_activations)
    blocks = seq_len // block_size + 1
    runner = ModelRunner(loaded.model, blocks + 1, block_size, torch.device("cpu"), torch.float32)
    table = tuple(range(1, blocks + 1))
    out: list[torch.Tensor] = []
    for s in range(0, len(tokens) - seq_len + 1, seq_len):
        seq = tokens[s:s + seq_len]
        rows = []
        for c in range(0, seq_len, chunk):
            piece = ScheduledChunk("eval", c, tuple(seq[c:c + chunk]), table, sample=False, prompt_logprobs=True)
            rows.append(runner.execute(SchedulerOutput([piece], 0)).prompt_logits["eval"])
        out.append(torch.log_softmax(torch.cat(rows)[:-1].float(), dim=-1))
    return torch.cat(out)


def compare(scheme: str, ref: torch.Tensor, got: torch.Tensor, targets: torch.Tensor,
            margin: float = 1e-3) -> Agreement:
    top2 = ref.topk(2, dim=-1).values
    keep = (top2[:, 0] - top2[:, 1]) > margin
    agree = (ref.argmax(-1) == got.argmax(-1))[keep].float().mean().item()
    kl = (ref.exp() * (ref - got)).sum(-1).mean().item()
    drift = (ref.gather(1, targets[:, None]) - got.gather(1, targets[:, None])).abs().mean().item()
    return Agreement(scheme, int(keep.sum()), agree, kl, drift)


def evaluate(model_dir: str | Path, tokenizer: object, n_tokens: int = 4096, seq_len: int = 512,
             schemes: tuple[tuple[str | None, str], ...] = (("w8a16", "auto"), ("w8a8", "auto"), (None, "int8"),
                                                             ("w8a8", "int8"))) -> list[Agreement]:
    tokens = corpus_tokens(tokenizer, n_tokens)
    targets = torch.tensor([t for s in range(0, len(tokens) - seq_len + 1, seq_len)
                            for t in tokens[s + 1:s + seq_len]])
    ref = teacher_forced_logprobs(model_dir, tokens, seq_len=seq_len)
    results = []
    for q, kv in schemes:
        got = teacher_forced_logprobs(model_dir, tokens, q, kv, seq_len=seq_len)
        name = "+".join(x for x in (q, "int8-kv" if kv == "int8" else None) if x)
        results.append(compare(name, ref, got, targets))
    return results
