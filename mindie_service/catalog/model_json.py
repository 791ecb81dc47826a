"""A catalog model's ``model.json`` in Jan's ``Model`` shape (seeds/jan-models.yaml): read, checked,
written atomically; its ``parameters`` as request defaults, its prompt prefixes and its ``ctx_len``."""
from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mindie_service.errors import ValidationError
from mindie_service.inputs.chat import ChatPrefixes
from mindie_service.params.defaults import RequestDefaults

logger = logging.getLogger(__name__)

MODEL_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MODEL_JSON = "model.json"
MAX_MODEL_JSON_BYTES = 1 << 20
# The seed's Model.state enum; GetModelResponse.state adds the transient ones (our extension).
LIST_STATES = ("not_downloaded", "downloaded", "running", "stopped")
TRANSIENT_STATES = ("downloading", "starting", "stopping")
TASKS = ("", "auto", "generate", "embed", "score")  # model.json's task ("" and "auto": the config's)


def check_model_id(model_id: str) -> str:
    if not isinstance(model_id, str) or not MODEL_ID_RE.match(model_id) or model_id in (".", ".."):
        raise ValidationError(f"Parameter model id must match {MODEL_ID_RE.pattern}, got {model_id!r}")
    return model_id


@dataclass
class ModelRecord:
    """model.json's fields (the seed's Model, plus GetModelResponse's engine_parameters)."""

    id: str
    name: str = ""
    version: str = "1"
    owned_by: str = "mindie-service"
    created: int = field(default_factory=lambda: int(time.time()))
    description: str = ""
    format: str = ""  # "safetensors", "gguf" / "ggufv3" (catalog/checkpoint_kind.py); "": the folder's own kind
    source_url: str = ""  # never a server path: a local model reports "local:{id}"
    settings: dict[str, Any] = field(default_factory=dict)
    parameters: dict[str, str] = field(default_factory=dict)  # values are strings, as in the seed
    metadata: dict[str, Any] = field(default_factory=dict)
    assets: list[str] = field(default_factory=list)
    engine_parameters: dict[str, Any] = field(default_factory=dict)
    # What the model serves when started (EngineConfig.task): "" = ModelConfig's task (auto for a folder of
    # modelsDir), else "generate", "embed" (an embedding model) or "score" (a rerank model).
    task: str = ""

    @classmethod
    def from_json(cls, model_id: str, d: dict[str, Any]) -> "ModelRecord":
        def get(key: str, typ: type, default: Any) -> Any:
            v = d.get(key, default)
            if not isinstance(v, typ):
                raise ValidationError(f"model.json of {model_id}: {key} must be a {typ.__name__}, got {v!r}")
            return v
        params = get("parameters", dict, {})
        return cls(id=model_id, name=get("name", str, model_id), version=str(d.get("version", "1")),
                   owned_by=get("owned_by", str, "mindie-service"), created=int(get("created", int, int(time.time()))),
                   description=get("description", str, ""), format=get("format", str, ""),
                   source_url=get("source_url", str, ""), settings=get("settings", dict, {}),
                   parameters={str(k): str(v) for k, v in params.items()}, metadata=get("metadata", dict, {}),
                   assets=[str(a) for a in get("assets", list, [])],
                   engine_parameters=get("engine_parameters", dict, {}), task=_task(model_id, d.get("task", "")))

    def to_json(self) -> dict[str, Any]:
        return {"type": "model", "version": self.version, "id": self.id, "name": self.name or self.id,
                "owned_by": self.owned_by, "created": self.created, "description": self.description,
                "format": self.format, "source_url": self.source_url, "settings": self.settings,
                "parameters": self.parameters, "metadata": self.metadata, "assets": self.assets,
                "engine_parameters": self.engine_parameters, **({"task": self.task} if self.task else {})}

    # -- what the record means for serving ------------------------------------------------------
    def request_defaults(self) -> RequestDefaults:
        """``parameters`` as request defaults; Jan's top_p "1" and top_k "0" mean off."""
        p = self.parameters

        def num(key: str, conv: type) -> Any:
            if key not in p or p[key] == "":
                return None
            try:
                return conv(float(p[key])) if conv is int else conv(p[key])
            except ValueError:
                logger.warning("model %s: parameters.%s = %r is not a number; ignored", self.id, key, p[key])
                return None
        temperature, top_p, top_k, limit = num("temperature", float), num("top_p", float), num("top_k", int), \
            num("token_limit", int)
        return RequestDefaults.within_rules(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=limit)

    def prefixes(self) -> ChatPrefixes:
        e, d = self.engine_parameters, ChatPrefixes()
        pick = (lambda k, dv: e[k] if isinstance(e.get(k), str) else dv)  # noqa: E731
        return ChatPrefixes(pick("system_prompt", d.system), pick("user_prompt", d.user),
                            pick("ai_prompt", d.assistant))

    def ctx_len(self) -> int | None:
        for src in (self.engine_parameters, self.settings):
            v = src.get("ctx_len")
            if isinstance(v, str) and v.strip().isdigit():  # the seed's settings hold strings
                v = int(v)
            if isinstance(v, int) and not isinstance(v, bool) and v > 1:
                return v
        return None


def _task(model_id: str, v: Any) -> str:
    if v not in TASKS:
        raise ValidationError(f"model.json of {model_id}: task must be one of {list(TASKS)}, got {v!r}")
    return "" if v == "auto" else v


def read_model_json(folder: Path, model_id: str) -> ModelRecord | None:
    """The folder's model.json, or None without one; a broken one is logged and ignored."""
    p = folder / MODEL_JSON
    if not p.is_file() or p.is_symlink():
        return None
    try:
        if p.stat().st_size > MAX_MODEL_JSON_BYTES:
            raise ValidationError(f"model.json of {model_id} is over {MAX_MODEL_JSON_BYTES} bytes")
        d = json.loads(p.read_text(encoding="utf-8"))
        if not isinstance(d, dict):
            raise ValidationError(f"model.json of {model_id} must be an object")
        return ModelRecord.from_json(model_id, d)
    except (OSError, ValueError) as e:
        logger.warning("ignoring %s: %s", p, e)
        return None


def write_model_json(folder: Path, record: ModelRecord) -> None:
    """Atomically (a temporary file beside it, then rename)."""
    fd, tmp = tempfile.mkstemp(prefix=".model.json.", dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(record.to_json(), f, indent=2)
    os.replace(tmp, folder / MODEL_JSON)
