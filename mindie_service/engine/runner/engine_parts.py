"""Everything an engine needs before its first step: the device, the weights, the tokenizer and the
size of the KV pool. Kept apart from LLMEngine so that the engine itself is wiring plus ``step()``."""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.runner.cuda_graphs import GraphPlan, graph_plan
from mindie_service.engine.runner.model_runner import kv_bytes_per_block
from mindie_service.models.loader import LoadedModel, load_model, release_checkpoint
from mindie_service.models.shard import Reduce
from mindie_service.models.gguf_checkpoint import load_tokenizer
from npu_ops import cpu_kernels, platform
from npu_ops.device import DeviceInfo, select_device
from npu_ops.distributed import on_device, threads_per_rank

logger = logging.getLogger(__name__)


@dataclass
class EngineParts:
    device_info: DeviceInfo
    loaded: LoadedModel
    tokenizer: Any
    eos_token_ids: frozenset[int]
    num_blocks: int
    graphs: GraphPlan | None = None  # CUDA graphs for decode steps (engine/runner/cuda_graphs.py); None = eager


# Bytes of one block of another pool sized with the target's (a speculative draft model's), given the device.
ExtraBlockBytes = Callable[[Any], int]


def load_parts(cfg: EngineConfig, shard: tuple[int, int, Reduce] | None = None,
               extra_block_bytes: ExtraBlockBytes | None = None) -> EngineParts:
    """``shard`` (rank, world size, all-reduce): this process is one tensor-parallel rank (engine.runner.parallel):
    it runs on its npuDeviceIds entry, with its share of the host's cores, and keeps its shard of the model.
    ``extra_block_bytes``: a pool that shares the KV budget block for block (the draft model's, engine.spec)."""
    cpu_kernels.configure(enabled=cfg.cpu_kernels, cache_dir=cfg.kernel_cache_dir)
    info = select_device(cfg.device)
    if cfg.world_size > 1 or cfg.device_ids is not None:
        info = on_device(info, cfg.rank_devices[shard[0] if shard else 0])
    info = replace(info, reason=f"{info.reason}{platform.fast_path_note(info.torch_device)}")
    device = info.torch_device
    platform.apply_thread_settings(threads_per_rank(cfg.world_size, cfg.num_threads) if cfg.world_size > 1
                                   else cfg.num_threads)
    loaded = load_model(cfg.model, cfg.dtype, device, cfg.max_seq_len, min(cfg.max_batch_size, 128),
                        quantization=cfg.quantization,
                        quantize_lm_head=cfg.quantize_lm_head, kv_cache_dtype=cfg.kv_cache_dtype, shard=shard,
                        gguf_activations=cfg.gguf_activations)
    tokenizer = load_tokenizer(cfg.model, cfg.trust_remote_code, cfg.chat_template)
    release_checkpoint(cfg.model)  # the GGUF parse both needed, and the load's freed heap, out of the RSS
    num_blocks = cfg.num_kv_blocks or auto_num_blocks(cfg, loaded, device,
                                                        extra_block_bytes(device) if extra_block_bytes else 0)
    per_block = kv_bytes_per_block(loaded.model, cfg.cache_block_size, loaded.dtype, cfg.kv_cache_dtype)
    logger.info("KV pool: %d blocks of %d tokens (%d tokens, %.1f MiB; the schedule can use %d tokens: "
                "maxBatchSize x maxSeqLen)", num_blocks, cfg.cache_block_size, num_blocks * cfg.cache_block_size,
                num_blocks * per_block / 2**20, cfg.max_batch_size * cfg.max_seq_len)
    graphs = graph_plan(cfg.cuda_graphs and cfg.world_size == 1, device, cfg.max_batch_size, cfg.max_seq_len,
                        cfg.cache_block_size)
    return EngineParts(info, loaded, tokenizer, eos_ids(loaded.hf_config, tokenizer), num_blocks, graphs)


def eos_ids(hf_config: Any, tokenizer: Any) -> frozenset[int]:
    """The checkpoint's EOS ids: the model config's (an int or a list) and the tokenizer's."""
    ids: set[int] = set()
    for src in (getattr(hf_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(i) for i in src)
    return frozenset(ids)


def auto_num_blocks(cfg: EngineConfig, loaded: LoadedModel, device: Any, draft: int = 0) -> int:
    """Blocks for maxBatchSize full-length sequences, within the device's KV budget (npu_ops.platform). A
    draft model (speculative decoding) keeps a pool of as many blocks, of ``draft`` bytes each: its share comes out
    of the same budget."""
    per_block = kv_bytes_per_block(loaded.model, cfg.cache_block_size, loaded.dtype, cfg.kv_cache_dtype)
    # each sequence's blocks, its last one partly filled (plus one to spare, as before)
    need = cfg.max_batch_size * -(-cfg.max_seq_len // cfg.cache_block_size) + 1
    budget = platform.kv_cache_budget(device, cfg.kv_cache_memory_gb)
    n = max(2, min(need, budget // (per_block + draft)))
    if draft:
        logger.info("KV budget %.1f MiB: target pool %d blocks (%.1f MiB) + draft model's pool %d blocks (%.1f MiB)",
                    budget / 2**20, n, n * per_block / 2**20, n, n * draft / 2**20)
    return n

