"""The one table of demo-model presets and the versioned, atomic build behind ``mindie-service demo-model``.

Each built folder holds ``devkit.json`` recording the preset, the seed and the devkit build version.
The version is ``FORMAT`` plus a digest of the builder sources, so any edit to a builder (or the
corpus its tokenizer is trained on) makes folders built before it stale, and ``if_missing`` rebuilds
them: tests never run on test models an older builder made. Bump ``FORMAT`` for a change the
digest cannot see (e.g. a transformers upgrade that changes what the multimodal builders write).

This module imports the builders, never the other way round, so the text and multimodal builders
stay free of each other's registry concerns.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache, partial
from pathlib import Path

from filelock import FileLock

from mindie_service.devkit import corpus, mm_model, text_model
from mindie_service.devkit.text_model import SMALL, TINY, TextShape
from mindie_service.models.demo_marker import MARKER

logger = logging.getLogger(__name__)

FORMAT = 1
# MARKER (models.demo_marker) is written before config.json, which still marks a complete checkpoint
_BUILDER_MODULES = (text_model, mm_model, corpus)


# tiny-eos: tiny with its lm_head row for EOS scaled by this gain, so greedy generations end on EOS after a
# few to a few dozen tokens (the EOS tests need a reachable EOS). The digest does not cover this module:
# bump FORMAT when changing the gain or _write_tiny_eos.
EOS_GAIN = 2.0


def _write_tiny_eos(seed: int, d: Path) -> None:
    from safetensors.torch import load_file, save_file

    text_model.write_text_checkpoint(TINY, seed, d)
    weights = load_file(str(d / "model.safetensors"))
    weights["lm_head.weight"][text_model.EOS_ID] *= EOS_GAIN
    save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "model.safetensors").chmod(0o644)


# *-draft: the first DRAFT_LAYERS layers of the preset of the same seed (same embeddings, final norm, lm_head
# and tokenizer): a draft model for speculative decoding tests that shares its target's tokenizer and agrees
# with it often enough to be accepted. Bump FORMAT when changing DRAFT_LAYERS or _write_draft.
DRAFT_LAYERS = 1


def _write_draft(shape: TextShape, seed: int, d: Path) -> None:
    from safetensors.torch import load_file, save_file

    text_model.write_text_checkpoint(shape, seed, d)
    weights = load_file(str(d / "model.safetensors"))
    keep = {k: v for k, v in weights.items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < DRAFT_LAYERS}
    save_file(keep, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "model.safetensors").chmod(0o644)
    cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
    cfg["num_hidden_layers"] = DRAFT_LAYERS
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")


# tiny-think: tiny with <think> and </think> as two added (non-special) tokens, as Qwen3 has them, and a
# Qwen3-style chat template whose generation prompt opens <think> (Qwen3 thinking-2507, DeepSeek-R1), or writes
# an empty <think>\n\n</think>\n\n when the kwarg enable_thinking is false (Qwen3). Random weights rarely write
# </think>: a thinking budget forces it, so the split is deterministic. Bump FORMAT when changing these.
THINK_TOKENS = ("<think>", "</think>")
THINK_TEMPLATE = text_model.CHAT_TEMPLATE.replace(
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
    "{% if add_generation_prompt %}<|assistant|>\n{% if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}")


def _write_tiny_think(seed: int, d: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file
    from tokenizers import AddedToken, Tokenizer

    text_model.write_text_checkpoint(TINY, seed, d)
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in THINK_TOKENS])
    tok.save(str(d / "tokenizer.json"), pretty=True)
    weights = load_file(str(d / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in weights:  # two more rows, drawn like their neighbours
            w = weights[name]
            weights[name] = torch.cat([w, torch.randn(len(THINK_TOKENS), w.shape[1], generator=gen) * w.std()])
    save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "model.safetensors").chmod(0o644)
    tc = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    tc["chat_template"] = THINK_TEMPLATE
    (d / "tokenizer_config.json").write_text(json.dumps(tc, indent=2) + "\n", encoding="utf-8")
    cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
    cfg["vocab_size"] = TINY.vocab_size + len(THINK_TOKENS)
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")


@dataclass(frozen=True)
class Preset:
    """One buildable demo model. ``write(seed, folder)`` fills an empty folder, config.json last."""

    name: str
    kind: str  # "text" | "multimodal"
    write: Callable[[int, Path], None]
    description: str
    shape: TextShape | None = None  # the Llama shape of a text preset (param_count, /info)


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("tiny", "text", partial(text_model.write_text_checkpoint, TINY), "1.3M-parameter Llama (GQA)", TINY),
    Preset("tiny-eos", "text", _write_tiny_eos, "tiny with a reachable EOS (for EOS tests)", TINY),
    Preset("tiny-think", "text", _write_tiny_think, "tiny with a Qwen3-style thinking chat template",
           replace(TINY, vocab_size=TINY.vocab_size + len(THINK_TOKENS))),
    Preset("small", "text", partial(text_model.write_text_checkpoint, SMALL), "32M-parameter Llama (GQA)", SMALL),
    Preset("tiny-draft", "text", partial(_write_draft, TINY), "tiny's first layer: a draft model for tiny",
           replace(TINY, num_hidden_layers=DRAFT_LAYERS)),
    Preset("small-draft", "text", partial(_write_draft, SMALL), "small's first layer: a draft model for small",
           replace(SMALL, num_hidden_layers=DRAFT_LAYERS)),
    Preset("tiny-vl", "multimodal", mm_model.write_vl, "LLaVA: CLIP vision tower + tiny Llama"),
    Preset("tiny-audio", "multimodal", mm_model.write_audio, "Qwen2-Audio: audio encoder + tiny Qwen2"),
)}


def get_preset(name: str) -> Preset:
    """The preset called ``name``; ValueError naming the choices otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown demo preset {name!r}; choose from {sorted(PRESETS)}") from None


