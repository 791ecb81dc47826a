#!/usr/bin/env python3
"""Embeddings throughput: inputs/s of POST /v1/embeddings at ``--clients`` concurrent clients against our server,
beside sentence-transformers' ``encode`` on the same checkpoint in the same run (issue 48).

The model is a sentence-transformers "Llama encoder" (LlamaModel -> mean pooling -> Normalize) with random weights
in the shape ``--shape`` names (``tiny``: the demo model's, 2 layers; ``smollm2-135m``: SmolLM2-135M's 30 layers,
hidden 576, 9 / 3 heads, MLP 1536) and the demo tokenizer, or ``--model`` a sentence-transformers folder of a
Llama encoder. Inputs are ``--inputs`` texts of 16-128 random words; each request carries ``--per-request`` of
them. Our server and sentence-transformers run one after the other (never together), each on the machine's cores;
sentence-transformers encodes in batches of ``--st-batch`` (its default 32). The vectors of both are compared
(cosine) so a figure is never of wrong answers. Real figures need a quiet machine.

    .venv/bin/python tools/bench_embeddings.py --shape smollm2-135m --inputs 1024
    .venv/bin/python tools/bench_embeddings.py --inputs 64 --clients 4      # a smoke run
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mindie_service.devkit.presets import build_demo_model  # noqa: E402
from tests.pooling_models import build_st_model  # noqa: E402
from tests.prompts import word_prompts  # noqa: E402
from tests.server_utils import ServerProcess, launch, write_config  # noqa: E402

SHAPES = {"tiny": {},
          "smollm2-135m": {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
                           "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536}}


def ours(folder: Path, texts: list[str], clients: int, per_request: int, tmp: Path) -> tuple[float, np.ndarray]:
    """inputs/s of our server at ``clients`` concurrent clients, and the vectors in input order."""
    def make() -> ServerProcess:
        cfg = write_config(tmp / "config.json", folder, model_name="emb",
                           server={"maxLinkNum": max(64, clients * 2), "maxRequestLength": 64},
                           deploy={"maxSeqLen": 1024, "maxInputTokenLen": 1000},
                           schedule={"maxPrefillTokens": 4096, "numKvBlocks": 1024, "maxBatchSize": 64})
        return ServerProcess(cfg, tmp / "server.log")
    srv = launch(make)
    try:
        url = srv.url() + "/v1/embeddings"
        chunks = [list(range(k, min(k + per_request, len(texts)))) for k in range(0, len(texts), per_request)]
        out: list[list[float] | None] = [None] * len(texts)
        sessions = [requests.Session() for _ in range(clients)]

        def one(i: int) -> None:
            idx = chunks[i]
            r = sessions[i % clients].post(url, json={"model": "emb", "input": [texts[k] for k in idx]}, timeout=600)
            r.raise_for_status()
            for k, d in zip(idx, r.json()["data"]):
                out[k] = d["embedding"]
        one(0)  # a warm request (the kernels, the first forward)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(one, range(len(chunks))))
        spent = time.perf_counter() - t0
    finally:
        srv.stop()
    return len(texts) / spent, np.array(out, dtype=np.float32)


def theirs(folder: Path, texts: list[str], batch: int) -> tuple[float, np.ndarray]:
    import torch
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(str(folder), device="cpu")
    with torch.inference_mode():
        model.encode(texts[:batch], batch_size=batch)  # warm
        t0 = time.perf_counter()
        vecs = model.encode(texts, batch_size=batch)
        spent = time.perf_counter() - t0
    return len(texts) / spent, np.asarray(vecs, dtype=np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="a sentence-transformers folder of a Llama encoder")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--inputs", type=int, default=512)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--per-request", type=int, default=1)
    ap.add_argument("--st-batch", type=int, default=32)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        folder = args.model
        if folder is None:
            tiny = tmp / "tiny"
            build_demo_model("tiny", tiny)
            folder = build_st_model(tmp / "st", tiny, "mean", normalize=True, shape=SHAPES[args.shape])
        texts = word_prompts(args.inputs, 16, 128, seed=0)
        rate, got = ours(folder, texts, args.clients, args.per_request, tmp)
        st_rate, want = theirs(folder, texts, args.st_batch)
    cos = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
    print(f"model {args.model or args.shape}: {args.inputs} inputs of 16-128 words, {args.clients} clients, "
          f"{args.per_request} input(s) a request")
    print(f"ours (POST /v1/embeddings)      {rate:9.1f} inputs/s")
    print(f"sentence-transformers (batch {args.st_batch}) {st_rate:9.1f} inputs/s")
    print(f"ratio ours / sentence-transformers: {rate / st_rate:.2f}x; min cosine agreement {cos.min():.6f}")


if __name__ == "__main__":
    main()
