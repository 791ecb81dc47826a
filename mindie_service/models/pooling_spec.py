"""What a checkpoint serves (generation, embeddings, scores) and how its embeddings are pooled.

Pooling follows the checkpoint, as vLLM's pooling models do: a sentence-transformers folder's ``modules.json``
(Transformer -> Pooling -> optional Normalize) and ``1_Pooling/config.json`` (``pooling_mode`` "mean" / "cls" /
"lasttoken", or the older ``pooling_mode_*_tokens`` flags) where present, else the last token, not normalised, for
a decoder model. Matryoshka truncation (``dimensions``) is allowed where ``config.json`` says so, vLLM's keys:
``is_matryoshka`` (any width) or ``matryoshka_dimensions`` (those widths). A config's ``pooling`` object overrides
any of the three. The pooling itself is ``pool``: on the hidden states after the final norm (padding never
enters: each input is its own span)."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

TASKS = ("generate", "embed", "score")
METHODS = ("last", "mean", "cls")
# Architecture -> the tasks it serves unless the config narrows them (a decoder LM also embeds, last-token).
ARCH_TASKS: dict[str, frozenset[str]] = {
    "LlamaForCausalLM": frozenset({"generate", "embed"}),
    "MistralForCausalLM": frozenset({"generate", "embed"}),
    "Qwen2ForCausalLM": frozenset({"generate", "embed"}),
    "LlamaModel": frozenset({"embed"}),  # a bare encoder (sentence-transformers' Transformer module)
    "LlamaForSequenceClassification": frozenset({"score"}),  # a cross-encoder: a score head on the last token
}
_ST_MODES = {"mean": "mean", "cls": "cls", "lasttoken": "last", "last": "last"}
_ST_FLAGS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_lasttoken": "last"}


@dataclass(frozen=True)
class PoolingSpec:
    method: str = "last"  # METHODS
    normalize: bool = False
    matryoshka: bool | tuple[int, ...] = False  # False: no truncation; True: any width; a tuple: those widths
    source: str = "default (last token of a decoder model)"

    def check_dimensions(self, dimensions: int, width: int) -> str | None:
        """Why ``dimensions`` is refused for this model (None: allowed)."""
        if self.matryoshka is False:
            return (f"this model does not support Matryoshka truncation (`dimensions`); it returns {width} "
                    "dimensions (a model allows it with is_matryoshka or matryoshka_dimensions in its config.json, "
                    "or ModelConfig.pooling.matryoshkaDimensions)")
        if not 1 <= dimensions <= width:
            return f"`dimensions` must be 1 to {width}, got {dimensions}"
        if self.matryoshka is not True and dimensions not in self.matryoshka:
            return f"`dimensions` must be one of {list(self.matryoshka)} for this model, got {dimensions}"
        return None

    def to_json(self) -> dict[str, Any]:
        m = self.matryoshka
        return {"pooling": self.method, "normalize": self.normalize,
                "matryoshka_dimensions": m if isinstance(m, bool) else list(m)}


def folder_tasks(folder: Path) -> frozenset[str] | None:
    """What a checkpoint folder can serve, read from its files without loading it (None: unknown). A GGUF is a
    causal LM (transformers reads only those)."""
    cfg = folder / "config.json"
    if cfg.is_file():
        try:
            raw = json.loads(cfg.read_text())
        except (OSError, ValueError):
            return None
        archs = [a for a in raw.get("architectures") or [] if a in ARCH_TASKS] if isinstance(raw, dict) else []
        return checkpoint_tasks(archs[0] if archs else "", folder, "text_config" in raw)
    if any(folder.glob("*.gguf")):
        return ARCH_TASKS["LlamaForCausalLM"]
    return None


def checkpoint_tasks(architecture: str, folder: Path | None, multimodal: bool) -> frozenset[str]:
    """What a checkpoint can serve: by architecture; a sentence-transformers folder embeds only."""
    if folder is not None and (folder / "modules.json").is_file():
        return frozenset({"embed"})
    if multimodal:
        return frozenset({"generate"})
    return ARCH_TASKS.get(architecture, frozenset({"generate"}))


def served_tasks(possible: frozenset[str], task: str) -> frozenset[str]:
    """``task`` ("auto" or one of TASKS, from the config or model.json) narrows what the checkpoint serves."""
    if task == "auto":
        return possible
    if task not in possible:
        raise ValueError(f"Parameter task must be one this checkpoint serves ({', '.join(sorted(possible))}), got "
                         f"{task!r} (embed: a causal LM or an embedding checkpoint; score: a one-label "
                         "LlamaForSequenceClassification; generate: a causal LM)")
    return frozenset({task})


def read_pooling(folder: Path | None, hf_config: Any, override: dict[str, Any] | None = None) -> PoolingSpec:
    """The checkpoint's pooling (module doc), then the config's ``override`` (keys method, normalize,
    matryoshka)."""
    spec = PoolingSpec()
    if folder is not None and (folder / "modules.json").is_file():
        spec = _sentence_transformers(folder)
    dims = getattr(hf_config, "matryoshka_dimensions", None)
    if dims:
        spec = PoolingSpec(spec.method, spec.normalize, tuple(int(d) for d in dims), spec.source)
    elif getattr(hf_config, "is_matryoshka", False):
        spec = PoolingSpec(spec.method, spec.normalize, True, spec.source)
    if override:
        spec = PoolingSpec(override.get("method") or spec.method,
                           spec.normalize if override.get("normalize") is None else bool(override["normalize"]),
                           spec.matryoshka if override.get("matryoshka") is None else override["matryoshka"],
                           spec.source + " + ModelConfig.pooling")
    return spec


def _sentence_transformers(folder: Path) -> PoolingSpec:
    try:
        modules = json.loads((folder / "modules.json").read_text())
        kinds = [(str(m["type"]).rsplit(".", 1)[-1], str(m.get("path", ""))) for m in modules]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"Parameter model must hold a readable modules.json, got {folder} ({exc})") from exc
    unknown = [k for k, _ in kinds if k not in ("Transformer", "Pooling", "Normalize")]
    if unknown or not kinds or kinds[0][0] != "Transformer":
        raise ValueError(f"Parameter model must be a sentence-transformers pipeline of Transformer, Pooling and "
                         f"Normalize modules; {folder} has {[k for k, _ in kinds]} (Dense and other modules are not "
                         "served)")
    method, how = "mean", "sentence-transformers default"  # Pooling's own default mode
    pool_path = next((p for k, p in kinds if k == "Pooling"), None)
    if pool_path is not None and (folder / pool_path / "config.json").is_file():
        cfg = json.loads((folder / pool_path / "config.json").read_text())
        method, how = _st_mode(cfg, folder)
    return PoolingSpec(method, any(k == "Normalize" for k, _ in kinds), False, f"sentence-transformers ({how})")


def _st_mode(cfg: dict[str, Any], folder: Path) -> tuple[str, str]:
    mode = cfg.get("pooling_mode")
    if isinstance(mode, str):
        if mode not in _ST_MODES:
            raise ValueError(f"Parameter model's pooling_mode must be one of {sorted(_ST_MODES)}, got {mode!r} "
                             f"({folder})")
        return _ST_MODES[mode], f"pooling_mode {mode}"
    on = [m for flag, m in _ST_FLAGS.items() if cfg.get(flag)]
    others = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v and k not in _ST_FLAGS]
    if len(on) != 1 or others:
        raise ValueError(f"Parameter model's 1_Pooling/config.json must switch on one of {sorted(_ST_FLAGS)}, got "
                         f"{sorted(k for k, v in cfg.items() if k.startswith('pooling_mode_') and v)} ({folder})")
    return on[0], next(f for f, m in _ST_FLAGS.items() if m == on[0])


def pool(hidden: torch.Tensor, spans: list[tuple[int, int]], spec: PoolingSpec) -> torch.Tensor:
    """One vector per span (start row, token count) of ``hidden`` [T, width], in fp32."""
    import torch  # here: the catalog reads what a checkpoint serves (checkpoint_tasks) without torch
    rows = []
    for start, n in spans:
        h = hidden[start:start + n].float()
        rows.append(h[-1] if spec.method == "last" else h[0] if spec.method == "cls" else h.mean(0))
    out = torch.stack(rows)
    return torch.nn.functional.normalize(out, dim=-1) if spec.normalize else out


def truncate(vectors: torch.Tensor, dimensions: int | None) -> torch.Tensor:
    """Matryoshka truncation to ``dimensions``, renormalised (as vLLM and sentence-transformers' truncate_dim do)."""
    import torch
    if dimensions is None or dimensions >= vectors.shape[-1]:
        return vectors
    return torch.nn.functional.normalize(vectors[..., :dimensions], dim=-1)
