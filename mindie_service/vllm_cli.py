"""`mindie-service serve MODEL --flags`: vLLM's common `vllm serve` flags, each mapped onto config.json's keys
before the config is checked (config.loading.load_config's ``overrides``), so a flag's value meets the same rules
as the key it sets and a problem names the flag. The config file (``--config``) is the base; the flags win.

| flag | config key(s) |
| --- | --- |
| MODEL | ModelConfig[0].modelWeightPath (absolute), modelName: its folder's name (unless --served-model-name) |
| --host | ipAddress, managementIpAddress (vLLM serves everything on one address); 0.0.0.0 / :: allow all-zero |
| --port | port and metricsPort (vLLM's /metrics is on its serving port) |
| --api-key | businessApiKeys (one or more) |
| --served-model-name | ModelConfig[0].modelName (one name) |
| --max-model-len | maxSeqLen, maxInputTokenLen and maxIterTimes (vLLM caps the output only by the model length) |
| --max-num-seqs | maxBatchSize (maxPrefillBatchSize and maxPreemptCount kept within it) |
| --max-num-batched-tokens | maxPrefillTokens |
| --tensor-parallel-size | ModelConfig[0].worldSize, npuDeviceIds [[0..N-1]], modelInstanceNumber 1 |
| --dtype | ModelConfig[0].dtype (half = float16, float = float32) |
| --quantization | ModelConfig[0].quantization (w8a16, w8a8: ours; vLLM's checkpoint methods are refused) |
| --enable-prefix-caching / --no-enable-prefix-caching | enablePrefixCaching |
| --kv-cache-dtype | ModelConfig[0].kvCacheDtype (auto, int8) |
| --enable-lora, --lora-modules, --max-loras, --max-lora-rank | maxLoras (0 without --enable-lora, as vLLM), LoraModules, maxLoraRank |
| --speculative-config | ModelConfig[0].plugin_params (vLLM's JSON: ngram or a draft model) |
| --chat-template | ModelConfig[0].chatTemplate (a file's text, or the template given) |
| --generation-config | ModelConfig[0].generationConfig (vllm, auto: the model folder's generation_config.json, or a folder) |
| --otlp-traces-endpoint | otlpTracesEndpoint |
| --disable-log-requests / --enable-log-requests | the access log's per-request lines (off by default, as vLLM) |

Any other flag vLLM knows (vllm_flag_names.VLLM_FLAGS) is refused by name; so is a flag nobody knows."""
from __future__ import annotations

import argparse
import json
import os
from typing import Any, Callable

from mindie_service.vllm_flag_names import VLLM_FLAGS

S, B = "ServerConfig", "BackendConfig"
_DTYPES = {"auto": "auto", "half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32",
           "float32": "float32"}


def _length(text: str) -> int:
    """vLLM's human-readable lengths: 4096, 4k, 4K (x1024), 1m / 1M."""
    t = text.strip()
    mult = {"k": 1000, "K": 1024, "m": 1000 ** 2, "M": 1024 ** 2}.get(t[-1:], 1)
    try:
        return int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a length: {text!r} (e.g. 4096, 4k, 4K)") from None


def _lora(text: str) -> dict[str, str]:
    """vLLM's --lora-modules item: name=path, or JSON {"name", "path"[, "base_model_name"]}."""
    if text.lstrip().startswith("{"):
        d = json.loads(text)
        if not isinstance(d, dict) or not {"name", "path"} <= d.keys():
            raise argparse.ArgumentTypeError(f"--lora-modules JSON needs name and path: {text!r}")
        out = {"name": str(d["name"]), "path": os.path.abspath(str(d["path"]))}
        if d.get("base_model_name"):
            out["baseModelName"] = str(d["base_model_name"])
        return out
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--lora-modules takes name=path, got {text!r}")
    return {"name": name, "path": os.path.abspath(path)}


def _template(text: str) -> str:
    """vLLM's --chat-template: a file's text, or the template itself when it is one (holds Jinja markup)."""
    if os.path.isfile(text):
        with open(text, encoding="utf-8") as f:
            return f.read()
    if "{{" in text or "{%" in text:
        return text
    raise argparse.ArgumentTypeError(f"no such file, and not a Jinja template: {text!r}")


