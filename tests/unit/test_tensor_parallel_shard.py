"""Tensor-parallel sharding rules, in one process (no ranks): a column-parallel shard's outputs are the
full layer's chosen rows, the row-parallel shards' outputs sum to the full layer's (bias once), int8
linears shard with their scales, LoRA shards add up to the full delta, and the config refuses what
cannot be split."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mindie_service.config import check_files, load_config
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.errors import ConfigError, ValidationError
from mindie_service.models.llama import LlamaDims
from mindie_service.models.shard import ShardPlan, _column, _row
from npu_ops.linear import FastLinear
from npu_ops.quant import QuantLinear
from tests.server_utils import write_config

# The tiny demo model's attention shape: 4 query heads, 2 KV heads, head_dim 32, intermediate 352.
TINY = LlamaDims(hidden=128, heads=4, kv_heads=2, head_dim=32, intermediate=352, layers=4, vocab=2048, eps=1e-5,
                 qkv_bias=False, o_bias=True, mlp_bias=False, tie_embeddings=False)


def _linear(n_in: int, n_out: int, bias: bool = True, seed: int = 0) -> FastLinear:
    g = torch.Generator().manual_seed(seed)
    m = FastLinear(n_in, n_out, bias=bias)
    with torch.no_grad():
        m.weight.copy_(torch.randn(n_out, n_in, generator=g) * 0.1)
        if bias:
            m.bias.copy_(torch.randn(n_out, generator=g))
    return m


def test_kv_heads_split_when_world_divides_them_and_replicate_beyond():
    two = [ShardPlan(r, 2, TINY) for r in range(2)]
    assert [list(p.q_heads()) for p in two] == [[0, 1], [2, 3]]
    assert [list(p.kv_heads()) for p in two] == [[0], [1]]
    four = [ShardPlan(r, 4, TINY) for r in range(4)]
    # 4 ranks, 2 KV heads: each query head keeps the KV head of its group (heads 0,1 -> KV 0; 2,3 -> KV 1).
    assert [list(p.kv_heads()) for p in four] == [[0], [0], [1], [1]]
    assert four[0].local.kv_heads == 1 and four[0].local.heads == 1


@pytest.mark.parametrize("world", [3, 8])
def test_world_size_that_does_not_divide_the_heads_is_refused(world):
    with pytest.raises(ValidationError, match="worldSize must be a divisor of the model's attention heads"):
        ShardPlan(0, world, TINY)


@pytest.mark.parametrize("quant", [None, "w8a16"])
def test_column_shards_are_the_full_layers_rows_and_row_shards_sum_to_it(quant):
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(1))
    full_qkv = _linear(128, 256, bias=True, seed=2)
    full_o = _linear(128, 128, bias=True, seed=3)
    if quant:
        full_qkv, full_o = QuantLinear.from_float(full_qkv, quant), QuantLinear.from_float(full_o, quant)
    plans = [ShardPlan(r, 2, TINY) for r in range(2)]
    want_qkv = full_qkv(x)
    for p in plans:
        shard = _column(full_qkv, p.out_index("qkv_proj"))
        if quant:  # per-output-channel scales followed the rows
            assert torch.equal(shard.w_scale, full_qkv.w_scale[torch.tensor(p.out_index("qkv_proj"))])
        torch.testing.assert_close(shard(x), want_qkv[:, p.out_index("qkv_proj")], rtol=0, atol=0)
    shards = [_row(full_o, p.in_slice("o_proj"), p.rank == 0) for p in plans]
    if quant:  # a row-parallel layer keeps the full scales
        assert all(torch.equal(s.w_scale, full_o.w_scale) for s in shards)
    total = sum(s(x[:, p.in_slice("o_proj")]) for s, p in zip(shards, plans))
    torch.testing.assert_close(total, full_o(x), rtol=1e-5, atol=1e-5)  # the bias was added once


def test_lora_shards_add_up_to_the_full_delta():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 128, generator=g)
    plans = [ShardPlan(r, 2, TINY) for r in range(2)]
    a, b = torch.randn(8, 128, generator=g), torch.randn(128, 8, generator=g)  # q_proj: in 128, out 4 x 32
    for p in plans:  # column-parallel: A replicated, this rank's rows of B
        pa, pb = p.shard_lora("q_proj", a, b)
        assert torch.equal(pa, a)
        torch.testing.assert_close(x @ pa.T @ pb.T, (x @ a.T @ b.T)[:, p.out_index("q_proj")])
    ao, bo = torch.randn(8, 128, generator=g), torch.randn(128, 8, generator=g)  # o_proj: in 4 x 32
    parts = []
    for p in plans:  # row-parallel: this rank's columns of A, B replicated; the all-reduce sums the parts
        pa, pb = p.shard_lora("o_proj", ao, bo)
        assert torch.equal(pb, bo)
        parts.append(x[:, p.in_slice("o_proj")] @ pa.T @ pb.T)
    torch.testing.assert_close(parts[0] + parts[1], x @ ao.T @ bo.T, rtol=1e-5, atol=1e-4)


def test_engine_config_of_an_instance_carries_its_ranks_and_devices(tmp_path: Path, tiny_model):
    cfg_path = write_config(tmp_path / "c.json", tiny_model)
    doc = json.loads(cfg_path.read_text())
    be = doc["BackendConfig"]
    be.update(modelInstanceNumber=2, npuDeviceIds=[[0, 1], [3, 2]])
    be["ModelDeployConfig"]["ModelConfig"][0]["worldSize"] = 2
    cfg_path.write_text(json.dumps(doc))
    cfg = load_config(cfg_path)
    first, second = cfg.engine_config(0, instance=0), cfg.engine_config(0, instance=1)
    assert (first.world_size, first.rank_devices, second.rank_devices) == (2, (0, 1), (3, 2))
    assert first.device_ids is None and second.device_ids == (3, 2)  # None: the first world_size devices


def test_world_size_not_dividing_the_heads_is_refused_with_the_config_key(tmp_path: Path, tiny_model):
    cfg_path = write_config(tmp_path / "c.json", tiny_model)
    doc = json.loads(cfg_path.read_text())
    doc["BackendConfig"]["npuDeviceIds"] = [[0, 1, 2]]
    doc["BackendConfig"]["ModelDeployConfig"]["ModelConfig"][0]["worldSize"] = 3
    cfg_path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"worldSize must divide the model's num_attention_heads \(4\).*got 3"):
        check_files(load_config(cfg_path))


def test_device_ids_must_be_one_per_rank():
    with pytest.raises(ValidationError, match="device_ids"):
        EngineConfig(model="m", world_size=2, device_ids=(0,)).validate()
    EngineConfig(model="m", world_size=2, device_ids=(3, 1)).validate()
