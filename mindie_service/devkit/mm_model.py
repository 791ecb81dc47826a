"""Random-weight multimodal demo checkpoints: ``tiny-vl`` (LLaVA) and ``tiny-audio`` (Qwen2-Audio).

Each is a complete Hugging Face folder (config.json, model.safetensors, tokenizer, processor with
chat template) that ``AutoProcessor`` and the class named in config.json load unchanged, built
from nothing but a seed: the text tokenizer is the ``tiny`` preset's locally trained BPE plus the
media placeholder token, the language model weights follow ``text_model.make_weights`` (scales chosen so
greedy output depends on context), and encoder/projector weights are redrawn with fan-in scaling so
that media actually moves the output. Two builds with the same seed are byte-identical.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from mindie_service.devkit.text_model import (BOS_ID, EOS_ID, PAD_ID, TINY, TextShape, config_dict, make_weights,
                                             train_tokenizer)

# User content is a list of {"type": "image"|"audio"|"text"} parts (HF form); media parts become
# their placeholder, which the processor expands to one token per embedding.
_MM_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>"
    "{% elif part['type'] == 'audio' %}<|AUDIO|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

TEXT_SHAPE = TINY  # the text backbone of both presets
IMAGE_SIZE, PATCH = 32, 8
AUDIO_CHUNK_S, AUDIO_RATE = 2, 16000  # 2 s windows -> 200 mel frames -> at most 50 audio tokens


def _tokenizer(placeholder: str) -> Any:
    """The tiny text tokenizer with the placeholder appended as a special token (id = 2048)."""
    from transformers import PreTrainedTokenizerFast

    base = TEXT_SHAPE
    tok = train_tokenizer(base.vocab_size)
    tok.add_special_tokens([placeholder])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", padding_side="left", clean_up_tokenization_spaces=False,
                                   model_max_length=base.max_position_embeddings,
                                   model_input_names=["input_ids", "attention_mask"])
    return fast


def _text_preset(vocab: int) -> TextShape:
    return dataclasses.replace(TEXT_SHAPE, vocab_size=vocab)


def _text_config(p: TextShape, qkv_bias: bool) -> dict[str, Any]:
    cfg = config_dict(p)
    for k in ("architectures", "torch_dtype", "rope_scaling"):
        cfg.pop(k)
    cfg["model_type"] = "qwen2" if qkv_bias else "llama"
    if qkv_bias:
        for k in ("attention_bias", "mlp_bias", "head_dim"):
            cfg.pop(k)
        cfg["use_sliding_window"] = False
    return cfg


def _redraw(shapes: dict[str, torch.Tensor], lm: dict[str, str], text: dict[str, torch.Tensor],
            seed: int) -> dict[str, torch.Tensor]:
    """Weights for every name of ``shapes``: text weights from ``text`` (HF Llama names, reached through the
    prefix map ``lm``); every other tensor redrawn in name order from one generator: norms 1, biases
    N(0, 0.02), class/position embeddings N(0, 1), other matrices and convolutions N(0, 1/fan_in)."""
    g = torch.Generator().manual_seed(seed + 1)
    out: dict[str, torch.Tensor] = {}
    for name, t in sorted(shapes.items()):
        src = next((text[old + name[len(new):]] for new, old in lm.items()
                    if name.startswith(new) and old + name[len(new):] in text), None)
        leaf = name.rsplit(".", 1)[-1]
        if src is not None:
            out[name] = src.clone()
        elif not t.dtype.is_floating_point:
            raise ValueError(f"demo builder cannot draw integer tensor {name}")
        elif "norm" in name and leaf == "weight":
            out[name] = torch.ones(t.shape)
        elif leaf == "bias":
            out[name] = torch.empty(t.shape).normal_(0.0, 0.02, generator=g)
        elif t.dim() == 1 or "position" in name:  # class embedding, learned position tables
            out[name] = torch.empty(t.shape).normal_(0.0, 1.0, generator=g)
        else:
            out[name] = torch.empty(t.shape).normal_(0.0, t[0].numel() ** -0.5, generator=g)
    return {k: v.contiguous() for k, v in out.items()}


def _save(model_cls: Any, cfg: Any, lm: dict[str, str], text: dict[str, torch.Tensor], seed: int, d: Path) -> None:
    with torch.device("meta"):  # names and shapes only; nothing is initialised
        shapes = model_cls(cfg).state_dict()
    save_file(_redraw(shapes, lm, text, seed), str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "model.safetensors").chmod(0o644)  # safetensors creates it 0600
    cfg_dict = cfg.to_dict()
    cfg_dict.pop("transformers_version", None)
    cfg_dict["torch_dtype"] = "float32"  # MindIE requires it in config.json
    (d / "config.json").write_text(json.dumps(cfg_dict, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (d / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "do_sample": False},
        indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_vl(seed: int, d: Path) -> None:
    """The ``tiny-vl`` checkpoint (LLaVA: CLIP vision tower + projector + tiny Llama) into ``d``."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    tok = _tokenizer("<image>")
    p = _text_preset(len(tok))
    vision = CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                              image_size=IMAGE_SIZE, patch_size=PATCH, projection_dim=64, hidden_act="quick_gelu")
    cfg = LlavaConfig(vision_config=vision.to_dict(), text_config=LlamaConfig(**_text_config(p, False)).to_dict(),
                      image_token_index=tok.convert_tokens_to_ids("<image>"), projector_hidden_act="gelu",
                      vision_feature_select_strategy="default", vision_feature_layer=-2,
                      image_seq_length=(IMAGE_SIZE // PATCH) ** 2, tie_word_embeddings=False, dtype="float32")
    cfg.architectures = ["LlavaForConditionalGeneration"]
    text = make_weights(p, seed)
    _save(LlavaForConditionalGeneration, cfg, {"model.language_model.": "model.", "lm_head.": "lm_head."}, text, seed, d)
    image_proc = CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIZE},
                                       crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    proc = LlavaProcessor(image_processor=image_proc, tokenizer=tok, patch_size=PATCH,
                          vision_feature_select_strategy="default", chat_template=_MM_TEMPLATE,
                          image_token="<image>", num_additional_image_tokens=1)
    proc.save_pretrained(str(d))


def write_audio(seed: int, d: Path) -> None:
    """The ``tiny-audio`` checkpoint (Qwen2-Audio: Whisper-style encoder + tiny Qwen2) into ``d``."""
    from transformers import (Qwen2AudioConfig, Qwen2AudioEncoderConfig, Qwen2AudioForConditionalGeneration,
                              Qwen2AudioProcessor, Qwen2Config, WhisperFeatureExtractor)

    tok = _tokenizer("<|AUDIO|>")
    p = _text_preset(len(tok))
    mels = 32
    audio = Qwen2AudioEncoderConfig(num_mel_bins=mels, encoder_layers=2, encoder_attention_heads=2,
                                    encoder_ffn_dim=128, d_model=64, max_source_positions=AUDIO_CHUNK_S * 50)
    cfg = Qwen2AudioConfig(audio_config=audio.to_dict(), text_config=Qwen2Config(**_text_config(p, True)).to_dict(),
                           audio_token_index=tok.convert_tokens_to_ids("<|AUDIO|>"), dtype="float32")
    cfg.architectures = ["Qwen2AudioForConditionalGeneration"]
    # Qwen2 carries q/k/v biases: draw them after the Llama weights so those stay the tiny preset's.
    text = make_weights(p, seed)
    g = torch.Generator().manual_seed(seed + 2)
    for i in range(p.num_hidden_layers):
        for m, n in (("q", p.num_attention_heads), ("k", p.num_key_value_heads), ("v", p.num_key_value_heads)):
            text[f"model.layers.{i}.self_attn.{m}_proj.bias"] = torch.empty(n * p.head_dim).normal_(0, 0.1, generator=g)
    cfg.tie_word_embeddings = False
    cfg.text_config.tie_word_embeddings = False
    _save(Qwen2AudioForConditionalGeneration, cfg, {"model.language_model.": "model.", "lm_head.": "lm_head."},
          text, seed, d)
    fe = WhisperFeatureExtractor(feature_size=mels, sampling_rate=AUDIO_RATE, chunk_length=AUDIO_CHUNK_S,
                                 hop_length=160, n_fft=400, return_attention_mask=True)
    proc = Qwen2AudioProcessor(feature_extractor=fe, tokenizer=tok, chat_template=_MM_TEMPLATE,
                               audio_token="<|AUDIO|>")
    proc.save_pretrained(str(d))

