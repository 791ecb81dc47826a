"""Load and validate conf/config.json (MindIE's layout) into frozen dataclasses.

Every default lives in one place: the ``default`` fields of ``conf/config.schema.json``; this
module fills absent keys from there. The work, in order: read the JSON -> apply the env
overrides -> JSON Schema (every error collected) -> fill defaults -> cross-key checks (every
problem collected) -> dataclasses. One ``ConfigError`` carries one message per problem, each
naming the key path (``BackendConfig.ScheduleConfig.maxBatchSize``), the rule and the value.
Relative paths resolve against the config file's folder. Files the config names are checked
separately by ``ServiceConfig.check_files()`` (after ``serve --prepare`` has made them).
"""
from __future__ import annotations

import copy
import difflib
import ipaddress
import json
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema

from mindie_service.engine.config import EngineConfig, LoraModuleSpec
from mindie_service.errors import ConfigError

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "conf" / "config.schema.json"
ENV_IP = "MIES_CONTAINER_IP"
ENV_MANAGEMENT_IP = "MIES_CONTAINER_MANAGEMENT_IP"
STANDARD_MOCK = "StandardMock"
_S = "ServerConfig"
_D = "BackendConfig.ModelDeployConfig"
_SC = "BackendConfig.ScheduleConfig"


# ---------------------------------------------------------------------------------------------
# The result
# ---------------------------------------------------------------------------------------------
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
    # Business plane TLS (the management and metrics planes inherit what they do not set).
    tls_ca_path: str
    tls_ca_files: tuple[str, ...]
    tls_cert: str
    tls_pk: str
    tls_pk_pwd: str | None
    tls_crl_path: str | None
    tls_crl_files: tuple[str, ...]
    management_tls: TlsSettings
    metrics_tls: TlsSettings
    full_text_enabled: bool
    token_timeout: float  # seconds
    e2e_timeout: float  # seconds
    max_request_length: int  # MB
    stream_token_id_format: str  # "list" | "int"
    allowed_local_media_paths: tuple[str, ...]
    allow_private_media_urls: bool
    media_url_allowed_hosts: tuple[str, ...]  # lower-case; empty = any host
    max_media_items: int

    @property
    def tls(self) -> TlsSettings:
        return TlsSettings(self.tls_ca_path, self.tls_ca_files, self.tls_cert, self.tls_pk, self.tls_pk_pwd,
                           self.tls_crl_path, self.tls_crl_files)

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

    @property
    def effective_max_input_len(self) -> int:
        return min(self.max_input_token_len, self.max_seq_len - 1)


@dataclass(frozen=True)
class ScheduleSettings:
    cache_block_size: int
    max_prefill_batch_size: int
    max_prefill_tokens: int
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
    enable_prefix_caching: bool


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

    def model(self, name: str) -> ModelSettings:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)

    def engine_config(self, model_index: int = 0) -> EngineConfig:
        m, b, s = self.models[model_index], self.backend, self.schedule
        return EngineConfig(
            model=m.weight_path, model_name=m.name, trust_remote_code=m.trust_remote_code,
            max_seq_len=b.max_seq_len, max_input_token_len=b.max_input_token_len, truncation=b.truncation,
            cache_block_size=s.cache_block_size, max_prefill_batch_size=s.max_prefill_batch_size,
            max_prefill_tokens=s.max_prefill_tokens, max_batch_size=s.max_batch_size,
            max_iter_times=s.max_iter_times, max_preempt_count=s.max_preempt_count,
            max_queue_delay_microseconds=s.max_queue_delay_microseconds, num_kv_blocks=s.num_kv_blocks,
            kv_cache_memory_gb=float(m.npu_mem_size_gb), enable_prefix_caching=s.enable_prefix_caching,
            max_loras=b.max_loras, max_lora_rank=b.max_lora_rank,
            lora_modules=tuple(lo for lo in self.lora_modules if lo.base_model_name == m.name),
            video_frames=b.video_frames, max_video_frames=b.max_video_frames, num_threads=b.num_threads)

    def check_files(self) -> None:
        """Raise ConfigError naming every missing file the config points at: model checkpoints
        (config.json with torch_dtype/dtype and vocab_size), TLS files when HTTPS is on, LoRA
        folders, local media folders."""
        problems: list[str] = []
        for i, m in enumerate(self.models):
            if not m.mock:
                problems += _checkpoint_problems(f"{_D}.ModelConfig[{i}].modelWeightPath", m.weight_path)
        for i, lo in enumerate(self.lora_modules):
            if not os.path.isdir(lo.path):
                problems.append(f"{_D}.LoraModules[{i}].path: folder not found: {lo.path}")
        for i, p in enumerate(self.server.allowed_local_media_paths):
            if not os.path.isdir(p):
                problems.append(f"{_S}.allowedLocalMediaPaths[{i}]: folder not found: {p}")
        if self.server.https_enabled:
            seen: set[str] = set()
            for prefix, tls in (("tls", self.server.tls), ("managementTls", self.server.management_tls),
                                ("metricsTls", self.server.metrics_tls)):
                for key, p in _tls_files(prefix, tls):
                    if p not in seen and not os.path.isfile(p):
                        problems.append(f"{_S}.{key}: file not found: {p}")
                    seen.add(p)
        if problems:
            raise ConfigError([f"{self.path}: {p}" for p in problems])


