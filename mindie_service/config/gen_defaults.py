"""The /api/* generation_config defaults, merged once at start-up from four layers (highest first):

1. environment variables ``MINDIE_GEN_<FIELD>`` (e.g. ``MINDIE_GEN_MAX_NEW_TOKENS=64``), the real
   environment over a ``.env`` file beside the config file (dotenv syntax: ``KEY=VALUE``, optional
   ``export``, quotes, ``#`` comments);
2. the config file's ``GenerationDefaults`` section (checked by the schema);
3. the model's ``model.json`` ``parameters`` (Jan's model file; ``max_tokens`` reads as max_new_tokens;
   keys that are not generation_config fields belong to the model catalog and are skipped);
4. Hugging Face's defaults (``generation_config.GenerationConfig``), applied by the protocol.

A bad value in any layer stops start-up with a ConfigError naming where it came from."""
from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mindie_service.errors import ConfigError, ValidationError
from mindie_service.generation_config import ENV_PREFIX, FIELDS, check_field, parse_text_value

logger = logging.getLogger(__name__)

DOTENV = ".env"
MODEL_JSON = "model.json"
_MODEL_ALIASES = {"max_tokens": "max_new_tokens"}


def parse_dotenv(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines; ``export`` prefixes, single/double quotes and ``#`` comments understood."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        key = key.strip().removeprefix("export ").strip()
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        out[key] = value
    return out


def _env_layer(env: Mapping[str, str], source: str, problems: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for var, text in env.items():
        if not var.startswith(ENV_PREFIX):
            continue
        name = var[len(ENV_PREFIX):].lower()
        if name not in FIELDS:
            problems.append(f"{source} {var} is not a generation_config field (known: "
                            f"{', '.join(ENV_PREFIX + f.upper() for f in FIELDS)})")
            continue
        try:
            out[name] = parse_text_value(name, text, var)
        except ValidationError as e:
            problems.append(f"{source} {e.message.removeprefix('Parameter ')}")
    return out


def _model_layer(model_dir: str, problems: list[str]) -> dict[str, Any]:
    path = Path(model_dir) / MODEL_JSON
    if not path.is_file():
        return {}
    try:
        params = json.loads(path.read_text(encoding="utf-8")).get("parameters") or {}
    except (OSError, ValueError, AttributeError) as e:
        problems.append(f"{path}: cannot read its parameters: {e}")
        return {}
    out: dict[str, Any] = {}
    for key, value in params.items() if isinstance(params, dict) else ():
        name = _MODEL_ALIASES.get(key, key)
        if name not in FIELDS or value is None:
            continue
        try:
            shown = f"{path} parameters.{key}"
            out[name] = parse_text_value(name, value, shown) if isinstance(value, str) else \
                check_field(name, value, shown)
        except ValidationError as e:
            problems.append(e.message.removeprefix("Parameter "))
    return out


def generation_defaults(cfg_path: Path, section: Mapping[str, Any], env: Mapping[str, str],
                        model_dir: str) -> dict[str, Any]:
    """The merged defaults (only the fields some layer sets); ConfigError listing every bad value."""
    problems: list[str] = []
    merged = _model_layer(model_dir, problems)
    merged.update({k: v for k, v in section.items() if k in FIELDS})
    dotenv = cfg_path.parent / DOTENV
    if dotenv.is_file():
        try:
            merged.update(_env_layer(parse_dotenv(dotenv.read_text(encoding="utf-8")), str(dotenv), problems))
        except (OSError, UnicodeDecodeError) as e:
            problems.append(f"{dotenv}: cannot read: {e}")
    merged.update(_env_layer(env, "environment variable", problems))
    if problems:
        raise ConfigError([f"{cfg_path}: {p}" for p in problems])
    if merged:
        logger.info("generation_config defaults for /api/*: %s", merged)
    return merged
