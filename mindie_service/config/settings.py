"""The loaded configuration as frozen dataclasses: every path resolved, every default filled."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mindie_service.engine.configs.engine_config import EngineConfig, LoraModuleSpec
from mindie_service.engine.configs.kv_events_config import KVEventsConfig
from mindie_service.engine.configs.spec_config import SpeculativeConfig
from mindie_service.structured.backend import StructuredLimits

STANDARD_MOCK = "StandardMock"


@dataclass(frozen=True)
class TlsSettings:
    """One plane's TLS material; every path resolved. ``ca_files``/``crl_files`` are full paths."""

    ca_path: str
    ca_files: tuple[str, ...]
    cert: str
    pk: str
    pk_pwd: str | None  # file holding the key's password; None = unencrypted key
    crl_path: str | None
    crl_files: tuple[str, ...]


@dataclass(frozen=True)
class ServerSettings:
    ip_address: str
    port: int
    management_ip_address: str
    management_port: int
    metrics_port: int  # listens on management_ip_address
    allow_all_zero_ip: bool
    max_link_num: int
    https_enabled: bool
    tls: TlsSettings  # business plane (config.json's flat tls* keys)
    management_tls: TlsSettings  # inherits each managementTls* key it does not set from tls*
    metrics_tls: TlsSettings  # likewise metricsTls*
    full_text_enabled: bool
    token_timeout: float  # seconds
    e2e_timeout: float  # seconds
    max_request_length: int  # MB
    stream_token_id_format: str  # "list" | "int"
    allowed_local_media_paths: tuple[str, ...]
    allow_private_media_urls: bool
    media_url_allowed_hosts: tuple[str, ...]  # lower-case; empty = any host
    max_media_items: int
    batch_jobs_dir: str  # resolved against the config's folder
    batch_max_lines: int
    batch_max_running: int | None  # None = a quarter of maxBatchSize
    body_timeout: float = 30.0  # seconds to receive a body after its headers
    max_stream_buffer_bytes: int = 1 << 20  # a stream's output a slow client has not taken; beyond: aborted
    max_connections_key: int | None = None  # ServerConfig.maxConnections; None = derived
    max_decoded_media_bytes: int = 256 * 1024 * 1024
    max_image_aspect_ratio: float = 200.0
    max_video_frames_decoded: int = 2048
    open_ai_support: str = "openai"  # "openai" | "vllm": /info also advertises vLLM's extra request fields
    # (plane, SHA-256 hex of the key) of *ApiKeys; the keys themselves are not kept
    api_key_hashes: tuple[tuple[str, str], ...] = ()
    api_key_file: str | None = None  # resolved; read by server.auth at start and on SIGHUP
    management_routes_on_business_port: bool = False  # only ever served with a management key
    responses_dir: str = "responses"  # ServerConfig.responsesStore.dir, resolved
    responses_max: int = 10000  # responsesStore.maxResponses
    responses_max_age: float = 720 * 3600.0  # responsesStore.maxAgeHours, in seconds
    files_dir: str = "files"  # ServerConfig.filesStore.dir, resolved
    files_max_bytes: int = 200 * 1024 * 1024  # filesStore.maxFileBytes
    files_max_total_bytes: int = 10 * 1024 ** 3  # filesStore.maxTotalBytes, per API key
    batch_completion_windows: tuple[str, ...] = ("24h",)  # ServerConfig.batchCompletionWindows
    probe_port: int | None = None  # plain-HTTP health routes on management_ip_address (kubelet probes); None = off
    otlp_traces_endpoint: str | None = None  # OTLP/HTTP traces endpoint (server/tracing.py); None = no tracing
    # Residency (catalog/residency.py): loads on demand, how many models and how much memory, idle unloads
    business_model_loads: bool = True
    loadable_models: tuple[str, ...] | None = None  # None = every catalog model
    model_load_timeout: float = 300.0  # modelLoadTimeoutSeconds
    max_loaded_models: int | None = None
    model_memory_budget: str | None = None  # "6GiB" or "50%"
    idle_unload_seconds: float | None = None

    @property
    def max_connections(self) -> int:
        """Open connections per listener: the key, or 3 x maxLinkNum + 256."""
        return self.max_connections_key or 3 * self.max_link_num + 256

    @property
    def max_request_bytes(self) -> int:
        return self.max_request_length * 1024 * 1024

    def listeners(self) -> dict[tuple[str, int], tuple[str, ...]]:
        """(address, port) -> the planes served there, in order business, management, metrics.
        Planes sharing an address and port share one listener (with the first plane's TLS)."""
        out: dict[tuple[str, int], tuple[str, ...]] = {}
        for plane, addr in (("business", (self.ip_address, self.port)),
                            ("management", (self.management_ip_address, self.management_port)),
                            ("metrics", (self.management_ip_address, self.metrics_port))):
            out[addr] = out.get(addr, ()) + (plane,)
        if self.probe_port is not None:  # a port of its own (config rule): never TLS, never keys
            out[(self.management_ip_address, self.probe_port)] = ("probe",)
        return out