def _tls_files(prefix: str, tls: TlsSettings) -> Iterator[tuple[str, str]]:
    yield from ((f"{prefix}CaFile", p) for p in tls.ca_files)
    yield f"{prefix}Cert", tls.cert
    yield f"{prefix}Pk", tls.pk
    if tls.pk_pwd:
        yield f"{prefix}PkPwd", tls.pk_pwd
    yield from ((f"{prefix}CrlFiles", p) for p in tls.crl_files)


def _checkpoint_problems(key: str, folder: str) -> list[str]:
    cfg_file = os.path.join(folder, "config.json")
    if not os.path.isdir(folder):
        return [f"{key}: folder not found: {folder}"]
    try:
        with open(cfg_file, encoding="utf-8") as f:
            hf = json.load(f)
    except OSError:
        return [f"{key}: {cfg_file} not found"]
    except ValueError as e:
        return [f"{key}: {cfg_file} is not valid JSON: {e}"]
    text = hf.get("text_config") if isinstance(hf.get("text_config"), dict) else {}
    missing = [k for k, alts in (("torch_dtype", ("torch_dtype", "dtype")), ("vocab_size", ("vocab_size",)))
               if not any(a in hf or a in text for a in alts)]
    return [f"{key}: {cfg_file} must hold {', '.join(missing)}"] if missing else []


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def load_schema() -> dict[str, Any]:
    """conf/config.schema.json: the shape, the rules and every default."""
    with open(SCHEMA_PATH, encoding="utf-8") as f:
        return json.load(f)


@lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft202012Validator:
    cls = jsonschema.Draft202012Validator
    return cls(load_schema(), format_checker=cls.FORMAT_CHECKER)


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> ServiceConfig:
    """Read, validate and resolve a config.json. ``env`` defaults to ``os.environ`` (read now)."""
    cfg_path = Path(os.path.abspath(Path(path).expanduser()))
    env = os.environ if env is None else env
    raw = _read_json(cfg_path)
    data = copy.deepcopy(raw)
    sources = _apply_env(data, env)
    problems, bad = _schema_problems(data, sources)
    if isinstance(data, dict):
        _fill_defaults(load_schema(), data)
        problems += _cross_key_problems(data, bad, sources)
    if problems:
        raise ConfigError([f"{path}: {p}" for p in problems])
    return _build(cfg_path, data, raw)


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
        if value and isinstance(data.setdefault(_S, {}), dict):
            data[_S][key] = value
            sources[f"{_S}.{key}"] = var
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


# ---------------------------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------------------------
_TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "a boolean",
               "array": "a list", "object": "an object", "null": "null"}
_FORMAT_WORDS = {"ipv4": "an IPv4 address", "ipv6": "an IPv6 address"}


