"""Cross-key checks of config.json, each run only when the keys it reads passed the schema.

The schedule and deploy rules the engine shares are written once, in
``engine.configs.engine_config.cross_field_problems``; here they are fed the file's values and worded with
MindIE key paths. The rest (addresses, model and adapter names, device groups, the KV pool
holding one maxSeqLen sequence) only make sense for a served config.

A value that must be parsed to be checked (``plugin_params``) is parsed once per load by
``parse_plugin_params``: the checks word its error, the loader keeps its value."""
from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mindie_service.config.messages import D, S, SC, label, show
from mindie_service.config.schema import load_schema
from mindie_service.catalog.residency_policy import check_budget
from mindie_service.engine.configs.engine_config import cross_field_problems
from mindie_service.engine.configs.spec_config import SpeculativeConfig
from mindie_service.errors import ValidationError

# EngineConfig field -> the config.json key it comes from.
ENGINE_KEYS: dict[str, str] = {
    "max_seq_len": f"{D}.maxSeqLen", "max_input_token_len": f"{D}.maxInputTokenLen",
    "video_frames": f"{D}.videoFrames", "max_video_frames": f"{D}.maxVideoFrames",
    "cache_block_size": f"{SC}.cacheBlockSize", "max_prefill_batch_size": f"{SC}.maxPrefillBatchSize",
    "max_prefill_tokens": f"{SC}.maxPrefillTokens", "max_batch_size": f"{SC}.maxBatchSize",
    "max_iter_times": f"{SC}.maxIterTimes", "max_preempt_count": f"{SC}.maxPreemptCount",
    "num_kv_blocks": f"{SC}.numKvBlocks", "batch_prefill_tokens": f"{SC}.batchPrefillTokens",
    "batch_tokens_beside_online": f"{SC}.batchTokensBesideOnline", "decode_steps": f"{SC}.decodeSteps",
}


