"""The engine's own configuration: snake_case forms of MindIE's schedule and deploy keys.

`mindie_service.config` builds one from conf/config.json; the offline `LLM` builds one from
keyword overrides. Every default lives here (and mirrors MindIE's)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from mindie_service.errors import check


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
    max_seq_len: int = 2560
    max_input_token_len: int = 2048
    truncation: bool = False
    cache_block_size: int = 128
    max_prefill_batch_size: int = 50
    max_prefill_tokens: int = 8192
    max_batch_size: int = 200
    max_iter_times: int = 512
    max_preempt_count: int = 0
    max_queue_delay_microseconds: int = 5000
    num_kv_blocks: int | None = None  # fixes the KV pool size; None = size it from memory
    kv_cache_memory_gb: float = -1.0  # npuMemSize / cpuMemSize: -1 = size automatically
    enable_prefix_caching: bool = True
    max_loras: int = 4
    max_lora_rank: int = 64
    lora_modules: tuple[LoraModuleSpec, ...] = field(default_factory=tuple)
    # Multimodal: frames sampled from each video (capped by max_video_frames).
    video_frames: int = 8
    max_video_frames: int = 32
    num_threads: int | None = None  # CPU intra-op threads; None = torch's default

    @property
    def effective_max_input_len(self) -> int:
        return min(self.max_input_token_len, self.max_seq_len - 1)

    def validate(self) -> None:
        for name in ("max_seq_len", "max_input_token_len", "cache_block_size", "max_prefill_batch_size",
                     "max_prefill_tokens", "max_batch_size", "max_iter_times"):
            v = getattr(self, name)
            check(isinstance(v, int) and v >= 1, name, "an integer >= 1", v)
        check(self.cache_block_size <= 128, "cache_block_size", "in [1, 128]", self.cache_block_size)
        check(self.max_prefill_batch_size <= self.max_batch_size, "max_prefill_batch_size",
              f"<= max_batch_size ({self.max_batch_size})", self.max_prefill_batch_size)
        check(self.max_iter_times <= self.max_seq_len, "max_iter_times", f"<= max_seq_len ({self.max_seq_len})",
              self.max_iter_times)
        check(self.max_prefill_tokens >= self.effective_max_input_len, "max_prefill_tokens",
              f">= max_input_token_len ({self.effective_max_input_len})", self.max_prefill_tokens)
        if self.num_kv_blocks is not None:
            check(isinstance(self.num_kv_blocks, int) and self.num_kv_blocks >= 1, "num_kv_blocks",
                  "an integer >= 1", self.num_kv_blocks)
        check(self.dtype in ("auto", "float32", "float16", "bfloat16"), "dtype",
              "one of auto, float32, float16, bfloat16", self.dtype)

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}
