"""config.json -> ServiceConfig. In order: read the JSON -> apply the env overrides -> JSON Schema
(every error collected) -> fill defaults from the schema -> cross-key checks (every problem
collected) -> dataclasses. One ``ConfigError`` carries one message per problem. Relative paths
resolve against the config file's folder."""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from mindie_service.config.gen_defaults import generation_defaults
from mindie_service.config.messages import S, schema_problems
from mindie_service.config.rules import PluginParams, cross_key_problems, parse_plugin_params
from mindie_service.config.schema import load_schema
from mindie_service.config.settings import (BackendSettings, LogSettings, ModelSettings, ScheduleSettings,
                                            ServerSettings, ServiceConfig, TlsSettings)
from mindie_service.engine.configs.engine_config import LoraModuleSpec
from mindie_service.engine.configs.kv_events_config import KVEventsConfig
from mindie_service.engine.configs.spec_config import SpeculativeConfig
from mindie_service.errors import ConfigError
from mindie_service.structured.backend import StructuredLimits

logger = logging.getLogger(__name__)

ENV_IP = "MIES_CONTAINER_IP"
ENV_MANAGEMENT_IP = "MIES_CONTAINER_MANAGEMENT_IP"


def load_config(path: str | Path, env: Mapping[str, str] | None = None,
                overrides: Callable[[dict[str, Any]], Mapping[str, str]] | None = None) -> ServiceConfig:
    """Read, validate and resolve a config.json. ``env`` defaults to ``os.environ`` (read now). ``overrides``
    changes the JSON before it is checked (`serve MODEL --flags`, vllm_cli.py) and returns key path -> what set it,
    so that a problem names the flag."""
    cfg_path = Path(os.path.abspath(Path(path).expanduser()))
    env = os.environ if env is None else env
    raw = _read_json(cfg_path)
    data = copy.deepcopy(raw)
    sources = _apply_env(data, env)
    if overrides is not None and isinstance(data, dict):
        sources |= overrides(data)
    problems, bad = schema_problems(data, sources)
    plugins: dict[int, PluginParams] = {}
    if isinstance(data, dict):
        _fill_defaults(load_schema(), data)
        plugins = parse_plugin_params(data, bad)  # once: the checks word its errors, _build keeps its values
        problems += cross_key_problems(data, bad, sources, plugins)
    if problems:
        raise ConfigError([f"{path}: {p}" for p in problems])
    logger.debug("loaded %s (env overrides: %s)", cfg_path, sorted(sources.values()) or "none")
    built = _build(cfg_path, data, raw, plugins)
    gen = generation_defaults(cfg_path, data.get("GenerationDefaults") or {}, env, built.models[0].weight_path)
    return dataclasses.replace(built, generation_defaults=gen)


# -- reading ------------------------------------------------------------------------------------
class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the config file: {getattr(e, 'strerror', None) or e}") from e
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from e
    except _DuplicateKey as e:
        raise ConfigError(f"{path}: invalid JSON: key {e.args[0]!r} appears twice in one object") from e
    except ValueError as e:
        raise ConfigError(f"{path}: invalid JSON: {e}") from e


def _apply_env(data: Any, env: Mapping[str, str]) -> dict[str, str]:
    """Apply MIES_CONTAINER_IP / MIES_CONTAINER_MANAGEMENT_IP; returns key path -> env var."""
    sources: dict[str, str] = {}
    if not isinstance(data, dict):
        return sources
    for var, key in ((ENV_IP, "ipAddress"), (ENV_MANAGEMENT_IP, "managementIpAddress")):
        value = (env.get(var) or "").strip()
        if value and isinstance(data.setdefault(S, {}), dict):
            data[S][key] = value
            sources[f"{S}.{key}"] = var
    return sources