def _section(data: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    d: Any = data
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d if isinstance(d, dict) else {}


def _engine_values(data: Mapping[str, Any], bad: set[str]) -> dict[str, Any]:
    """EngineConfig field -> the file's value; None where the key failed the schema."""
    sections = {D: _section(data, "BackendConfig", "ModelDeployConfig"),
                SC: _section(data, "BackendConfig", "ScheduleConfig")}
    out: dict[str, Any] = {}
    for name, path in ENGINE_KEYS.items():
        prefix, key = path.rsplit(".", 1)
        out[name] = None if path in bad else sections[prefix].get(key)
    return out


@dataclass(frozen=True)
class PluginParams:
    """One ModelConfig entry's plugin_params (with speculationGamma), parsed: the settings, or why not (the
    error names the key path)."""

    spec: SpeculativeConfig | None = None
    error: ValidationError | None = None


def parse_plugin_params(data: Mapping[str, Any], bad: set[str]) -> dict[int, PluginParams]:
    """ModelConfig index -> its parsed plugin_params; entries whose keys failed the schema are left out."""
    dep = _section(data, "BackendConfig", "ModelDeployConfig")
    models = dep.get("ModelConfig") if isinstance(dep.get("ModelConfig"), list) else []
    gamma = dep.get("speculationGamma") if f"{D}.speculationGamma" not in bad else None
    out: dict[int, PluginParams] = {}
    for i, m in enumerate(models):
        key = f"{D}.ModelConfig[{i}].plugin_params"
        if not isinstance(m, dict) or key in bad or not isinstance(m.get("plugin_params"), str):
            continue
        try:
            out[i] = PluginParams(spec=SpeculativeConfig.from_plugin_params(m["plugin_params"], gamma, key=key))
        except ValidationError as exc:
            out[i] = PluginParams(error=exc)
    return out


def cross_key_problems(data: dict[str, Any], bad: set[str], sources: Mapping[str, str],
                       plugins: Mapping[int, PluginParams]) -> list[str]:
    """Every cross-key problem; ``plugins`` is ``parse_plugin_params``'s result for the same ``data``."""
    values = _engine_values(data, bad)
    p = [f"{ENGINE_KEYS[fp.field]} must be {fp.rule(ENGINE_KEYS.__getitem__)}, got {show(fp.value)}"
         for fp in cross_field_problems(values)]
    # Config only: the engine clamps prompts to a small pool, a served config must honour maxSeqLen.
    kvb, cbs, seq = values["num_kv_blocks"], values["cache_block_size"], values["max_seq_len"]
    if None not in (kvb, cbs, seq) and kvb * cbs < seq:
        p.append(f"{SC}.numKvBlocks must hold one {D}.maxSeqLen sequence: >= ceil({seq} / {cbs}) "
                 f"= {math.ceil(seq / cbs)}, got {kvb}")
    p += _select_batch_problems(_section(data, "BackendConfig", "ScheduleConfig"), bad, sources)
    p += _address_problems(_section(data, S), bad, sources)
    p += _residency_problems(_section(data, S), bad)
    srv = _section(data, S)
    if srv.get("managementRoutesOnBusinessPort") is True and not srv.get("managementApiKeys") \
            and not srv.get("apiKeyFile"):
        p.append(f"{S}.managementRoutesOnBusinessPort needs an admin key: set {S}.managementApiKeys "
                 f"(or {S}.apiKeyFile)")
    p += _model_problems(_section(data, "BackendConfig"), _section(data, "BackendConfig", "ModelDeployConfig"), bad)
    p += _plugin_problems(plugins)
    return p


# Why MindIE's select-batch keys have no meaning here (they are refused rather than ignored).
_NO_SELECT_BATCH = ("this engine has no separate prefill and decode steps to choose between: every step decodes "
                    f"the running requests and prefills prompt chunks beside them within {SC}.maxPrefillTokens")


def _select_batch_problems(sch: dict[str, Any], bad: set[str], sources: Mapping[str, str]) -> list[str]:
    """supportSelectBatch true, or a prefillTimeMsPerReq / decodeTimeMsPerReq other than MindIE's default
    (they only tune supportSelectBatch), is refused: accepted, they would do nothing."""
    p: list[str] = []
    path = f"{SC}.supportSelectBatch"
    if sch.get("supportSelectBatch") is True and path not in bad:
        p.append(f"{label(path, sources)} must be false ({_NO_SELECT_BATCH}), got true")
    props = load_schema()["properties"]["BackendConfig"]["properties"]["ScheduleConfig"]["properties"]
    for key in ("prefillTimeMsPerReq", "decodeTimeMsPerReq"):
        path, default = f"{SC}.{key}", props[key]["default"]
        if key in sch and path not in bad and sch[key] != default:
            p.append(f"{label(path, sources)} must be {default}, MindIE's default (it only tunes supportSelectBatch, "
                     f"and {_NO_SELECT_BATCH}), got {show(sch[key])}")
    return p


def _residency_problems(srv: dict[str, Any], bad: set[str]) -> list[str]:
    """modelMemoryBudget's share is at most 100% (the schema's pattern checked its shape)."""
    budget = srv.get("modelMemoryBudget")
    if not isinstance(budget, str) or f"{S}.modelMemoryBudget" in bad:
        return []
    try:
        check_budget(budget)
    except ValueError as e:
        return [f"{S}.{e}"]
    return []


def _address_problems(srv: dict[str, Any], bad: set[str], sources: Mapping[str, str]) -> list[str]:
    p: list[str] = []
    ips: dict[str, ipaddress.IPv4Address | ipaddress.IPv6Address] = {}
    for key in ("ipAddress", "managementIpAddress"):
        path = f"{S}.{key}"
        if key in srv and path not in bad:
            ips[key] = ipaddress.ip_address(srv[key])
            if ips[key].is_unspecified and srv.get("allowAllZeroIpListening") is not True:
                p.append(f"{label(path, sources)} must not be 0.0.0.0 or :: unless {S}.allowAllZeroIpListening "
                         f"is true, got {show(srv[key])}")
    ports = {k: srv.get(k) for k in ("port", "managementPort", "metricsPort")}
    if srv.get("probePort") is not None and srv["probePort"] in ports.values():
        p.append(f"{S}.probePort must differ from {S}.port, managementPort and metricsPort (it serves plain HTTP), "
                 f"got {show(srv['probePort'])}")
    if "ipAddress" not in ips:
        return p
    mip = ips.get("managementIpAddress", ips["ipAddress"]) if f"{S}.managementIpAddress" not in bad else None
    planes = [(k, ip, srv.get(k)) for k, ip in (("port", ips["ipAddress"]), ("managementPort", mip),
                                                   ("metricsPort", mip)) if ip is not None and f"{S}.{k}" not in bad]
    for i, (k1, ip1, port1) in enumerate(planes):
        for k2, ip2, port2 in planes[i + 1:]:
            if port1 == port2 and ip1 != ip2 and (ip1.is_unspecified or ip2.is_unspecified):
                p.append(f"{S}.{k2} ({port2} on {ip2}) clashes with {S}.{k1} ({port1} on {ip1}): "
                         f"use another port or the same address")
    return p


def _model_problems(backend: dict[str, Any], dep: dict[str, Any], bad: set[str]) -> list[str]:
    p: list[str] = []
    models = dep.get("ModelConfig") if isinstance(dep.get("ModelConfig"), list) else []
    names: dict[str, int] = {}
    for i, m in enumerate(models):
        name = m.get("modelName") if isinstance(m, dict) else None
        if isinstance(name, str) and f"{D}.ModelConfig[{i}].modelName" not in bad:
            if name in names:
                p.append(f"{D}.ModelConfig[{i}].modelName must be unique, got {show(name)} "
                         f"(also ModelConfig[{names[name]}])")
            names.setdefault(name, i)
    groups, n_inst = backend.get("npuDeviceIds"), backend.get("modelInstanceNumber")
    if "BackendConfig.npuDeviceIds" not in bad and isinstance(groups, list):
        if "BackendConfig.modelInstanceNumber" not in bad and isinstance(n_inst, int) and len(groups) != n_inst:
            p.append(f"BackendConfig.npuDeviceIds must hold one device group per model instance "
                     f"(BackendConfig.modelInstanceNumber = {n_inst}), got {show(groups)}")
        for i, m in enumerate(models):
            ws = m.get("worldSize") if isinstance(m, dict) else None
            sizes = sorted({len(g) for g in groups if isinstance(g, list)})
            if isinstance(ws, int) and f"{D}.ModelConfig[{i}].worldSize" not in bad and sizes != [ws]:
                p.append(f"{D}.ModelConfig[{i}].worldSize must equal the size of each BackendConfig.npuDeviceIds "
                         f"group ({', '.join(map(str, sizes))}), got {ws}")
    if backend.get("multiNodesInferEnabled") is True and backend.get("interNodeTLSEnabled") is True:
        p.append("BackendConfig.interNodeTLSEnabled must be false when BackendConfig.multiNodesInferEnabled is true "
                 "(torch.distributed's transports carry no TLS: keep rank traffic on a private network), got true")
    p += _lora_problems(dep, names, bad)
    return p


def _plugin_problems(plugins: Mapping[int, PluginParams]) -> list[str]:
    """ModelConfig[i].plugin_params: a JSON-encoded speculative decoding plugin, with speculationGamma."""
    p: list[str] = []
    for i in sorted(plugins):
        if plugins[i].error is not None:
            msg = str(plugins[i].error).replace("Parameter speculationGamma", f"{D}.speculationGamma")
            p.append(msg.replace("Parameter ", "", 1) if msg.startswith("Parameter ") else msg)
    return p


def _lora_problems(dep: dict[str, Any], names: dict[str, int], bad: set[str]) -> list[str]:
    p: list[str] = []
    loras = dep.get("LoraModules") if isinstance(dep.get("LoraModules"), list) else []
    seen: dict[str, int] = {}
    for i, lo in enumerate(loras):
        if not isinstance(lo, dict) or f"{D}.LoraModules[{i}]" in bad:
            continue
        name, base = lo.get("name"), lo.get("baseModelName")
        if isinstance(name, str) and f"{D}.LoraModules[{i}].name" not in bad:
            if name in seen:
                p.append(f"{D}.LoraModules[{i}].name must be unique, got {show(name)} "
                         f"(also LoraModules[{seen[name]}])")
            elif name in names:
                p.append(f"{D}.LoraModules[{i}].name must differ from every modelName, got {show(name)}")
            seen.setdefault(name, i)
        if isinstance(base, str) and names and base not in names and f"{D}.LoraModules[{i}].baseModelName" not in bad:
            p.append(f"{D}.LoraModules[{i}].baseModelName must be one of the modelNames "
                     f"({', '.join(names)}), got {show(base)}")
    max_loras = dep.get("maxLoras")
    if isinstance(max_loras, int) and f"{D}.maxLoras" not in bad and len(loras) > max_loras:
        p.append(f"{D}.maxLoras must be >= the number of {D}.LoraModules ({len(loras)}), got {max_loras}")
    return p
