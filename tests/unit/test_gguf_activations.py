"""ModelConfig.ggufActivations (models/gguf_packed.set_activations): the key is read and a value other than int8,
int8-all or fp32 refused; an engine on a GGUF takes the int8-activation kernels in decode steps (int8, the default:
its prompts' prefill gives fp32's bits), in prefill pieces too (int8-all) or never (fp32), never in the LM head, and
weights_report says which; the one-call decode step runs the K-quants' Q8_K kernels
inside its team (each on its calling thread), and teacher-forced log-probs stay within a stated bound of the
dequantized reference (random weights, so the bound is loose: the real file's figures are tools/accuracy_gguf.py's).
The fused step against the op-by-op one on int8 activations: tests/unit/test_gguf_engine.py."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mindie_service import LLM, SamplingParams
from mindie_service.config import load_config
from mindie_service.devkit.quant_eval import compare, teacher_forced_logprobs
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.runner.model_runner import ModelRunner
from mindie_service.engine.step import ScheduledChunk, SchedulerOutput
from mindie_service.errors import ConfigError
from mindie_service.models import gguf_packed
from npu_ops import cpu_kernels
from npu_ops.gguf_modules import INT8_ALL, INT8_DECODE, STEP_DECODE, STEP_PREFILL, GgufLinear, current_step
from tests.gguf_files import _tokenizer, finish, llama_shapes, llama_writer
from tests.unit.test_fused_decode import count_fused_steps
from tests.unit.test_gguf_kquant import kquantize
from tests.unit.test_gguf_kquant_load import TOKENS, write_mix

gguf = pytest.importorskip("gguf")
needs_kernels = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")
POOL = dict(cache_block_size=4, num_kv_blocks=128, max_seq_len=256)


def _config(tmp_path: Path, **model: object) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"BackendConfig": {"ModelDeployConfig": {"ModelConfig": [
        {"modelName": "m", "modelWeightPath": "m", **model}]}}}))
    return path


def test_the_key_is_read_and_a_bad_value_refused(tmp_path):
    assert load_config(_config(tmp_path), env={}).models[0].gguf_activations == "int8"  # the default
    assert EngineConfig(model="m").gguf_activations == "int8"
    assert load_config(_config(tmp_path, ggufActivations="fp32"), env={}).models[0].gguf_activations == "fp32"
    cfg = load_config(_config(tmp_path, ggufActivations="int8"), env={})
    assert cfg.models[0].gguf_activations == "int8" and cfg.engine_config(0).gguf_activations == "int8"
    with pytest.raises(ConfigError) as exc:
        load_config(_config(tmp_path, ggufActivations="int4"), env={})
    assert any("ggufActivations" in p for p in exc.value.problems), exc.value.problems
    with pytest.raises(Exception, match="gguf_activations"):
        EngineConfig(model="m", gguf_activations="int4").validate()
    assert load_config(_config(tmp_path, ggufActivations="int8-all"), env={}).models[0].gguf_activations == "int8-all"
    with pytest.raises(ValueError, match="ggufActivations must be one of int8, int8-all, fp32"):
        gguf_packed.set_activations(torch.nn.Linear(2, 2), "bf16")


def _generate(llm: LLM) -> list[tuple]:
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=2)
    out = llm.generate([TOKENS[:9], TOKENS[20:41]], [params] * 2, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), [dict(lp) for lp in o.outputs[0].logprobs]) for o in out]


def write_served_mix(path: Path, tokenizer_folder: Path) -> Path:
    """A random 2-layer Llama in llama.cpp's Q4_K_M mix (Q4_K; attn_v, ffn_down and the tied embeddings in Q6_K)
    with the demo tiny model's tokenizer, so an engine serves it."""
    vocab = json.loads((tokenizer_folder / "config.json").read_text())["vocab_size"]
    w = llama_writer(path, "kq", 256, 512, vocab, 2)
    _tokenizer(w, tokenizer_folder)
    rng = np.random.default_rng(0)
    for name, shape in llama_shapes(256, 512, vocab, 2).items():
        if len(shape) == 1:
            w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
            continue
        data = (rng.standard_normal(shape) * 2.0 / shape[1] ** 0.5).astype(np.float32)
        kind = "Q6_K" if name.split(".")[-2] in ("attn_v", "ffn_down", "token_embd") else "Q4_K"
        w.add_tensor(name, kquantize(data, kind), raw_dtype=gguf.GGMLQuantizationType[kind])
    finish(w)
    return path


