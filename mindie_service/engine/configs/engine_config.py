"""The engine's own configuration: snake_case forms of MindIE's schedule and deploy keys.

`mindie_service.config` builds one from conf/config.json; the offline `LLM` builds one from
keyword overrides. Every default lives here (and mirrors MindIE's). The cross-field rules live
here once (`cross_field_problems`): the offline API reports them with snake_case names, config
loading with MindIE key paths."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from mindie_service.engine.configs.kv_events_config import KVEventsConfig
from mindie_service.engine.configs.spec_config import SpeculativeConfig, as_speculative_config
from mindie_service.errors import check
from mindie_service.structured.backend import StructuredLimits


@dataclass(frozen=True)
class LoraModuleSpec:
    name: str
    path: str
    base_model_name: str = ""


@dataclass(frozen=True)
class EngineConfig:
    model: str  # path of a Hugging Face style checkpoint folder
    model_name: str = ""
    dtype: str = "auto"  # auto = the checkpoint's torch_dtype on accelerators, float32 on CPU
    device: str | None = None  # None = choose npu -> cuda -> cpu
    trust_remote_code: bool = False
    chat_template: str | None = None  # replaces the tokenizer's (ModelConfig.chatTemplate, vLLM's --chat-template)
    max_seq_len: int = 2560
    max_input_token_len: int = 2048
    truncation: bool = False
    cache_block_size: int = 128
    max_prefill_batch_size: int = 50
    # Token budget of one step (vLLM's max_num_batched_tokens): a longer prompt is prefilled in chunks.
    max_prefill_tokens: int = 8192
    max_batch_size: int = 200
    max_iter_times: int = 512
    # Preemptions for want of blocks in one scheduling round (engine.sched.scheduler); 0 (MindIE's default) turns
    # preemption off: requests are admitted with blocks reserved for their prompt plus their maximum output.
    max_preempt_count: int = 0
    # With nothing running, how long new prompts wait for others to join their prefill batch; 0 = not at all.
    max_queue_delay_microseconds: int = 5000
    # Batch-job lines below online traffic (engine.sched.batch_bound): their prompt tokens in any one step (None =
    # max_prefill_tokens), and their tokens in all in a step while an online request waits or prefills
    # (None = no bound).
    batch_prefill_tokens: int | None = 64
    batch_tokens_beside_online: int | None = 8
    # Decode steps one runner call runs for a few plain greedy decodes with nothing waiting, while that many
    # measured steps fit in 40 ms (engine.sched.bursts); 1 = one step a call. Tokens stream in bursts.
    decode_steps: int = 8
    num_kv_blocks: int | None = None  # fixes the KV pool size; None = size it from memory
    kv_cache_memory_gb: float = -1.0  # npuMemSize / cpuMemSize: -1 = size automatically
    swap_space_gb: float = 5.0  # cpuMemSize: host pool for preempted requests' K/V (engine.kv.swap); 0 = recompute
    enable_prefix_caching: bool = True
    max_loras: int = 4
    max_lora_rank: int = 64
    lora_modules: tuple[LoraModuleSpec, ...] = field(default_factory=tuple)
    # Multimodal: frames sampled from each video (capped by max_video_frames).
    video_frames: int = 8
    max_video_frames: int = 32
    num_threads: int | None = None  # CPU intra-op threads; None = torch's default
    cpu_kernels: bool = True  # the C kernels / packed-linear fast path on CPU (env MINDIE_CPU_KERNELS overrides)
    kernel_cache_dir: str | None = None  # where compiled kernels are kept; None = the default (env MINDIE_KERNEL_CACHE overrides)
    cuda_graphs: bool = True  # decode steps replayed as CUDA graphs on CUDA (engine/runner/cuda_graphs.py); False = eager
    # Weight quantization at load (npu_ops.quant): None = as loaded, "w8a16", "w8a8" or "w4a16" (npu_ops.quant_w4a16:
    # int4 in groups of 128). A checkpoint already quantized (msModelSlim, W4A16: models/w4a16_checkpoint.py) loads
    # as it is.
    quantization: str | None = None
    # The output projection quantized too (same scheme, per output channel; issue 27): a quarter of its
    # bytes per decoded token, at a measured cost in top-1 agreement (tools/bench_real.py --int8-head).
    quantize_lm_head: bool = False
    kv_cache_dtype: str = "auto"  # "auto" = the model dtype; "int8" = int8 K/V with per-token, per-head scales
    # A GGUF's packed linears (models/gguf_packed.set_activations): "int8" = x quantized per 16 columns as llama.cpp
    # does, in decode steps (faster; each x element off by at most half a step), prefill pieces on the exact kernels;
    # "int8-all" = prefill pieces too; "fp32" = always the exact kernels
    gguf_activations: str = "int8"
    # What the model serves (models/pooling_spec.py): "auto" = all its checkpoint can (a causal LM generates and
    # embeds), or one of "generate", "embed", "score"; ``pooling`` overrides the checkpoint's pooling: (key, value)
    # pairs of method ("last" | "mean" | "cls"), normalize (bool), matryoshka (True or a tuple of widths).
    task: str = "auto"
    pooling: tuple[tuple[str, Any], ...] = ()
    # Sessions (continue a finished generation by its request_id; engine.sessions.session_store): how many are kept, the
    # share of the KV pool their pinned blocks may hold, the idle time after which one is dropped, and
    # the token ids all of them may keep.
    max_sessions: int = 1024
    session_kv_share: float = 0.25
    session_idle_seconds: float = 3600.0
    max_session_tokens: int = 4194304
    # A folder where kept sessions are written on drain and eviction and read back at start (engine.sessions.session_spill);
    # None = sessions live in memory only.
    session_spill_dir: str | None = None
    # Tensor parallelism (engine.runner.parallel): ranks of this instance (worldSize), one process each, and the
    # instance's npuDeviceIds group (logical device ids, one per rank; None = 0..world_size-1). On the
    # CPU the ids only count ranks. multi_node: ranks 1.. are not spawned but join through torch's env
    # rendezvous (`mindie-service worker --rank R`) on dist_port (multiNodesInferPort; None = a free port).
    world_size: int = 1
    device_ids: tuple[int, ...] | None = None
    multi_node: bool = False
    dist_port: int | None = None
    # Structured output (ModelDeployConfig.structuredOutput): compile limits, the compile cache, forced runs.
    structured: StructuredLimits = field(default_factory=StructuredLimits)
    # KV-cache events in vLLM's wire format over ZMQ (engine.kv.kv_events); None or not enabled = off.
    kv_events: KVEventsConfig | None = None
    # Speculative decoding (engine.spec.speculator): None = off; vLLM's dict is accepted and converted.
    speculative_config: SpeculativeConfig | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "speculative_config", as_speculative_config(self.speculative_config))

    @property
    def rank_devices(self) -> tuple[int, ...]:
        """The logical device id of each rank (device_ids, or the first world_size devices)."""
        return self.device_ids if self.device_ids is not None else tuple(range(self.world_size))

    @property
    def effective_max_input_len(self) -> int:
        return min(self.max_input_token_len, self.max_seq_len - 1)

    def validate(self) -> None:
        for name in ("max_seq_len", "max_input_token_len", "cache_block_size", "max_prefill_batch_size",
                     "max_prefill_tokens", "max_batch_size", "max_iter_times"):
            v = getattr(self, name)
            check(isinstance(v, int) and v >= 1, name, "an integer >= 1", v)
        check(self.cache_block_size <= 128, "cache_block_size", "in [1, 128]", self.cache_block_size)
        check(isinstance(self.max_preempt_count, int) and self.max_preempt_count >= 0, "max_preempt_count",
              "an integer >= 0", self.max_preempt_count)
        check(isinstance(self.max_queue_delay_microseconds, int) and self.max_queue_delay_microseconds >= 0,
              "max_queue_delay_microseconds", "an integer >= 0", self.max_queue_delay_microseconds)
        check(isinstance(self.swap_space_gb, (int, float)) and self.swap_space_gb >= 0, "swap_space_gb",
              "a number >= 0 (GB)", self.swap_space_gb)
        check(isinstance(self.decode_steps, int) and 1 <= self.decode_steps <= 64, "decode_steps",
              "an integer in [1, 64]", self.decode_steps)
        for name in ("batch_prefill_tokens", "batch_tokens_beside_online"):
            v = getattr(self, name)
            check(v is None or (isinstance(v, int) and v >= 1), name, "an integer >= 1 or None", v)
        if self.num_kv_blocks is not None:
            check(isinstance(self.num_kv_blocks, int) and self.num_kv_blocks >= 1, "num_kv_blocks",
                  "an integer >= 1", self.num_kv_blocks)
        check(self.dtype in ("auto", "float32", "float16", "bfloat16"), "dtype",
              "one of auto, float32, float16, bfloat16", self.dtype)
        check(self.quantization in (None, "w8a16", "w8a8", "w4a16"), "quantization", "one of None, w8a16, w8a8, w4a16",
              self.quantization)
        check(self.quantization != "w4a16" or self.world_size == 1, "quantization",
              "not w4a16 with tensor parallelism (int4 weights are not sharded)", self.quantization)
        check(self.kv_cache_dtype in ("auto", "int8"), "kv_cache_dtype", "one of auto, int8", self.kv_cache_dtype)
        check(self.gguf_activations in ("int8", "int8-all", "fp32"), "gguf_activations", "one of int8, int8-all, fp32",
              self.gguf_activations)
        check(self.task in ("auto", "generate", "embed", "score"), "task", "one of auto, generate, embed, score",
              self.task)
        check(self.kernel_cache_dir is None or (isinstance(self.kernel_cache_dir, str) and self.kernel_cache_dir != ""),
              "kernel_cache_dir", "a non-empty string or None", self.kernel_cache_dir)
        check(isinstance(self.world_size, int) and self.world_size >= 1, "world_size", "an integer >= 1",
              self.world_size)
        if self.device_ids is not None:
            check(len(self.device_ids) == self.world_size and all(isinstance(i, int) and i >= 0 for i in self.device_ids),
                  "device_ids", f"{self.world_size} distinct device ids >= 0 (one per rank)", self.device_ids)
            check(len(set(self.device_ids)) == len(self.device_ids), "device_ids", "distinct ids", self.device_ids)
        if self.kv_events is not None:
            self.kv_events.validate()
        if self.speculative_config is not None:
            self.speculative_config.validate()
        for p in cross_field_problems({f.name: getattr(self, f.name) for f in fields(self)}):
            check(False, p.field, p.rule(str), p.value)

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}


@dataclass(frozen=True)
class FieldProblem:
    """One broken cross-field rule. ``template`` names other fields as ``{field_name}`` so each
    caller can word them its own way (snake_case here, MindIE key paths in config loading)."""

    field: str
    template: str  # the phrase after "must be"
    value: Any

    def rule(self, name: Callable[[str], str]) -> str:
        return self.template.format_map(_Names(name))


class _Names(dict[str, str]):
    def __init__(self, name: Callable[[str], str]) -> None:
        super().__init__()
        self._name = name

    def __missing__(self, key: str) -> str:
        return self._name(key)


def cross_field_problems(v: Mapping[str, Any]) -> list[FieldProblem]:
    """Every cross-field rule over EngineConfig field values. A rule whose inputs are absent or
    None (config loading passes None for keys that already failed their own check) is skipped.
    There is no maxPrefillTokens >= maxInputTokenLen rule: with chunked prefill
    max_prefill_tokens is the budget of one step and a longer prompt spans several steps."""
    def have(*names: str) -> bool:
        return all(v.get(n) is not None for n in names)

    out: list[FieldProblem] = []
    if have("max_prefill_batch_size", "max_batch_size") and v["max_prefill_batch_size"] > v["max_batch_size"]:
        out.append(FieldProblem("max_prefill_batch_size", f"<= {{max_batch_size}} ({v['max_batch_size']})",
                                v["max_prefill_batch_size"]))
    if have("max_iter_times", "max_seq_len") and v["max_iter_times"] > v["max_seq_len"]:
        out.append(FieldProblem("max_iter_times", f"<= {{max_seq_len}} ({v['max_seq_len']})", v["max_iter_times"]))
    if have("max_preempt_count", "max_batch_size") and v["max_preempt_count"] > v["max_batch_size"]:
        out.append(FieldProblem("max_preempt_count", f"<= {{max_batch_size}} ({v['max_batch_size']})",
                                v["max_preempt_count"]))
    if have("video_frames", "max_video_frames") and v["video_frames"] > v["max_video_frames"]:
        out.append(FieldProblem("video_frames", f"<= {{max_video_frames}} ({v['max_video_frames']})",
                                v["video_frames"]))
    return out