def _fill_defaults(schema: Mapping[str, Any], data: Any) -> None:
    if isinstance(data, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in data and "default" in sub:
                data[key] = copy.deepcopy(sub["default"])
            if key in data:
                _fill_defaults(sub, data[key])
    elif isinstance(data, list) and isinstance(schema.get("items"), dict):
        for item in data:
            _fill_defaults(schema["items"], item)


# -- building the dataclasses (data is valid and complete here) ---------------------------------
def _resolve(base: str | Path, p: str) -> str:
    q = Path(p).expanduser()
    return os.path.normpath(q if q.is_absolute() else Path(base) / q)


def _generation_config(base: Path, value: str, i: int) -> str:
    """ModelConfig[i].generationConfig: vllm, auto, or a folder (resolved against the config's folder) that holds
    a generation_config.json (vLLM reads the file there; a folder without one would change nothing)."""
    if value in ("vllm", "auto"):
        return value
    folder = _resolve(base, value)
    if not os.path.isfile(os.path.join(folder, "generation_config.json")):
        raise ConfigError(f"ModelConfig[{i}].generationConfig: {value!r} must be vllm, auto or a folder holding a "
                          f"generation_config.json ({folder} has none)")
    return folder


def _tls(srv: dict[str, Any], base: Path, prefix: str) -> TlsSettings:
    """One plane's TLS from the flat keys: ``tls*``, or ``<prefix>Tls*`` falling back to ``tls*``."""
    def get(name: str) -> Any:
        value = srv.get(f"{prefix}Tls{name}") if prefix else None
        return srv.get(f"tls{name}") if value is None else value

    ca_path = _resolve(base, get("CaPath"))  # one CA folder for every plane, as in MindIE
    crl_path = _resolve(base, get("CrlPath")) if get("CrlPath") else None
    return TlsSettings(
        ca_path=ca_path, ca_files=tuple(_resolve(ca_path, f) for f in get("CaFile")),
        cert=_resolve(base, get("Cert")), pk=_resolve(base, get("Pk")),
        pk_pwd=_resolve(base, get("PkPwd")) if get("PkPwd") else None,
        crl_path=crl_path, crl_files=tuple(_resolve(crl_path or base, f) for f in get("CrlFiles")))


def _server(srv: dict[str, Any], base: Path) -> ServerSettings:
    return ServerSettings(
        ip_address=srv["ipAddress"], port=int(srv["port"]),
        management_ip_address=srv.get("managementIpAddress", srv["ipAddress"]),
        management_port=int(srv["managementPort"]), metrics_port=int(srv["metricsPort"]),
        allow_all_zero_ip=srv["allowAllZeroIpListening"], max_link_num=int(srv["maxLinkNum"]),
        https_enabled=srv["httpsEnabled"], tls=_tls(srv, base, ""), management_tls=_tls(srv, base, "management"),
        metrics_tls=_tls(srv, base, "metrics"), full_text_enabled=srv["fullTextEnabled"],
        token_timeout=float(srv["tokenTimeout"]), e2e_timeout=float(srv["e2eTimeout"]),
        max_request_length=int(srv["maxRequestLength"]), stream_token_id_format=srv["streamTokenIdFormat"],
        allowed_local_media_paths=tuple(_resolve(base, p) for p in srv["allowedLocalMediaPaths"]),
        allow_private_media_urls=srv["allowPrivateMediaUrls"],
        media_url_allowed_hosts=tuple(h.lower() for h in srv["mediaUrlAllowedHosts"]),
        max_media_items=int(srv["maxMediaItems"]), batch_jobs_dir=_resolve(base, srv["batchJobsDir"]),
        batch_max_lines=int(srv["batchMaxLines"]),
        batch_max_running=None if srv["batchMaxRunning"] is None else int(srv["batchMaxRunning"]), body_timeout=float(srv["bodyTimeoutSeconds"]),
        max_stream_buffer_bytes=int(srv["maxStreamBufferBytes"]),
        max_connections_key=srv["maxConnections"], max_decoded_media_bytes=int(srv["maxDecodedMediaBytes"]),
        max_image_aspect_ratio=float(srv["maxImageAspectRatio"]),
        max_video_frames_decoded=int(srv["maxVideoFramesDecoded"]),
        open_ai_support=srv.get("openAiSupport") or "openai", api_key_hashes=_key_hashes(srv),
        api_key_file=_resolve(base, srv["apiKeyFile"]) if srv.get("apiKeyFile") else None,
        management_routes_on_business_port=bool(srv.get("managementRoutesOnBusinessPort")),
        probe_port=None if srv.get("probePort") is None else int(srv["probePort"]),
        otlp_traces_endpoint=srv["otlpTracesEndpoint"],
        business_model_loads=srv["businessModelLoads"],
        loadable_models=None if srv["loadableModels"] is None else tuple(srv["loadableModels"]),
        model_load_timeout=float(srv["modelLoadTimeoutSeconds"]), max_loaded_models=srv["maxLoadedModels"],
        model_memory_budget=srv["modelMemoryBudget"],
        idle_unload_seconds=None if srv["idleUnloadSeconds"] is None else float(srv["idleUnloadSeconds"]),
        responses_dir=_resolve(base, srv["responsesStore"]["dir"]),
        responses_max=int(srv["responsesStore"]["maxResponses"]),
        responses_max_age=float(srv["responsesStore"]["maxAgeHours"]) * 3600.0,
        files_dir=_resolve(base, srv["filesStore"]["dir"]), files_max_bytes=int(srv["filesStore"]["maxFileBytes"]),
        files_max_total_bytes=int(srv["filesStore"]["maxTotalBytes"]),
        batch_completion_windows=tuple(srv["batchCompletionWindows"]))


def _key_hashes(srv: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """(plane, SHA-256 hex) of each configured API key: only their hashes leave the file."""
    return tuple((plane, hashlib.sha256(k.encode()).hexdigest())
                 for plane in ("business", "management", "metrics") for k in srv.get(f"{plane}ApiKeys") or ())


def _backend(be: dict[str, Any], base: Path) -> BackendSettings:
    dep = be["ModelDeployConfig"]
    return BackendSettings(
        backend_name=be["backendName"], model_instance_number=int(be["modelInstanceNumber"]),
        npu_device_ids=tuple(tuple(int(i) for i in g) for g in be["npuDeviceIds"]),
        tokenizer_process_number=int(be["tokenizerProcessNumber"]), max_seq_len=int(dep["maxSeqLen"]),
        max_input_token_len=int(dep["maxInputTokenLen"]), truncation=dep["truncation"],
        max_loras=int(dep["maxLoras"]), max_lora_rank=int(dep["maxLoraRank"]), video_frames=int(dep["videoFrames"]),
        max_video_frames=int(dep["maxVideoFrames"]),
        num_threads=None if dep["numThreads"] is None else int(dep["numThreads"]),
        cpu_kernels=dep["cpuKernels"], cuda_graphs=dep["cudaGraphs"],
        kernel_cache_dir=None if dep["kernelCacheDir"] is None else _resolve(base, dep["kernelCacheDir"]),
        models_dir=_resolve(base, dep["modelsDir"]), max_model_download_mb=int(dep["maxModelDownloadMb"]),
        multi_nodes_infer_enabled=bool(be.get("multiNodesInferEnabled", False)),
        multi_nodes_infer_port=None if be.get("multiNodesInferPort") is None else int(be["multiNodesInferPort"]),
        kv_events=_kv_events(be.get("kvEventsConfig") or {}), instance_routing=be["instanceRouting"],
        structured=structured_limits(dep.get("structuredOutput") or {}))


_STRUCTURED_KEYS = {"maxLexerStates": "max_lexer_states", "initialLexerFuel": "initial_lexer_fuel",
                    "stepLexerFuel": "step_lexer_fuel", "stepMaxItems": "step_max_items",
                    "maxItemsInRow": "max_items_in_row", "maxGrammarSize": "max_grammar_size", "cacheSize": "cache_size",
                    "threads": "threads", "forcedRuns": "forced_runs", "overlapFill": "overlap_fill",
                    "toolCallParser": "tool_call_parser", "reasoningParser": "reasoning_parser"}


def structured_limits(so: dict[str, Any]) -> StructuredLimits:
    """ModelDeployConfig.structuredOutput (the schema checked its keys and ranges); absent keys keep the defaults."""
    return StructuredLimits(**{_STRUCTURED_KEYS[k]: v for k, v in so.items() if k in _STRUCTURED_KEYS})


def _kv_events(ev: dict[str, Any]) -> KVEventsConfig | None:
    """BackendConfig.kvEventsConfig (defaults filled from the schema); None when events are off."""
    if not ev.get("enableKvCacheEvents"):
        return None
    return KVEventsConfig(enable_kv_cache_events=True, publisher=ev["publisher"], endpoint=ev["endpoint"],
                          replay_endpoint=ev.get("replayEndpoint"), buffer_steps=int(ev["bufferSteps"]),
                          hwm=int(ev["hwm"]), max_queue_size=int(ev["maxQueueSize"]), topic=ev["topic"])


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _schedule(sch: dict[str, Any], base: Path) -> ScheduleSettings:
    return ScheduleSettings(
        cache_block_size=int(sch["cacheBlockSize"]), max_prefill_batch_size=int(sch["maxPrefillBatchSize"]),
        max_prefill_tokens=int(sch["maxPrefillTokens"]), prefill_time_ms_per_req=int(sch["prefillTimeMsPerReq"]),
        prefill_policy_type=int(sch["prefillPolicyType"]), decode_time_ms_per_req=int(sch["decodeTimeMsPerReq"]),
        decode_policy_type=int(sch["decodePolicyType"]), max_batch_size=int(sch["maxBatchSize"]),
        max_iter_times=int(sch["maxIterTimes"]), max_preempt_count=int(sch["maxPreemptCount"]),
        support_select_batch=sch["supportSelectBatch"],
        max_queue_delay_microseconds=int(sch["maxQueueDelayMicroseconds"]),
        num_kv_blocks=None if sch["numKvBlocks"] is None else int(sch["numKvBlocks"]),
        batch_prefill_tokens=_opt_int(sch["batchPrefillTokens"]),
        batch_tokens_beside_online=_opt_int(sch["batchTokensBesideOnline"]), decode_steps=int(sch["decodeSteps"]),
        enable_prefix_caching=sch["enablePrefixCaching"], max_sessions=int(sch["maxSessions"]),
        session_kv_share=float(sch["sessionKvShare"]), session_idle_seconds=float(sch["sessionIdleSeconds"]),
        max_session_tokens=int(sch["maxSessionTokens"]),
        session_spill_dir=None if sch.get("sessionSpillDir") is None else _resolve(base, sch["sessionSpillDir"]))


def _speculative(parsed: PluginParams | None, base: Path) -> SpeculativeConfig | None:
    """ModelConfig.plugin_params, parsed and checked by config.rules -> the engine's speculative decoding
    settings, the draft model's path resolved."""
    spec = None if parsed is None else parsed.spec
    if spec is not None and spec.model is not None:
        spec = dataclasses.replace(spec, model=_resolve(base, spec.model))
    return spec


def _pooling(p: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """ModelConfig.pooling -> EngineConfig.pooling's pairs (models/pooling_spec.read_pooling's keys)."""
    m = p.get("matryoshkaDimensions")
    pairs = {"method": p.get("type"), "normalize": p.get("normalize"),
             "matryoshka": tuple(m) if isinstance(m, list) else m}
    return tuple((k, v) for k, v in pairs.items() if v is not None)


def _build(cfg_path: Path, d: dict[str, Any], raw: dict[str, Any], plugins: dict[int, PluginParams]) -> ServiceConfig:
    base = cfg_path.parent
    be, log = d["BackendConfig"], d["LogConfig"]
    dep = be["ModelDeployConfig"]
    models = tuple(ModelSettings(
        instance_type=m["modelInstanceType"], name=m["modelName"], weight_path=_resolve(base, m["modelWeightPath"]),
        world_size=int(m["worldSize"]), cpu_mem_size_gb=int(m["cpuMemSize"]), npu_mem_size_gb=int(m["npuMemSize"]),
        backend_type=m["backendType"], trust_remote_code=m["trustRemoteCode"], quantization=m["quantization"],
        kv_cache_dtype=m["kvCacheDtype"], gguf_activations=m["ggufActivations"], dtype=m["dtype"],
        chat_template=m["chatTemplate"], generation_config=_generation_config(base, m["generationConfig"], i),
        speculative=_speculative(plugins.get(i), base), task=m["task"], pooling=_pooling(m["pooling"]))
        for i, m in enumerate(dep["ModelConfig"]))
    loras = tuple(LoraModuleSpec(name=lo["name"], path=_resolve(base, lo["path"]),
                                 base_model_name=lo.get("baseModelName") or models[0].name)
                  for lo in dep["LoraModules"])
    log_path = _resolve(base, log["logPath"]) if log.get("logPath") else None
    log_settings = LogSettings(level=log["logLevel"], path=log_path,
                               file_size_mb=int(log["logFileSize"]), file_num=int(log["logFileNum"]))
    return ServiceConfig(path=cfg_path, server=_server(d[S], base), backend=_backend(be, base), models=models,
                         schedule=_schedule(be["ScheduleConfig"], base), lora_modules=loras, log=log_settings, raw=raw)