def _generation_config(text: str) -> str:
    """vLLM's --generation-config: vllm, auto, or a folder (made absolute: the config's folder is not the cwd)."""
    return text if text in ("vllm", "auto") else os.path.abspath(text)


def add_vllm_flags(s: argparse.ArgumentParser) -> None:
    """The vLLM flags `serve` takes (each one's key in the module's table)."""
    s.add_argument("model", nargs="?", default=None, help="vLLM's MODEL: the checkpoint folder to serve "
                   "(ModelConfig[0].modelWeightPath; its name too unless --served-model-name)")
    g = s.add_argument_group("vLLM's flags (each sets config keys; see docs/design.md)")
    g.add_argument("--host", help="listen address of every plane")
    g.add_argument("--port", type=int, help="business port; /metrics is served there too")
    g.add_argument("--api-key", nargs="+", help="business API key(s)")
    g.add_argument("--served-model-name", nargs="+", help="the model's name in requests (one)")
    g.add_argument("--max-model-len", type=_length, help="most tokens of a sequence (maxSeqLen)")
    g.add_argument("--max-num-seqs", type=int, help="requests per batch (maxBatchSize)")
    g.add_argument("--max-num-batched-tokens", type=int, help="tokens per step (maxPrefillTokens)")
    g.add_argument("--tensor-parallel-size", "-tp", type=int, help="devices per model instance (worldSize)")
    g.add_argument("--dtype", choices=sorted(_DTYPES), help="weights' dtype (ModelConfig.dtype)")
    g.add_argument("--quantization", "-q", help="w8a16 or w8a8: quantize the linears at load")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="share KV blocks of common prompt prefixes (enablePrefixCaching)")
    g.add_argument("--kv-cache-dtype", help="auto or int8 (kvCacheDtype)")
    g.add_argument("--enable-lora", action="store_true", default=None, help="serve LoRA adapters")
    g.add_argument("--lora-modules", nargs="+", type=_lora, help="name=path or JSON, loaded at start")
    g.add_argument("--max-loras", type=int, help="adapters loaded at once (maxLoras)")
    g.add_argument("--max-lora-rank", type=int, help="largest adapter rank (maxLoraRank)")
    g.add_argument("--speculative-config", type=json.loads, help="vLLM's speculative config (JSON)")
    g.add_argument("--chat-template", type=_template, help="a Jinja chat template file (or the template itself) "
                   "used instead of the checkpoint's (ModelConfig.chatTemplate)")
    g.add_argument("--generation-config", type=_generation_config, help="where the OpenAI routes' default sampling "
                   "parameters come from: vllm (vLLM's own), auto (the model folder's generation_config.json) or a "
                   "folder holding one (ModelConfig.generationConfig)")
    g.add_argument("--otlp-traces-endpoint", help="OTLP/HTTP traces endpoint (otlpTracesEndpoint)")
    g.add_argument("--disable-log-requests", dest="enable_log_requests", action="store_false", default=None,
                   help="no access-log line per request (vLLM's default)")
    g.add_argument("--enable-log-requests", dest="enable_log_requests", action="store_true",
                   help="an access-log line per request")


def refusal(extra: list[str]) -> str | None:
    """The message for the first flag ``serve`` did not take: a vLLM flag we do not take, or an unknown one."""
    for arg in extra:
        if not arg.startswith("--"):
            continue
        name = arg[2:].split("=", 1)[0]
        base = name.removeprefix("no-")
        if name in VLLM_FLAGS or base in VLLM_FLAGS:
            return (f"--{name} is a vLLM flag mindie-service does not take (set the matching key in config.json, "
                    "see `mindie-service serve --help` for the vLLM flags taken)")
        return f"unrecognized argument: --{name}"
    return f"unrecognized argument(s): {' '.join(extra)}" if extra else None


