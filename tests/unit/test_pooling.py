"""Embeddings and scores through the engine (engine/pooling): a random-weight sentence-transformers "Llama
encoder" matches sentence-transformers, a random-weight LlamaForSequenceClassification matches transformers'
scores; the forward keeps no KV and takes no decode slot; batches split at maxPrefillTokens give the same vectors;
pooling beside generation changes neither; the checkpoint's pooling files are read (and refused) as they say."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mindie_service import LLM, SamplingParams
from mindie_service.catalog.model_json import ModelRecord
from mindie_service.engine.async_engine import AsyncEngine
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.contract import EngineRequest, PoolRequest
from mindie_service.errors import ValidationError
from mindie_service.models.pooling_spec import PoolingSpec, folder_tasks, read_pooling
from tests.pooling_models import build_scorer, build_st_model

TEXTS = ["River mountain city garden", "a short one", "x", "The quick brown fox jumps over the lazy dog, twice."]
PAIRS = [("what is a river", "water that flows"), ("what is a river", "a city garden"), ("q", "d e f g h")]
SMALL = dict(max_seq_len=256, num_kv_blocks=48, cache_block_size=16)


@pytest.fixture(scope="module")
def st_models(tiny_model, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("st")
    return {m: build_st_model(root / m, tiny_model, m, normalize=(m != "cls"), seed=k)
            for k, m in enumerate(("mean", "lasttoken", "cls"))}


@pytest.fixture(scope="module")
def scorer(tiny_model, tmp_path_factory) -> Path:
    return build_scorer(tmp_path_factory.mktemp("sc") / "sc", tiny_model)


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a, b, dim=-1)


@pytest.mark.parametrize("method", ["mean", "lasttoken", "cls"])
def test_embeddings_match_sentence_transformers(st_models, method):
    from sentence_transformers import SentenceTransformer
    folder = st_models[method]
    llm = LLM(str(folder), **SMALL)
    assert llm.pooling.tasks == {"embed"}
    ours = torch.tensor(llm.embed(TEXTS))
    ref = torch.tensor(np.stack(SentenceTransformer(str(folder), device="cpu").encode(TEXTS)))
    assert ours.shape == ref.shape == (len(TEXTS), 128)
    assert (1 - _cos(ours, ref)).max() < 1e-4
    assert torch.allclose(ours, ref, atol=1e-4)
    if method != "cls":  # Normalize in modules.json: unit vectors; cls has no Normalize module
        assert torch.allclose(ours.norm(dim=-1), torch.ones(len(TEXTS)), atol=1e-5)
    else:
        assert not torch.allclose(ours.norm(dim=-1), torch.ones(len(TEXTS)), atol=1e-2)


def test_scores_match_transformers_sequence_classification(scorer):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    llm = LLM(str(scorer), **SMALL)
    assert llm.pooling.tasks == {"score"}
    tok = AutoTokenizer.from_pretrained(str(scorer))
    model = AutoModelForSequenceClassification.from_pretrained(str(scorer), dtype=torch.float32).eval()
    got = [llm.score(q, [d])[0] for q, d in PAIRS]
    with torch.no_grad():
        want = [torch.sigmoid(model(**tok(q, text_pair=d, return_tensors="pt")).logits[0, 0]).item() for q, d in PAIRS]
    assert np.allclose(got, want, atol=1e-5), (got, want)
    assert max(want) - min(want) > 0.1  # the head spreads them: a wrong row would show
    assert llm.score("what is a river", [d for _, d in PAIRS[:2]]) == pytest.approx(got[:2], abs=1e-6)


def test_pooling_keeps_no_kv_and_splits_batches_at_max_prefill_tokens(st_models):
    whole = LLM(str(st_models["mean"]), **SMALL)
    want = torch.tensor(whole.embed(TEXTS * 3))
    eng = whole.engine
    assert eng.blocks.num_free_blocks == eng.blocks.num_blocks and not eng.blocks.cached  # nothing kept
    assert not eng.scheduler.running and not eng.scheduler.waiting  # no decode slot, no sequence
    split = LLM(str(st_models["mean"]), max_prefill_tokens=24, **SMALL)  # a few inputs a forward
    calls: list[int] = []
    hidden = split.pooling.batcher.hidden
    split.pooling.batcher.hidden = lambda chunks: calls.append(len(chunks)) or hidden(chunks)
    got = torch.tensor(split.embed(TEXTS * 3))
    assert len(calls) > 1 and sum(calls) == len(TEXTS) * 3
    assert torch.allclose(got, want, atol=1e-5)


def test_dimensions_truncate_and_renormalise_only_where_allowed(tiny_model, st_models):
    llm = LLM(str(tiny_model), pooling=(("matryoshka", (32, 64)),), **SMALL)
    assert llm.pooling.tasks == {"generate", "embed"}  # a causal LM also embeds (last token)
    full = torch.tensor(llm.embed(TEXTS))
    cut = torch.tensor(llm.embed(TEXTS, dimensions=64))
    assert cut.shape == (len(TEXTS), 64)
    assert torch.allclose(cut, torch.nn.functional.normalize(full[:, :64], dim=-1), atol=1e-6)
    with pytest.raises(ValidationError, match="one of \\[32, 64\\]"):
        llm.embed(TEXTS, dimensions=48)
    with pytest.raises(ValidationError, match="Matryoshka"):
        LLM(str(st_models["mean"]), **SMALL).embed("x", dimensions=8)


def test_a_task_the_checkpoint_cannot_serve_is_refused(tiny_model, scorer):
    with pytest.raises(ValueError, match="task must be one this checkpoint serves"):
        LLM(str(tiny_model), task="score", **SMALL)
    llm = LLM(str(tiny_model), task="generate", **SMALL)
    with pytest.raises(ValidationError, match="does not serve embeddings.*LlamaModel, sentence-transformers"):
        llm.embed("x")
    with pytest.raises(ValidationError, match="does not serve scores.*LlamaForSequenceClassification"):
        LLM(str(tiny_model), **SMALL).score("a", "b")
    with pytest.raises(ValidationError, match="does not serve text generation.*LlamaForCausalLM"):
        LLM(str(scorer), **SMALL).generate("hi")


def test_what_a_folder_serves_and_model_json_task(tiny_model, st_models, scorer):
    """GET /v1/models reads a stopped model's tasks from its files; model.json's task narrows them."""
    assert folder_tasks(tiny_model) == {"generate", "embed"}
    assert folder_tasks(st_models["mean"]) == {"embed"} and folder_tasks(scorer) == {"score"}
    assert ModelRecord.from_json("m", {"task": "embed"}).task == "embed"
    assert ModelRecord.from_json("m", {"task": "auto"}).task == "" == ModelRecord.from_json("m", {}).task
    assert ModelRecord.from_json("m", {"task": "score"}).to_json()["task"] == "score"
    with pytest.raises(ValidationError, match="task must be one of"):
        ModelRecord.from_json("m", {"task": "rerank"})


def test_pooling_beside_generation_changes_neither(st_models, tiny_model):
    """The pooling batch runs between generation steps on the same engine thread and KV pool."""
    alone = LLM(str(tiny_model), **SMALL)
    p = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    want_text = alone.generate(["River mountain"], p, use_tqdm=False)[0].outputs[0].token_ids
    want_vecs = alone.embed(TEXTS)

    async def both() -> tuple[list[int], list[list[float]]]:
        eng = AsyncEngine(EngineConfig(model=str(tiny_model), dtype="float32", max_queue_delay_microseconds=0, max_iter_times=64,
                                       **SMALL))
        eng.start()
        try:
            ids = tuple(alone.tokenizer("River mountain").input_ids)
            req = EngineRequest("g", ids, p)

            async def gen() -> list[int]:
                return [ev.token.id async for ev in eng.generate(req)]
            inputs = tuple(tuple(alone.tokenizer(t).input_ids) for t in TEXTS)
            toks, pooled = await asyncio.gather(gen(), eng.pool(PoolRequest("e", inputs, "embed")))
            assert pooled.num_prompt_tokens == sum(len(x) for x in inputs)
            return toks, pooled.vectors
        finally:
            eng.shutdown()
    toks, vecs = asyncio.run(both())
    assert toks == want_text
    assert np.allclose(vecs, want_vecs, atol=1e-5)


# -- the checkpoint's files ------------------------------------------------------------------------------
def _st_folder(tmp_path: Path, modules: list[str], pooling: dict | None) -> Path:
    tmp_path.mkdir()
    mods = [{"idx": k, "name": str(k), "path": "" if k == 0 else f"{k}_{m}", "type": f"sentence_transformers.models.{m}"}
            for k, m in enumerate(modules)]
    (tmp_path / "modules.json").write_text(json.dumps(mods))
    if pooling is not None:
        (tmp_path / "1_Pooling").mkdir()
        (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return tmp_path


class _Cfg:
    pass


def test_pooling_files_old_flags_new_mode_and_refusals(tmp_path):
    old = _st_folder(tmp_path / "old", ["Transformer", "Pooling"], {"pooling_mode_cls_token": True,
                                                                    "pooling_mode_mean_tokens": False})
    assert read_pooling(old, _Cfg()) == PoolingSpec("cls", False, False, "sentence-transformers (pooling_mode_cls_token)")
    assert folder_tasks(old) is None  # no config.json: unknown without loading
    cfg = _Cfg()
    cfg.matryoshka_dimensions = [16, 32]
    spec = read_pooling(old, cfg, {"normalize": True})
    assert (spec.method, spec.normalize, spec.matryoshka) == ("cls", True, (16, 32))
    dense = _st_folder(tmp_path / "dense", ["Transformer", "Pooling", "Dense"], {"pooling_mode": "mean"})
    with pytest.raises(ValueError, match="Dense and other modules are not served"):
        read_pooling(dense, _Cfg())
    two = _st_folder(tmp_path / "two", ["Transformer", "Pooling"], {"pooling_mode_cls_token": True,
                                                                    "pooling_mode_mean_tokens": True})
    with pytest.raises(ValueError, match="must switch on one of"):
        read_pooling(two, _Cfg())
    weighted = _st_folder(tmp_path / "w", ["Transformer", "Pooling"], {"pooling_mode": "weightedmean"})
    with pytest.raises(ValueError, match="pooling_mode must be one of"):
        read_pooling(weighted, _Cfg())