@needs_kernels
def test_an_engine_runs_the_activations_its_config_names(tiny_model, tmp_path, monkeypatch):
    f = write_served_mix(tmp_path / "q4km.gguf", Path(tiny_model))
    fp32 = LLM(str(f), dtype="float32", gguf_activations="fp32", **POOL)
    lins = [m for m in fp32.engine.runner.model.modules() if isinstance(m, GgufLinear)]
    assert lins and all(m.int8_steps == 0 for m in lins)
    assert fp32.engine.runner.model.weights_report["GGUF activations"].startswith("fp32")
    int8 = LLM(str(f), dtype="float32", **POOL)  # the default
    lins = [m for m in int8.engine.runner.model.modules() if isinstance(m, GgufLinear)]
    model = int8.engine.runner.model
    assert model.lm_head.int8_steps == 0  # the head keeps fp32 activations
    assert all(m.int8_steps == INT8_DECODE for m in lins if m is not model.lm_head)
    assert model.weights_report["GGUF activations"].startswith("int8 per 16 columns of x (per 256: K-quants) in "
                                                               "decode steps, fp32 in prefill pieces")
    calls = count_fused_steps(monkeypatch)
    got = _generate(int8)
    assert sum(calls) >= 9  # the one-call decode step ran the Q8_K kernels inside its team, each on its thread
    # the second run's prompts come from the prefix cache, their tails prefilled alone on the fp32 kernels (the
    # same values to fp32 order: a prefill's kernel sums in another order than a lone row's)
    _close(_generate(int8), got)
    want = _generate(fp32)
    assert want != got  # the int8 kernels ran in the decode steps
    _close([(g[0][:1], g[1][:1]) for g in got], [(w[0][:1], w[1][:1]) for w in want])  # nor in the prompts' prefill
    every = LLM(str(f), dtype="float32", gguf_activations="int8-all", **POOL)
    assert all(m.int8_steps == INT8_ALL for m in every.engine.runner.model.modules()
               if isinstance(m, GgufLinear) and m is not every.engine.runner.model.lm_head)
    assert "in decode and prefill steps" in every.engine.runner.model.weights_report["GGUF activations"]
    assert [g[1][0] for g in _generate(every)] != [w[1][0] for w in want]  # int8 in the prefill too


def _close(a: list[tuple], b: list[tuple]) -> None:
    """The same tokens and top log-probs to fp32 order (1e-4)."""
    assert [x[0] for x in a] == [y[0] for y in b]
    for (_, lps_a), (_, lps_b) in zip(a, b):
        for la, lb in zip(lps_a, lps_b):
            assert la.keys() == lb.keys() and all(abs(la[t] - lb[t]) < 1e-4 for t in la), (la, lb)


@needs_kernels
def test_int8_activations_stay_near_the_dequantized_reference(tmp_path):
    """int8-all: prefill chunks of 16 and 48 rows, every one on the int8 path (each row's result its own: the same
    log-probs either way, to fp32 attention order). Bound (random 2-layer K-quant model, 47 predictions; hidden 256
    is one Q8_K block a row, so one outlier sets the whole row's step: seen KL 4.4e-3, top-1 0.957): mean
    KL(reference || int8) < 1e-2 nats and top-1 agreement >= 0.9 away from near-ties; fp32 activations on the same
    chunks stay within fp32 order (1e-4), so the difference is the int8 rows'."""
    f = write_mix(tmp_path / "q4km.gguf", "Q4_K_M")
    ref = teacher_forced_logprobs(f, TOKENS, seq_len=48, chunk=16, gguf_packed=False)
    fp32 = teacher_forced_logprobs(f, TOKENS, seq_len=48, chunk=16)
    int8 = teacher_forced_logprobs(f, TOKENS, seq_len=48, chunk=16, gguf_activations="int8-all")
    whole = teacher_forced_logprobs(f, TOKENS, seq_len=48, chunk=48, gguf_activations="int8-all")
    assert (fp32 - ref).abs().max() < 1e-4 and (whole - int8).abs().max() < 1e-4
    assert (int8 - ref).abs().max() > 1e-6  # the int8 path ran
    agree = compare("int8", ref, int8, torch.tensor(TOKENS[1:]))
    print(f"\nint8 activations vs dequantized reference: {agree}")
    assert agree.mean_kl < 1e-2 and agree.top1_agreement >= 0.9, agree


def test_the_runner_runs_decode_rows_and_prompt_rows_as_pieces_of_their_own_kind(monkeypatch):
    """ggufActivations int8 (int8 in decode steps only): a step's plain decodes and speculation's verify chunks run
    as one piece under STEP_DECODE, its prompts' chunks as others under STEP_PREFILL, in the step's chunk order;
    a model whose linears take one path in both kinds keeps mixed pieces (one forward)."""
    def chunk(rid: str, n: int, drafts: int = 0) -> ScheduledChunk:
        return ScheduledChunk(rid, 10, tuple(range(n)), (1,), sample=True, num_draft=drafts)

    out = SchedulerOutput([chunk("d1", 1), chunk("d2", 1), chunk("v", 4, drafts=3), chunk("p1", 5), chunk("p2", 7)], 2)
    runner = ModelRunner.__new__(ModelRunner)
    runner.piece_tokens, runner.split_kinds = 512, True
    seen: list[tuple[list[str], int]] = []
    monkeypatch.setattr(ModelRunner, "_fused_decode", lambda self, decodes: None)
    monkeypatch.setattr(ModelRunner, "_forward", lambda self, d, p, lg: seen.append(
        ([c.request_id for c in d + p], current_step())))
    for decodes, prefills in runner._pieces(out):
        runner._piece(decodes, prefills, {})
    assert seen == [(["d1", "d2", "v"], STEP_DECODE), (["p1", "p2"], STEP_PREFILL)]
    assert current_step() == STEP_PREFILL  # the kind does not outlive the piece
    runner.split_kinds = False
    assert [[c.request_id for c in d + p] for d, p in runner._pieces(out)] == [["d1", "d2", "v", "p1", "p2"]]