def arg_problem(a: argparse.Namespace) -> str | None:
    """What is wrong across the flags (before any config is read), or None."""
    if not a.enable_lora:
        for flag, value in (("--lora-modules", a.lora_modules), ("--max-loras", a.max_loras),
                            ("--max-lora-rank", a.max_lora_rank)):
            if value is not None:
                return f"{flag} needs --enable-lora (as in vLLM)"
    if a.served_model_name is not None and len(a.served_model_name) > 1:
        return f"--served-model-name takes one name here (vLLM's aliases are not served), got {a.served_model_name}"
    if a.speculative_config is not None:
        from mindie_service.errors import ValidationError

        try:
            plugin_params(a.speculative_config)
        except ValidationError as exc:
            return f"--speculative-config: {exc}"
    return None


def uses_vllm_flags(args: argparse.Namespace) -> bool:
    keys = ("model", "host", "port", "api_key", "served_model_name", "max_model_len", "max_num_seqs",
            "max_num_batched_tokens", "tensor_parallel_size", "dtype", "quantization", "enable_prefix_caching",
            "kv_cache_dtype", "enable_lora", "lora_modules", "max_loras", "max_lora_rank", "speculative_config",
            "otlp_traces_endpoint", "chat_template", "generation_config")
    return any(getattr(args, k, None) is not None for k in keys)


def config_overrides(args: argparse.Namespace) -> Callable[[dict[str, Any]], dict[str, str]]:
    """What the flags in ``args`` do to config.json's data (load_config's ``overrides``)."""
    def apply(data: dict[str, Any]) -> dict[str, str]:
        return _Apply(data).run(args)
    return apply


