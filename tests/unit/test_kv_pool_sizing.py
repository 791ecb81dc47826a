"""The KV pool's size from the config: npuMemSize (GB of KV cache; host memory on the CPU) flows through
ServiceConfig.engine_config() into the engine's block count; -1 sizes it from the device's memory; a
fixed numKvBlocks wins; the pool is never sized past maxBatchSize full-length sequences."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from mindie_service import LLM, SamplingParams
from mindie_service.config import load_config
from mindie_service.engine.runner.engine_parts import auto_num_blocks
from npu_ops import platform
from tests.server_utils import write_config

GIB = 1 << 30


def fake_loaded(layers: int = 32, kv_heads: int = 8, head_dim: int = 128) -> SimpleNamespace:
    """A Llama-8B-like shape without its weights: 128 KiB of fp16 K+V per token."""
    dims = SimpleNamespace(layers=layers, kv_heads=kv_heads, head_dim=head_dim)
    return SimpleNamespace(model=SimpleNamespace(dims=dims), dtype=torch.float16)


def engine_config(tmp_path, tiny_model, npu_mem: int, **schedule):
    deploy = {"maxSeqLen": 8192, "maxInputTokenLen": 4096,
              "ModelConfig": [{"modelName": "tiny", "modelWeightPath": str(tiny_model), "npuMemSize": npu_mem}]}
    sched = {"numKvBlocks": None, "cacheBlockSize": 128, "maxBatchSize": 200, "maxPrefillBatchSize": 50,
             "maxIterTimes": 512, **schedule}
    return load_config(write_config(tmp_path / "config.json", tiny_model, deploy=deploy, schedule=sched)).engine_config()


@pytest.mark.parametrize("gb", [1, 3, 16])
def test_npu_mem_size_is_the_pool_budget_in_gb(tmp_path, tiny_model, monkeypatch, gb):
    monkeypatch.setattr(platform, "memory_info", lambda d: pytest.fail("a fixed npuMemSize needs no memory query"))
    cfg = engine_config(tmp_path, tiny_model, gb)
    assert cfg.kv_cache_memory_gb == gb
    per_block = 2 * 32 * 128 * 8 * 128 * 2  # K and V, 32 layers, 128 tokens, 8 heads x 128, fp16
    assert auto_num_blocks(cfg, fake_loaded(), torch.device("cpu")) == gb * GIB // per_block


def test_minus_one_sizes_the_pool_from_the_devices_memory(tmp_path, tiny_model, monkeypatch):
    monkeypatch.setattr(platform, "_host_memory", lambda: (8 * GIB, 16 * GIB))  # 25% of 8 GiB: 2 GiB
    cfg = engine_config(tmp_path, tiny_model, -1)
    assert cfg.kv_cache_memory_gb == -1
    assert auto_num_blocks(cfg, fake_loaded(), torch.device("cpu")) == 2 * GIB // (2 * 32 * 128 * 8 * 128 * 2)


def test_the_pool_never_exceeds_max_batch_size_full_sequences(tmp_path, tiny_model):
    cfg = engine_config(tmp_path, tiny_model, 64, maxBatchSize=4, maxPrefillBatchSize=4)
    assert auto_num_blocks(cfg, fake_loaded(), torch.device("cpu")) == 4 * 8192 // 128 + 1


def test_the_schedules_need_counts_each_sequences_last_partial_block(tmp_path, tiny_model):
    """maxSeqLen 8000 in 128-token blocks: a full-length sequence holds 63 blocks (the last one partly filled),
    so 4 of them need 4 x 63 (+ 1) blocks, not 4 x 8000 // 128 (+ 1) = 251, which leaves the fourth short."""
    cfg = engine_config(tmp_path, tiny_model, 64, maxBatchSize=4, maxPrefillBatchSize=4)
    cfg = dataclasses.replace(cfg, max_seq_len=8000)
    assert auto_num_blocks(cfg, fake_loaded(), torch.device("cpu")) == 4 * 63 + 1