@lru_cache(maxsize=1)
def build_version() -> str:
    """``FORMAT.<digest of the builder sources>``: changes whenever a builder does."""
    h = hashlib.sha256()
    for mod in _BUILDER_MODULES:
        h.update(Path(mod.__file__ or "").read_bytes())
    return f"{FORMAT}.{h.hexdigest()[:12]}"


def recorded_version(folder: str | os.PathLike[str]) -> str | None:
    """The build version ``folder``'s marker records; None without a readable marker."""
    try:
        return str(json.loads((Path(folder) / MARKER).read_text(encoding="utf-8"))["devkit_version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_current(folder: str | os.PathLike[str]) -> bool:
    """A complete checkpoint (config.json present) built by this devkit version."""
    d = Path(folder)
    return (d / "config.json").is_file() and recorded_version(d) == build_version()


def _write_marker(preset: str, seed: int, d: Path) -> None:
    body = {"devkit_version": build_version(), "preset": preset, "seed": seed}
    (d / MARKER).write_text(json.dumps(body, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build_demo_model(preset: str, out: str | os.PathLike[str], seed: int = 0, if_missing: bool = False) -> Path:
    """Build the ``preset`` demo checkpoint into ``out`` and return its resolved path.

    ``if_missing``: keep a folder this devkit version already built (whatever its seed); rebuild a
    stale or incomplete one. Concurrent builders of one folder (parallel test workers, two servers with
    ``--prepare``) take turns on a lock (a file in the temp folder): the second finds the first's folder and keeps it.
    Files are written to a temporary sibling folder first and then moved in, config.json last, so an
    interrupted build never leaves something that looks like a checkpoint.
    """
    p = get_preset(preset)
    out_path = Path(out).resolve()
    if not if_missing:
        return _build(preset, p, seed, out_path)
    with FileLock(_lock_path(out_path)):
        if is_current(out_path):
            logger.info("demo model already present at %s; not rebuilding", out_path)
            return out_path
        if (out_path / "config.json").is_file():
            logger.warning("demo model at %s was built by devkit version %s, not %s; rebuilding", out_path,
                           recorded_version(out_path), build_version())
        return _build(preset, p, seed, out_path)


def _lock_path(out_path: Path) -> str:
    """The build lock of ``out_path``: in the temp folder, so that nothing but the checkpoint lands beside it."""
    digest = hashlib.sha256(str(out_path).encode()).hexdigest()[:16]
    return str(Path(tempfile.gettempdir()) / f"mindie_service-demo-{digest}.lock")


def _build(preset: str, p: Preset, seed: int, out_path: Path) -> Path:
    t0 = time.perf_counter()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_path.name}.tmp-", dir=out_path.parent))
    tmp.chmod(0o755)  # mkdtemp makes it 0700; it may become `out` itself
    try:
        p.write(seed, tmp)
        _write_marker(preset, seed, tmp)
        if not out_path.exists():
            tmp.rename(out_path)  # atomic on one filesystem
        else:
            # Existing folder: never delete unknown files; invalidate, then move ours in.
            (out_path / "config.json").unlink(missing_ok=True)
            for f in sorted(tmp.iterdir(), key=lambda f: f.name == "config.json"):
                os.replace(f, out_path / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("built demo model %r (seed %d, devkit %s) at %s in %.1fs", preset, seed, build_version(), out_path,
                time.perf_counter() - t0)
    return out_path