def _key_path(parts: Any) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _join(path: str, key: str) -> str:
    return key if path == "(top level)" else f"{path}.{key}"


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _range(s: Mapping[str, Any]) -> str:
    lo_incl, hi_incl = "minimum" in s, "maximum" in s
    lo = s.get("minimum", s.get("exclusiveMinimum"))
    hi = s.get("maximum", s.get("exclusiveMaximum"))
    if lo is not None and hi is not None:
        return f"in {'[' if lo_incl else '('}{lo}, {hi}{']' if hi_incl else ')'}"
    if lo is not None:
        return f"{'>=' if lo_incl else '>'} {lo}"
    if hi is not None:
        return f"{'<=' if hi_incl else '<'} {hi}"
    return ""


def _describe(s: Mapping[str, Any]) -> str:
    """A schema as the phrase after 'must be'."""
    if "const" in s:
        return _show(s["const"])
    if "enum" in s:
        return _show(s["enum"][0]) if len(s["enum"]) == 1 else "one of " + ", ".join(_show(v) for v in s["enum"])
    if "format" in s:
        return _FORMAT_WORDS.get(s["format"], f"a {s['format']}")
    types = [s["type"]] if isinstance(s.get("type"), str) else list(s.get("type", []))
    words = [_TYPE_WORDS[t] for t in types if t != "null"] + (["null"] if "null" in types else [])
    text = " or ".join(words)
    if "items" in s and types == ["array"]:
        text = f"a list, each item {_describe(s['items'])}"
    if types == ["string"] and s.get("minLength") == 1 and "pattern" not in s:
        text = "a non-empty string"
    details = [d for d in (_range(s),) if d]
    if "pattern" in s:
        details.append(f"matching {s['pattern']}")
    if "maxLength" in s:
        details.append(f"of at most {s['maxLength']} characters")
    if "anyOf" in s:
        alts = " or ".join(_describe(b) or "valid" for b in s["anyOf"])
        if all("format" in b for b in s["anyOf"]):
            return alts
        details.append(f"({alts})")
    return " ".join([text or "a value", *details]).strip()


def _explain(err: jsonschema.ValidationError, sources: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    """(key path, message) for one schema error."""
    path = _key_path(err.absolute_path)
    label = f"{path} (set by env {sources[path]})" if path in sources else path
    v = err.validator
    if v == "additionalProperties":
        known = list(err.schema.get("properties", {}))
        for key in sorted(k for k in err.instance if k not in known):
            hint = difflib.get_close_matches(key, known, n=1)
            yield _join(path, key), (f"{_join(path, key)} is not a known key"
                                     + (f" (did you mean {hint[0]!r}?)" if hint else ""))
    elif v == "required":
        for key in err.validator_value:
            if key not in err.instance:
                yield _join(path, key), f"{_join(path, key)} is required"
    elif v == "minItems":
        yield path, f"{label} must have at least {err.validator_value} item(s), got {_show(err.instance)}"
    elif v == "maxItems":
        yield path, f"{label} must have at most {err.validator_value} items, got {len(err.instance)}"
    elif v == "uniqueItems":
        yield path, f"{label} must not repeat an item, got {_show(err.instance)}"
    else:
        yield path, f"{label} must be {_describe(err.schema)}, got {_show(err.instance)}"


def _schema_problems(data: Any, sources: Mapping[str, str]) -> tuple[list[str], set[str]]:
    problems: list[str] = []
    bad: set[str] = set()
    errors = sorted(_validator().iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])
    for err in errors:
        for key_path, message in _explain(err, sources):
            bad.add(key_path)
            if message not in problems:
                problems.append(message)
    return problems, bad


