"""The files a loaded config names: checked apart from loading (after ``serve --prepare`` made them), by whoever
loads the config to serve it (``server.main.serve``). This module reads the settings' dataclasses; they never
import it (``.importlinter``: config-settings-no-files)."""
from __future__ import annotations

import json
import os
from collections.abc import Iterator

from mindie_service.config.messages import D, S
from mindie_service.config.settings import ServiceConfig, TlsSettings
from mindie_service.errors import ConfigError
from mindie_service.models.demo_marker import gguf_beside_demo


def check_files(cfg: ServiceConfig) -> None:
    """Raise ConfigError naming every missing file or folder, each with its config key: model checkpoints
    (config.json with torch_dtype/dtype and vocab_size), TLS files when HTTPS is on, LoRA folders, local
    media folders."""
    problems: list[str] = []
    for i, m in enumerate(cfg.models):
        if not m.mock:
            problems += _checkpoint_problems(f"{D}.ModelConfig[{i}].modelWeightPath", m.weight_path)
            problems += _world_size_problems(f"{D}.ModelConfig[{i}].worldSize", m.weight_path, m.world_size)
    for i, lo in enumerate(cfg.lora_modules):
        if not os.path.isdir(lo.path):
            problems.append(f"{D}.LoraModules[{i}].path: folder not found: {lo.path}")
    for i, p in enumerate(cfg.server.allowed_local_media_paths):
        if not os.path.isdir(p):
            problems.append(f"{S}.allowedLocalMediaPaths[{i}]: folder not found: {p}")
    if cfg.server.https_enabled:
        seen: set[str] = set()
        for prefix, tls in (("tls", cfg.server.tls), ("managementTls", cfg.server.management_tls),
                            ("metricsTls", cfg.server.metrics_tls)):
            for key, p in _tls_files(prefix, tls):
                if p not in seen and not os.path.isfile(p):
                    problems.append(f"{S}.{key}: file not found: {p}")
                seen.add(p)
    if problems:
        raise ConfigError([f"{cfg.path}: {p}" for p in problems])


def _tls_files(prefix: str, tls: TlsSettings) -> Iterator[tuple[str, str]]:
    yield from ((f"{prefix}CaFile", p) for p in tls.ca_files)
    yield f"{prefix}Cert", tls.cert
    yield f"{prefix}Pk", tls.pk
    if tls.pk_pwd:
        yield f"{prefix}PkPwd", tls.pk_pwd
    yield from ((f"{prefix}CrlFiles", p) for p in tls.crl_files)


def _checkpoint_problems(key: str, folder: str) -> list[str]:
    if _is_gguf(folder):  # a GGUF file is checked when it is read (models/gguf_checkpoint.py)
        return []
    cfg_file = os.path.join(folder, "config.json")
    if os.path.isfile(folder):
        return [f"{key}: {folder} is a file but not a .gguf file: name a checkpoint folder or a .gguf file"]
    if not os.path.isdir(folder):
        return [f"{key}: {'file' if folder.endswith('.gguf') else 'folder'} not found: {folder}"]
    try:
        with open(cfg_file, encoding="utf-8") as f:
            hf = json.load(f)
    except OSError:
        return [f"{key}: {cfg_file} not found (a checkpoint folder holds config.json, or a .gguf file)"]
    except ValueError as e:
        return [f"{key}: {cfg_file} is not valid JSON: {e}"]
    text = hf.get("text_config") if isinstance(hf.get("text_config"), dict) else {}
    missing = [k for k, alts in (("torch_dtype", ("torch_dtype", "dtype")), ("vocab_size", ("vocab_size",)))
               if not any(a in hf or a in text for a in alts)]
    return [f"{key}: {cfg_file} must hold {', '.join(missing)}"] if missing else []


def _is_gguf(path: str) -> bool:
    """A .gguf file, or a folder holding one and no config.json (or a demo build's: models.demo_marker)."""
    if os.path.isfile(path):
        return path.endswith(".gguf")
    return (os.path.isdir(path) and any(n.endswith(".gguf") for n in os.listdir(path))
            and (not os.path.isfile(os.path.join(path, "config.json")) or gguf_beside_demo(path)))


def _world_size_problems(key: str, folder: str, world_size: int) -> list[str]:
    """Tensor parallelism splits the attention heads evenly over the ranks (engine.runner.parallel)."""
    if world_size <= 1:
        return []
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            hf = json.load(f)
    except (OSError, ValueError):
        return []  # reported by _checkpoint_problems
    text = hf.get("text_config") if isinstance(hf.get("text_config"), dict) else hf
    heads = text.get("num_attention_heads")
    if isinstance(heads, int) and heads % world_size:
        return [f"{key} must divide the model's num_attention_heads ({heads}): each rank holds "
                f"heads / worldSize attention heads, got {world_size}"]
    return []