@dataclass(frozen=True)
class ModelSettings:
    instance_type: str  # "Standard" | "StandardMock"
    name: str
    weight_path: str
    world_size: int
    cpu_mem_size_gb: int
    npu_mem_size_gb: int  # -1 = size automatically
    backend_type: str
    trust_remote_code: bool
    quantization: str | None = None  # None | "w8a16" | "w8a8" | "w4a16"
    kv_cache_dtype: str = "auto"  # "auto" | "int8"
    gguf_activations: str = "int8"  # ModelConfig.ggufActivations: "int8" | "int8-all" | "fp32" (GGUF packed linears)
    dtype: str = "auto"  # ModelConfig.dtype (vLLM's --dtype): auto | float32 | float16 | bfloat16
    chat_template: str | None = None  # ModelConfig.chatTemplate (vLLM's --chat-template): replaces the checkpoint's
    generation_config: str = "vllm"  # ModelConfig.generationConfig (vLLM's --generation-config): vllm | auto | folder
    speculative: SpeculativeConfig | None = None  # plugin_params (+ speculationGamma), draft path resolved
    task: str = "auto"  # "auto" | "generate" | "embed" | "score"
    pooling: tuple[tuple[str, Any], ...] = ()  # EngineConfig.pooling: method, normalize, matryoshka

    @property
    def mock(self) -> bool:
        """StandardMock: serve with no model (frontend load tests)."""
        return self.instance_type == STANDARD_MOCK


@dataclass(frozen=True)
class BackendSettings:
    """BackendConfig and the scalar keys of its ModelDeployConfig."""

    backend_name: str
    model_instance_number: int
    npu_device_ids: tuple[tuple[int, ...], ...]
    tokenizer_process_number: int
    max_seq_len: int
    max_input_token_len: int
    truncation: bool
    max_loras: int
    max_lora_rank: int
    video_frames: int
    max_video_frames: int
    num_threads: int | None
    cpu_kernels: bool
    cuda_graphs: bool  # decode steps as CUDA graphs (engine/runner/cuda_graphs.py)
    kernel_cache_dir: str | None  # resolved; None = npu_ops's default
    multi_nodes_infer_enabled: bool = False  # ranks 1.. join by `mindie-service worker` (env rendezvous)
    multi_nodes_infer_port: int | None = None  # the rendezvous port; None = a free local port
    models_dir: str = ""  # the model catalog's folder (resolved); "" = models/ beside the config
    max_model_download_mb: int = 65536  # GET /v1/models/download/{id}: bytes fetched and unpacked, at most
    kv_events: KVEventsConfig | None = None  # kvEventsConfig; per instance: KVEventsConfig.for_instance
    instance_routing: str = "prefix"  # instanceRouting: "prefix" | "leastLoaded" (fleet.prefix_routing)
    structured: StructuredLimits = field(default_factory=StructuredLimits)  # ModelDeployConfig.structuredOutput


@dataclass(frozen=True)
class ScheduleSettings:
    cache_block_size: int
    max_prefill_batch_size: int
    max_prefill_tokens: int  # token budget of one step (chunked prefill)
    prefill_time_ms_per_req: int
    prefill_policy_type: int
    decode_time_ms_per_req: int
    decode_policy_type: int
    max_batch_size: int
    max_iter_times: int
    max_preempt_count: int
    support_select_batch: bool
    max_queue_delay_microseconds: int
    num_kv_blocks: int | None
    batch_prefill_tokens: int | None  # None = maxPrefillTokens
    batch_tokens_beside_online: int | None  # None = no bound
    decode_steps: int  # decodeSteps (engine.sched.bursts)
    enable_prefix_caching: bool
    max_sessions: int = 1024
    session_kv_share: float = 0.25
    session_idle_seconds: float = 3600.0
    max_session_tokens: int = 4194304
    session_spill_dir: str | None = None  # sessionSpillDir, resolved; None = off