# ---------------------------------------------------------------------------------------------
# Cross-key checks (each runs only when the keys it reads passed the schema)
# ---------------------------------------------------------------------------------------------
def _section(data: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    d: Any = data
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d if isinstance(d, dict) else {}


def _cross_key_problems(data: dict[str, Any], bad: set[str], sources: Mapping[str, str]) -> list[str]:
    srv = _section(data, _S)
    dep = _section(data, "BackendConfig", "ModelDeployConfig")
    sch = _section(data, "BackendConfig", "ScheduleConfig")
    backend = _section(data, "BackendConfig")

    def get(section: dict[str, Any], prefix: str, key: str) -> Any:
        return None if f"{prefix}.{key}" in bad else section.get(key)

    p: list[str] = []
    seq, inp = get(dep, _D, "maxSeqLen"), get(dep, _D, "maxInputTokenLen")
    mbs, mpbs = get(sch, _SC, "maxBatchSize"), get(sch, _SC, "maxPrefillBatchSize")
    mpt, mit = get(sch, _SC, "maxPrefillTokens"), get(sch, _SC, "maxIterTimes")
    mpc, kvb, cbs = get(sch, _SC, "maxPreemptCount"), get(sch, _SC, "numKvBlocks"), get(sch, _SC, "cacheBlockSize")
    if None not in (mpt, seq, inp) and mpt < min(inp, seq - 1):
        p.append(f"{_SC}.maxPrefillTokens must be >= min({_D}.maxInputTokenLen, {_D}.maxSeqLen - 1) "
                 f"= {min(inp, seq - 1)}, got {mpt}")
    if None not in (mpbs, mbs) and mpbs > mbs:
        p.append(f"{_SC}.maxPrefillBatchSize must be <= {_SC}.maxBatchSize ({mbs}), got {mpbs}")
    if None not in (mit, seq) and mit > seq:
        p.append(f"{_SC}.maxIterTimes must be <= {_D}.maxSeqLen ({seq}), got {mit}")
    if None not in (mpc, mbs) and mpc > mbs:
        p.append(f"{_SC}.maxPreemptCount must be <= {_SC}.maxBatchSize ({mbs}), got {mpc}")
    if None not in (kvb, cbs, seq) and kvb * cbs < seq:
        p.append(f"{_SC}.numKvBlocks must hold one {_D}.maxSeqLen sequence: >= ceil({seq} / {cbs}) "
                 f"= {math.ceil(seq / cbs)}, got {kvb}")
    vf, mvf = get(dep, _D, "videoFrames"), get(dep, _D, "maxVideoFrames")
    if None not in (vf, mvf) and vf > mvf:
        p.append(f"{_D}.videoFrames must be <= {_D}.maxVideoFrames ({mvf}), got {vf}")
    p += _address_problems(srv, bad, sources)
    p += _model_problems(backend, dep, bad)
    return p


def _address_problems(srv: dict[str, Any], bad: set[str], sources: Mapping[str, str]) -> list[str]:
    p: list[str] = []
    ips: dict[str, ipaddress.IPv4Address | ipaddress.IPv6Address] = {}
    for key in ("ipAddress", "managementIpAddress"):
        path = f"{_S}.{key}"
        if key in srv and path not in bad:
            ips[key] = ipaddress.ip_address(srv[key])
            if ips[key].is_unspecified and srv.get("allowAllZeroIpListening") is not True:
                label = f"{path} (set by env {sources[path]})" if path in sources else path
                p.append(f"{label} must not be 0.0.0.0 or :: unless {_S}.allowAllZeroIpListening is true, "
                         f"got {_show(srv[key])}")
    if "ipAddress" not in ips:
        return p
    mip = ips.get("managementIpAddress", ips["ipAddress"]) if f"{_S}.managementIpAddress" not in bad else None
    planes = [(k, ip, srv.get(k)) for k, ip in (("port", ips["ipAddress"]), ("managementPort", mip),
                                                   ("metricsPort", mip)) if ip is not None and f"{_S}.{k}" not in bad]
    for i, (k1, ip1, port1) in enumerate(planes):
        for k2, ip2, port2 in planes[i + 1:]:
            if port1 == port2 and ip1 != ip2 and (ip1.is_unspecified or ip2.is_unspecified):
                p.append(f"{_S}.{k2} ({port2} on {ip2}) clashes with {_S}.{k1} ({port1} on {ip1}): "
                         f"use another port or the same address")
    return p


def _model_problems(backend: dict[str, Any], dep: dict[str, Any], bad: set[str]) -> list[str]:
    p: list[str] = []
    models = dep.get("ModelConfig") if isinstance(dep.get("ModelConfig"), list) else []
    names: dict[str, int] = {}
    for i, m in enumerate(models):
        name = m.get("modelName") if isinstance(m, dict) else None
        if isinstance(name, str) and f"{_D}.ModelConfig[{i}].modelName" not in bad:
            if name in names:
                p.append(f"{_D}.ModelConfig[{i}].modelName must be unique, got {_show(name)} "
                         f"(also ModelConfig[{names[name]}])")
            names.setdefault(name, i)
    groups, n_inst = backend.get("npuDeviceIds"), backend.get("modelInstanceNumber")
    if "BackendConfig.npuDeviceIds" not in bad and isinstance(groups, list):
        if "BackendConfig.modelInstanceNumber" not in bad and isinstance(n_inst, int) and len(groups) != n_inst:
            p.append(f"BackendConfig.npuDeviceIds must hold one device group per model instance "
                     f"(BackendConfig.modelInstanceNumber = {n_inst}), got {_show(groups)}")
        for i, m in enumerate(models):
            ws = m.get("worldSize") if isinstance(m, dict) else None
            sizes = sorted({len(g) for g in groups if isinstance(g, list)})
            if isinstance(ws, int) and f"{_D}.ModelConfig[{i}].worldSize" not in bad and sizes != [ws]:
                p.append(f"{_D}.ModelConfig[{i}].worldSize must equal the size of each BackendConfig.npuDeviceIds "
                         f"group ({', '.join(map(str, sizes))}), got {ws}")
    loras = dep.get("LoraModules") if isinstance(dep.get("LoraModules"), list) else []
    seen: dict[str, int] = {}
    for i, lo in enumerate(loras):
        if not isinstance(lo, dict) or f"{_D}.LoraModules[{i}]" in bad:
            continue
        name, base = lo.get("name"), lo.get("baseModelName")
        if isinstance(name, str) and f"{_D}.LoraModules[{i}].name" not in bad:
            if name in seen:
                p.append(f"{_D}.LoraModules[{i}].name must be unique, got {_show(name)} "
                         f"(also LoraModules[{seen[name]}])")
            elif name in names:
                p.append(f"{_D}.LoraModules[{i}].name must differ from every modelName, got {_show(name)}")
            seen.setdefault(name, i)
        if isinstance(base, str) and names and base not in names and f"{_D}.LoraModules[{i}].baseModelName" not in bad:
            p.append(f"{_D}.LoraModules[{i}].baseModelName must be one of the modelNames "
                     f"({', '.join(names)}), got {_show(base)}")
    max_loras = dep.get("maxLoras")
    if isinstance(max_loras, int) and f"{_D}.maxLoras" not in bad and len(loras) > max_loras:
        p.append(f"{_D}.maxLoras must be >= the number of {_D}.LoraModules ({len(loras)}), got {max_loras}")
    return p


# ---------------------------------------------------------------------------------------------
# Building the dataclasses (data is valid and complete here)
# ---------------------------------------------------------------------------------------------
def _resolve(base: str | Path, p: str) -> str:
    q = Path(p).expanduser()
    return os.path.normpath(q if q.is_absolute() else Path(base) / q)


def _tls(srv: dict[str, Any], base: Path, prefix: str) -> TlsSettings:
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


def _build(cfg_path: Path, d: dict[str, Any], raw: dict[str, Any]) -> ServiceConfig:
    base = cfg_path.parent
    srv, be = d[_S], d["BackendConfig"]
    dep, sch, log = be["ModelDeployConfig"], be["ScheduleConfig"], d["LogConfig"]
    tls = _tls(srv, base, "")
    server = ServerSettings(
        ip_address=srv["ipAddress"], port=int(srv["port"]),
        management_ip_address=srv.get("managementIpAddress", srv["ipAddress"]),
        management_port=int(srv["managementPort"]), metrics_port=int(srv["metricsPort"]),
        allow_all_zero_ip=srv["allowAllZeroIpListening"], max_link_num=int(srv["maxLinkNum"]),
        https_enabled=srv["httpsEnabled"], tls_ca_path=tls.ca_path, tls_ca_files=tls.ca_files,
        tls_cert=tls.cert, tls_pk=tls.pk, tls_pk_pwd=tls.pk_pwd, tls_crl_path=tls.crl_path,
        tls_crl_files=tls.crl_files, management_tls=_tls(srv, base, "management"),
        metrics_tls=_tls(srv, base, "metrics"), full_text_enabled=srv["fullTextEnabled"],
        token_timeout=float(srv["tokenTimeout"]), e2e_timeout=float(srv["e2eTimeout"]),
        max_request_length=int(srv["maxRequestLength"]), stream_token_id_format=srv["streamTokenIdFormat"],
        allowed_local_media_paths=tuple(_resolve(base, p) for p in srv["allowedLocalMediaPaths"]),
        allow_private_media_urls=srv["allowPrivateMediaUrls"],
        media_url_allowed_hosts=tuple(h.lower() for h in srv["mediaUrlAllowedHosts"]),
        max_media_items=int(srv["maxMediaItems"]))
    models = tuple(ModelSettings(
        instance_type=m["modelInstanceType"], name=m["modelName"], weight_path=_resolve(base, m["modelWeightPath"]),
        world_size=int(m["worldSize"]), cpu_mem_size_gb=int(m["cpuMemSize"]), npu_mem_size_gb=int(m["npuMemSize"]),
        backend_type=m["backendType"], trust_remote_code=m["trustRemoteCode"]) for m in dep["ModelConfig"])
    backend = BackendSettings(
        backend_name=be["backendName"], model_instance_number=int(be["modelInstanceNumber"]),
        npu_device_ids=tuple(tuple(int(i) for i in g) for g in be["npuDeviceIds"]),
        tokenizer_process_number=int(be["tokenizerProcessNumber"]), max_seq_len=int(dep["maxSeqLen"]),
        max_input_token_len=int(dep["maxInputTokenLen"]), truncation=dep["truncation"],
        max_loras=int(dep["maxLoras"]), max_lora_rank=int(dep["maxLoraRank"]), video_frames=int(dep["videoFrames"]),
        max_video_frames=int(dep["maxVideoFrames"]),
        num_threads=None if dep["numThreads"] is None else int(dep["numThreads"]))
    schedule = ScheduleSettings(
        cache_block_size=int(sch["cacheBlockSize"]), max_prefill_batch_size=int(sch["maxPrefillBatchSize"]),
        max_prefill_tokens=int(sch["maxPrefillTokens"]), prefill_time_ms_per_req=int(sch["prefillTimeMsPerReq"]),
        prefill_policy_type=int(sch["prefillPolicyType"]), decode_time_ms_per_req=int(sch["decodeTimeMsPerReq"]),
        decode_policy_type=int(sch["decodePolicyType"]), max_batch_size=int(sch["maxBatchSize"]),
        max_iter_times=int(sch["maxIterTimes"]), max_preempt_count=int(sch["maxPreemptCount"]),
        support_select_batch=sch["supportSelectBatch"],
        max_queue_delay_microseconds=int(sch["maxQueueDelayMicroseconds"]),
        num_kv_blocks=None if sch["numKvBlocks"] is None else int(sch["numKvBlocks"]),
        enable_prefix_caching=sch["enablePrefixCaching"])
    loras = tuple(LoraModuleSpec(name=lo["name"], path=_resolve(base, lo["path"]),
                                 base_model_name=lo.get("baseModelName") or models[0].name)
                  for lo in dep["LoraModules"])
    log_path = _resolve(base, log["logPath"]) if log.get("logPath") else None
    log_settings = LogSettings(level=log["logLevel"], path=log_path,
                               file_size_mb=int(log["logFileSize"]), file_num=int(log["logFileNum"]))
    return ServiceConfig(path=cfg_path, server=server, backend=backend, models=models, schedule=schedule,
                         lora_modules=loras, log=log_settings, raw=raw)