class _Apply:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.sources: dict[str, str] = {}

    def section(self, *path: str) -> dict[str, Any]:
        d = self.data
        for k in path:
            d = d.setdefault(k, {}) if isinstance(d, dict) else {}
        return d

    def model(self) -> dict[str, Any]:
        dep = self.section(B, "ModelDeployConfig")
        models = dep.setdefault("ModelConfig", [{}])
        if not models:
            models.append({})
        return models[0]

    def set(self, path: str, value: Any, flag: str) -> None:
        """``path``: dotted under the config root, ``ModelConfig[0].x`` for the first model's key."""
        parts = path.split(".")
        if parts[-2:-1] == ["ModelConfig[0]"]:
            target, key = self.model(), parts[-1]
        else:
            target, key = self.section(*parts[:-1]), parts[-1]
        target[key] = value
        self.sources[path] = flag

    def run(self, a: argparse.Namespace) -> dict[str, str]:
        D, C, M = f"{B}.ModelDeployConfig", f"{B}.ScheduleConfig", f"{B}.ModelDeployConfig.ModelConfig[0]"
        if a.model is not None:
            self.set(f"{M}.modelWeightPath", os.path.abspath(a.model), "the MODEL argument")
            if a.served_model_name is None:  # vLLM names it by the argument; a name here has no slashes
                self.set(f"{M}.modelName", os.path.basename(os.path.normpath(a.model)), "the MODEL argument")
        if a.served_model_name is not None:
            self.set(f"{M}.modelName", a.served_model_name[0], "--served-model-name")
        if a.host is not None:
            self.set(f"{S}.ipAddress", a.host, "--host")
            self.set(f"{S}.managementIpAddress", a.host, "--host")
            if a.host in ("0.0.0.0", "::"):
                self.set(f"{S}.allowAllZeroIpListening", True, "--host")
        if a.port is not None:
            self.set(f"{S}.port", a.port, "--port")
            self.set(f"{S}.metricsPort", a.port, "--port")
        if a.api_key is not None:
            self.set(f"{S}.businessApiKeys", list(a.api_key), "--api-key")
        if a.otlp_traces_endpoint is not None:
            self.set(f"{S}.otlpTracesEndpoint", a.otlp_traces_endpoint, "--otlp-traces-endpoint")
        self._limits(a, D, C)
        self._model_keys(a, M)
        self._lora(a, D)
        return self.sources

    def _limits(self, a: argparse.Namespace, D: str, C: str) -> None:
        if a.max_model_len is not None:
            for key in (f"{D}.maxSeqLen", f"{D}.maxInputTokenLen", f"{C}.maxIterTimes"):
                self.set(key, a.max_model_len, "--max-model-len")
        if a.max_num_seqs is not None:
            self.set(f"{C}.maxBatchSize", a.max_num_seqs, "--max-num-seqs")
            sched = self.section(B, "ScheduleConfig")
            for key, default in (("maxPrefillBatchSize", 50), ("maxPreemptCount", 0)):
                current = sched.get(key, default)
                if isinstance(current, int) and current > a.max_num_seqs:
                    self.set(f"{C}.{key}", a.max_num_seqs, "--max-num-seqs")
        if a.max_num_batched_tokens is not None:
            self.set(f"{C}.maxPrefillTokens", a.max_num_batched_tokens, "--max-num-batched-tokens")
        if a.enable_prefix_caching is not None:
            self.set(f"{C}.enablePrefixCaching", a.enable_prefix_caching, "--enable-prefix-caching")
        if a.tensor_parallel_size is not None:
            n = a.tensor_parallel_size
            self.set(f"{B}.npuDeviceIds", [list(range(max(n, 1)))], "--tensor-parallel-size")
            self.set(f"{B}.modelInstanceNumber", 1, "--tensor-parallel-size")

    def _model_keys(self, a: argparse.Namespace, M: str) -> None:
        if a.tensor_parallel_size is not None:
            self.set(f"{M}.worldSize", a.tensor_parallel_size, "--tensor-parallel-size")
        if a.dtype is not None:
            self.set(f"{M}.dtype", _DTYPES[a.dtype], "--dtype")
        if a.quantization is not None:  # the schema's enum words the refusal of vLLM's checkpoint methods
            self.set(f"{M}.quantization", a.quantization, "--quantization")
        if a.kv_cache_dtype is not None:
            self.set(f"{M}.kvCacheDtype", a.kv_cache_dtype, "--kv-cache-dtype")
        if a.chat_template is not None:
            self.set(f"{M}.chatTemplate", a.chat_template, "--chat-template")
        if a.generation_config is not None:
            self.set(f"{M}.generationConfig", a.generation_config, "--generation-config")
        if a.speculative_config is not None:
            self.set(f"{M}.plugin_params", json.dumps(plugin_params(a.speculative_config)), "--speculative-config")

    def _lora(self, a: argparse.Namespace, D: str) -> None:
        if a.model is None and a.enable_lora is None:
            return  # a plain `serve --config`: the config's LoRA keys as they are
        if not a.enable_lora:
            self.set(f"{D}.maxLoras", 0, "--enable-lora")  # vLLM serves no adapters without it
            self.set(f"{D}.LoraModules", [], "--enable-lora")
            return
        if a.max_loras is not None:
            self.set(f"{D}.maxLoras", a.max_loras, "--max-loras")
        if a.max_lora_rank is not None:
            self.set(f"{D}.maxLoraRank", a.max_lora_rank, "--max-lora-rank")
        if a.lora_modules is not None:
            self.set(f"{D}.LoraModules", list(a.lora_modules), "--lora-modules")


def plugin_params(spec: Any) -> dict[str, Any]:
    """vLLM's --speculative-config as MindIE's plugin_params (checked first by SpeculativeConfig.from_vllm, so a
    bad key or value is refused in vLLM's words)."""
    from mindie_service.engine.configs.spec_config import DRAFT_MODEL, SpeculativeConfig

    cfg = SpeculativeConfig.from_vllm(spec)
    out: dict[str, Any] = {"plugin_type": DRAFT_MODEL if cfg.method == DRAFT_MODEL else "memory_decoding",
                           "decoding_length": cfg.num_speculative_tokens, "dynamic_algo": cfg.dynamic,
                           "memory": cfg.memory}
    if cfg.method == DRAFT_MODEL:
        out["draft_model_path"] = os.path.abspath(str(cfg.model))
    else:
        out |= {"prompt_lookup_max": cfg.prompt_lookup_max, "prompt_lookup_min": cfg.prompt_lookup_min}
    return out