@dataclass(frozen=True)
class LogSettings:
    level: str  # Debug | Info | Warning | Error | Critical
    path: str | None  # None = stderr only
    file_size_mb: int
    file_num: int


@dataclass(frozen=True)
class ServiceConfig:
    path: Path  # the config file, absolute
    server: ServerSettings
    backend: BackendSettings
    models: tuple[ModelSettings, ...]
    schedule: ScheduleSettings
    lora_modules: tuple[LoraModuleSpec, ...]  # paths resolved; base_model_name always set
    log: LogSettings
    raw: dict[str, Any] = field(compare=False, repr=False)  # the file as read (no env, no defaults)
    # /api/* generation_config defaults: env MINDIE_GEN_* (and .env) over GenerationDefaults over model.json
    generation_defaults: dict[str, Any] = field(default_factory=dict, compare=False)

    def model(self, name: str) -> ModelSettings:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)

    def engine_config(self, model_index: int = 0, instance: int = 0) -> EngineConfig:
        """The EngineConfig of one instance of model ``model_index``: its ranks run on the devices of
        the instance's ``npuDeviceIds`` group."""
        m, b, s = self.models[model_index], self.backend, self.schedule
        group: tuple[int, ...] | None = b.npu_device_ids[instance] if instance < len(b.npu_device_ids) else None
        if group == tuple(range(m.world_size)):
            group = None  # EngineConfig's default: the first world_size devices
        return EngineConfig(
            world_size=m.world_size, device_ids=group, multi_node=b.multi_nodes_infer_enabled,
            dist_port=b.multi_nodes_infer_port,
            model=m.weight_path, model_name=m.name, trust_remote_code=m.trust_remote_code,
            quantization=m.quantization, kv_cache_dtype=m.kv_cache_dtype, gguf_activations=m.gguf_activations,
            dtype=m.dtype,
            chat_template=m.chat_template, task=m.task, pooling=m.pooling,
            max_seq_len=b.max_seq_len, max_input_token_len=b.max_input_token_len, truncation=b.truncation,
            cache_block_size=s.cache_block_size, max_prefill_batch_size=s.max_prefill_batch_size,
            max_prefill_tokens=s.max_prefill_tokens, max_batch_size=s.max_batch_size,
            max_iter_times=s.max_iter_times, max_preempt_count=s.max_preempt_count,
            max_queue_delay_microseconds=s.max_queue_delay_microseconds, num_kv_blocks=s.num_kv_blocks,
            batch_prefill_tokens=s.batch_prefill_tokens, batch_tokens_beside_online=s.batch_tokens_beside_online,
            decode_steps=s.decode_steps,
            kv_cache_memory_gb=float(m.npu_mem_size_gb), swap_space_gb=float(m.cpu_mem_size_gb),
            enable_prefix_caching=s.enable_prefix_caching,
            max_loras=b.max_loras, max_lora_rank=b.max_lora_rank,
            lora_modules=tuple(lo for lo in self.lora_modules if lo.base_model_name == m.name),
            video_frames=b.video_frames, max_video_frames=b.max_video_frames, num_threads=b.num_threads,
            cpu_kernels=b.cpu_kernels, cuda_graphs=b.cuda_graphs, kernel_cache_dir=b.kernel_cache_dir,
            max_sessions=s.max_sessions,
            session_kv_share=s.session_kv_share, session_idle_seconds=s.session_idle_seconds,
            max_session_tokens=s.max_session_tokens,
            session_spill_dir=None if s.session_spill_dir is None else (
                s.session_spill_dir if b.model_instance_number * len(self.models) == 1
                else f"{s.session_spill_dir}/{m.name}-{instance}"),
            kv_events=None if b.kv_events is None else b.kv_events.for_instance(
                model_index * b.model_instance_number + instance),
            speculative_config=m.speculative, structured=b.structured)