def test_a_real_engine_gets_the_blocks_its_budget_buys(tiny_model):
    """The tiny model (4 layers, 2 KV heads of 32, fp32) with 16-token blocks: 32 KiB per block, so a budget
    of 1/1024 GiB buys 32 blocks, allocated, in the scheduler's pool and in the runner's caches."""
    llm = LLM(str(tiny_model), cache_block_size=16, kv_cache_memory_gb=1 / 1024, max_seq_len=512)
    assert llm.engine.stats().total_blocks == 32
    assert llm.engine.runner.kv_caches[0][0].shape[0] == 32
    fixed = LLM(str(tiny_model), cache_block_size=16, kv_cache_memory_gb=1 / 1024, num_kv_blocks=40,
                max_seq_len=512)
    assert fixed.engine.stats().total_blocks == 40  # numKvBlocks wins over the budget


def test_the_draft_models_pool_comes_out_of_the_budget(tiny_model, caplog):
    """Speculation with a draft model (tiny-draft: 1 layer, 2 KV heads of 32, fp32: 8 KiB per 16-token block)
    beside the tiny target (32 KiB per block): 1/1024 GiB buys 1 MiB // 40 KiB = 25 blocks for each pool, and
    the two pools allocated together stay within the budget; both are logged."""
    from mindie_service.devkit.presets import build_demo_model
    from tests.conftest import ROOT

    draft = build_demo_model("tiny-draft", ROOT / "models" / "tiny-draft", if_missing=True)
    spec = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3}
    with caplog.at_level("INFO"):
        llm = LLM(str(tiny_model), cache_block_size=16, kv_cache_memory_gb=1 / 1024, max_seq_len=512,
                  speculative_config=spec)
    target, proposer = llm.engine.runner, llm.engine.spec.draft
    assert llm.engine.stats().total_blocks == 25 and proposer.blocks.num_blocks == 25
    assert target.kv_pool.nbytes + proposer.runner.kv_pool.nbytes <= GIB // 1024
    assert proposer.runner.kv_pool.nbytes == 25 * proposer.block_bytes == 25 * 8 * 1024
    assert any("draft model's pool 25 blocks" in r.getMessage() for r in caplog.records)
    out = llm.generate(["river mountain city"], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 8


def test_the_generate_cli_sizes_its_pool_for_its_prompts(tiny_model, monkeypatch, capsys):
    """`mindie-service generate` runs its prompts at once and nothing else: its schedule is that many sequences,
    so its pool holds len(prompts) x maxSeqLen tokens (2 x 2560 in 128-token blocks, plus one), not the automatic
    budget's worth of 200 sequences (issue 43: the CLI held 5.6 GB for one prompt on SmolLM2)."""
    import mindie_service
    from mindie_service import cli

    built: list[LLM] = []

    class Recorded(LLM):
        def __init__(self, *args, **kw) -> None:
            super().__init__(*args, **kw)
            built.append(self)

    monkeypatch.setattr(mindie_service, "LLM", Recorded)
    assert cli.main(["generate", "--model", str(tiny_model), "--max-tokens", "2", "river", "mountain"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert built[0].engine.stats().total_blocks == 2 * 2560 // 128 + 1


def test_the_shipped_configs_pool_is_the_smaller_of_its_schedule_and_its_budget(monkeypatch):
    """`make serve`'s config on SmolLM2-135M's shape (30 layers, 3 KV heads of 64, fp32: 720 KiB a 16-token block):
    its schedule can use 64 x 2560 tokens (7.0 GiB), so npuMemSize's 2 GB caps the pool (2912 blocks); with 8
    sequences the schedule's 1281 blocks (0.9 GiB) are the pool, not the whole budget (numKvBlocks asks for more:
    test_a_real_engine_gets_the_blocks_its_budget_buys)."""
    from tests.server_utils import ROOT

    monkeypatch.setattr(platform, "memory_info", lambda d: pytest.fail("a fixed npuMemSize needs no memory query"))
    cfg = load_config(ROOT / "conf" / "config.json").engine_config()
    smollm = SimpleNamespace(model=SimpleNamespace(dims=SimpleNamespace(layers=30, kv_heads=3, head_dim=64)),
                             dtype=torch.float32)
    assert (cfg.max_batch_size, cfg.max_seq_len, cfg.cache_block_size, cfg.kv_cache_memory_gb) == (64, 2560, 16, 2)
    assert auto_num_blocks(cfg, smollm, torch.device("cpu")) == 2 * GIB // (16 * 2 * 30 * 3 * 64 * 4) == 2912
    small = dataclasses.replace(cfg, max_batch_size=8, max_prefill_batch_size=8, max_preempt_count=8)
    assert auto_num_blocks(small, smollm, torch.device("cpu")) == 8 * 2560 // 16 + 1
