"""Model families by Hugging Face architecture name: a registry, not a chain of ifs."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from mindie_service.models.llama import LlamaDims, LlamaForCausalLM, LlamaForScore


@dataclass(frozen=True)
class ModelFamily:
    build: Callable[[Any, torch.Tensor, torch.Tensor], nn.Module]  # (hf_config, cos, sin) -> model
    rotary_class: str  # transformers class whose tables we reuse so RoPE matches bit for bit
    # Multimodal wrappers: the language model's config is ``hf_config.text_config``, its weights sit under
    # ``weight_prefixes`` (checkpoint prefix -> ours), and ``encoder`` ("module:Class") builds the media
    # encoders (see models/media_encoders.py). Plain LMs keep the defaults.
    text_config: str | None = None
    weight_prefixes: tuple[tuple[str, str], ...] = (("model.", ""),)
    encoder: str | None = None


def _llama(qkv_bias: bool | None) -> Callable[[Any, torch.Tensor, torch.Tensor], nn.Module]:
    def build(cfg: Any, cos: torch.Tensor, sin: torch.Tensor) -> nn.Module:
        return LlamaForCausalLM(LlamaDims.from_hf(cfg, qkv_bias=qkv_bias), cos, sin)
    return build


def _encoder(cfg: Any, cos: torch.Tensor, sin: torch.Tensor) -> nn.Module:
    """A bare LlamaModel (an embedding checkpoint): no head of its own, so its "head" is the tied embeddings
    (never used: such a model only pools hidden states)."""
    return LlamaForCausalLM(dataclasses.replace(LlamaDims.from_hf(cfg), tie_embeddings=True), cos, sin)


def _scorer(cfg: Any, cos: torch.Tensor, sin: torch.Tensor) -> nn.Module:
    return LlamaForScore(LlamaDims.from_hf(cfg), cos, sin, num_labels=int(getattr(cfg, "num_labels", 1)))


REGISTRY: dict[str, ModelFamily] = {
    "LlamaForCausalLM": ModelFamily(_llama(None), "transformers.models.llama.modeling_llama.LlamaRotaryEmbedding"),
    "MistralForCausalLM": ModelFamily(_llama(None),
                                      "transformers.models.mistral.modeling_mistral.MistralRotaryEmbedding"),
    # Qwen2 has biases on q/k/v but not on o_proj.
    "Qwen2ForCausalLM": ModelFamily(_llama(True), "transformers.models.qwen2.modeling_qwen2.Qwen2RotaryEmbedding"),
    # Pooling models (models/pooling_spec.py): a bare encoder embeds; a sequence classifier's score head (weights
    # "score.*") is our lm_head, computed on the last token as transformers does.
    "LlamaModel": ModelFamily(_encoder, "transformers.models.llama.modeling_llama.LlamaRotaryEmbedding",
                              weight_prefixes=(("model.", ""),)),
    "LlamaForSequenceClassification": ModelFamily(
        _scorer, "transformers.models.llama.modeling_llama.LlamaRotaryEmbedding",
        weight_prefixes=(("model.", ""), ("score.", "lm_head."))),
    # transformers 5 layout: model.{vision_tower,audio_tower,multi_modal_projector,language_model}.*, lm_head.*
    "LlavaForConditionalGeneration": ModelFamily(
        _llama(None), "transformers.models.llama.modeling_llama.LlamaRotaryEmbedding", text_config="text_config",
        weight_prefixes=(("model.language_model.", ""), ("language_model.model.", ""), ("language_model.", "")),
        encoder="mindie_service.models.media_encoders:LlavaEncoder"),
    "Qwen2AudioForConditionalGeneration": ModelFamily(
        _llama(True), "transformers.models.qwen2.modeling_qwen2.Qwen2RotaryEmbedding", text_config="text_config",
        weight_prefixes=(("model.language_model.", ""), ("language_model.model.", ""), ("language_model.", "")),
        encoder="mindie_service.models.media_encoders:Qwen2AudioEncoder"),
}


def family_for(architectures: list[str] | None) -> tuple[str, ModelFamily]:
    for arch in architectures or []:
        if arch in REGISTRY:
            return arch, REGISTRY[arch]
    raise ValueError(f"Parameter architectures must name one of {sorted(REGISTRY)}, got {architectures!r}")
