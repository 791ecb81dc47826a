"""Media encoders for multimodal checkpoints (LLaVA, Qwen2-Audio) in front of our paged language model.

The language model runs in the engine like any other (registry.py maps the checkpoint's
``text_config`` and weight prefix); this module keeps the rest of the checkpoint: the transformers
encoder modules (vision tower / audio tower + projector), the model's ``AutoProcessor`` and its chat
template. The flow for one request:

    prompt = encoder.prepare(parts)            # frontend thread: chat template + processor
    EngineRequest(rid, prompt.prompt_token_ids, params, mm_inputs=prompt.mm_inputs,
                  mm_hashes=prompt.mm_hashes)
    # engine thread, at prefill: ModelRunner.embeds_hook -> encoder.embeds_hook(chunks)
    # encodes the media once per request and splices the embeddings over the placeholder tokens.

``parts`` is the request's content in order: dicts ``{"type": "text", "text": str}``,
``{"type": "image", "image": PIL.Image | HxWx3 uint8 array}``, ``{"type": "video", "video": [frames]}``
(a video becomes one image part per frame, in its place), ``{"type": "audio", "audio": float32 mono
array, "sampling_rate": int}``; each media dict may carry ``"hash"`` (content hash for the prefix
cache; computed from the decoded content when absent). ``multimodal.LoadedPart`` objects (``kind``,
``payload``, ``sha256``) are accepted as they are.
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch
from safetensors import safe_open
from torch import nn

from mindie_service.errors import ValidationError, check

logger = logging.getLogger(__name__)


@dataclass
class MultimodalInputs:
    """Per-request media state carried on EngineRequest/Sequence.mm_inputs."""

    tensors: dict[str, torch.Tensor]  # the processor's media tensors (pixel_values, input_features, ...)
    num_embeds: int  # placeholder tokens the processor expanded (= rows the encoder yields)
    embeds: torch.Tensor | None = None  # [num_embeds, hidden], computed once at first prefill (engine thread)


@dataclass
class MultimodalPrompt:
    prompt_token_ids: list[int]
    mm_inputs: MultimodalInputs | None
    mm_hashes: tuple[str, ...] = ()
    text: str = ""  # the rendered chat prompt before placeholder expansion (for logs at DEBUG only)
    media_kinds: tuple[str, ...] = field(default_factory=tuple)


def _hash_media(kind: str, payload: Any) -> str:
    h = hashlib.sha256(kind.encode())
    items = payload if kind == "video" else [payload]
    for item in items:
        if hasattr(item, "tobytes") and hasattr(item, "mode"):  # PIL image
            h.update(f"{item.mode}{item.size}".encode())
            h.update(item.tobytes())
        else:
            arr = np.ascontiguousarray(np.asarray(item))
            h.update(f"{arr.dtype}{arr.shape}".encode())
            h.update(arr.tobytes())
    return h.hexdigest()


def _normalize(parts: Iterable[Any]) -> list[dict[str, Any]]:
    out = []
    for i, part in enumerate(parts):
        if not isinstance(part, dict):  # multimodal.LoadedPart
            kind = part.kind
            part = {"type": kind, ("text" if kind == "text" else kind): part.payload, "hash": part.sha256}
        kind = part.get("type")
        check(kind in ("text", "image", "video", "audio"), f"inputs[{i}].type", "one of text, image, video, audio",
              kind)
        check(kind in part, f"inputs[{i}]", f"an object holding {kind!r}", sorted(part))
        out.append(part)
    return out


def _load_prefixed(path: Path, modules: dict[tuple[str, ...], nn.Module]) -> None:
    """Load each module from the checkpoint tensors under the first of its prefixes that exists."""
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if any(name.startswith(p) for prefixes in modules for p in prefixes):
                    tensors[name] = f.get_tensor(name)
    for prefixes, module in modules.items():
        prefix = next((p for p in prefixes if any(k.startswith(p) for k in tensors)), None)
        check(prefix is not None, "model", f"a checkpoint holding {prefixes[0]}* weights", str(path))
        state = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        missing, unexpected = module.load_state_dict(state, strict=False)
        persistent = set(module.state_dict())
        missing = [m for m in missing if m in persistent]
        check(not missing and not unexpected, "model", f"weights matching {prefix}*",
              {"missing": missing[:5], "unexpected": unexpected[:5]})


class MultimodalEncoder(nn.Module):
    """Common part: processor, placeholder bookkeeping, prompt construction, the embeds hook."""

    modalities: tuple[str, ...] = ()
    sampling_rate: int | None = None  # audio models: the rate the media layer should decode audio at

    def __init__(self, processor: Any, placeholder: str, placeholder_id: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.processor, self.placeholder, self.placeholder_id = processor, placeholder, placeholder_id
        self.device, self.dtype = device, dtype

    # ------------------------------------------------------------ frontend side
    def prepare(self, parts: Iterable[Any]) -> MultimodalPrompt:
        """One user message with the parts in order -> chat template -> processor (placeholders expanded)."""
        return self.prepare_chat([("user", parts)])

    def prepare_chat(self, messages: Iterable[tuple[str, Any]]) -> MultimodalPrompt:
        """Chat messages ``(role, str | parts)`` -> the processor's chat template -> processor."""
        chat: list[dict[str, Any]] = []
        media: list[Any] = []
        hashes: list[str] = []
        kinds: list[str] = []
        for role, parts in messages:
            content = self._content([{"type": "text", "text": parts}] if isinstance(parts, str) else parts,
                                    media, hashes, kinds)
            chat.append({"role": role, "content": content})
        check(bool(chat) and all(m["content"] for m in chat), "inputs", "a non-empty list of parts", [])
        text = self.processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        if not media:
            ids = self.processor.tokenizer(text, add_special_tokens=False).input_ids
            return MultimodalPrompt(list(ids), None, (), text)
        out = self._process(text, media)
        ids = out.pop("input_ids")[0].tolist()
        out.pop("attention_mask", None)
        n = sum(1 for t in ids if t == self.placeholder_id)
        return MultimodalPrompt(ids, MultimodalInputs(dict(out), n), tuple(hashes), text, tuple(kinds))

    def _content(self, parts: Iterable[Any], media: list[Any], hashes: list[str],
                 kinds: list[str]) -> list[dict[str, Any]]:
        """One message's parts -> template content; media payloads, hashes and kinds appended in order."""
        norm = _normalize(parts)
        content: list[dict[str, Any]] = []
        for i, part in enumerate(norm):
            kind = part["type"]
            if kind == "text":
                text = part["text"]
                check(isinstance(text, str), f"inputs[{i}].text", "a string", type(text).__name__)
                if self.placeholder in text:
                    raise ValidationError(f"Parameter inputs[{i}].text must not contain the media placeholder "
                                          f"{self.placeholder!r}; send the media as its own part")
                content.append({"type": "text", "text": text})
                continue
            check(kind in self.modalities or (kind == "video" and "image" in self.modalities), f"inputs[{i}].type",
                  f"a media type this model takes ({', '.join(self.modalities)})", kind)
            payload = part[kind]
            hashes.append(str(part.get("hash") or _hash_media(kind, payload)))
            kinds.append(kind)
            if kind == "video":
                frames = list(payload)
                check(len(frames) > 0, f"inputs[{i}].video", "at least one frame", 0)
                content.extend({"type": "image"} for _ in frames)
                media.extend(self._image(f) for f in frames)
            elif kind == "image":
                content.append({"type": "image"})
                media.append(self._image(payload))
            else:
                content.append({"type": "audio"})
                media.append(self._audio(payload, part.get("sampling_rate")))
        return content

    @staticmethod
    def _image(img: Any) -> Any:
        from PIL import Image
        if isinstance(img, np.ndarray):
            img = Image.fromarray(img.astype(np.uint8))
        return img.convert("RGB") if getattr(img, "mode", "RGB") != "RGB" else img

    def _audio(self, wav: Any, rate: int | None) -> np.ndarray:  # pragma: no cover - image models never get here
        raise ValidationError("this model takes no audio")

    def _process(self, text: str, media: list[Any]) -> dict[str, Any]:
        raise NotImplementedError

    # ------------------------------------------------------------ engine side
    def check_prompt(self, ids: list[int], mm: MultimodalInputs | None) -> None:
        """Placeholder tokens must match the media exactly (typed placeholders without media are refused)."""
        n = sum(1 for t in ids if t == self.placeholder_id)
        want = mm.num_embeds if mm is not None else 0
        if n != want:
            raise ValidationError(f"Parameter inputs must hold exactly one {self.placeholder!r} token per media "
                                  f"embedding ({want}), got {n} (placeholders typed as text, or a prompt cut by "
                                  f"truncation, are refused)")

    def encode(self, mm: MultimodalInputs) -> torch.Tensor:
        raise NotImplementedError

    @torch.inference_mode()
    def embeds_hook(self, chunks: list[tuple[Any, int]]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """ModelRunner hook: (prefill chunk holding media, its packed start) -> (indices, embeddings) of the
        placeholders that fall inside each chunk's positions."""
        idx: list[torch.Tensor] = []
        embs: list[torch.Tensor] = []
        for chunk, start in chunks:
            mm: MultimodalInputs | None = chunk.mm_inputs
            if mm is None:
                continue
            if mm.embeds is None:
                mm.embeds = self.encode(mm)
                check(mm.embeds.shape[0] == mm.num_embeds, "inputs", f"{mm.num_embeds} media embeddings",
                      mm.embeds.shape[0])
            pos = torch.tensor([p for p, t in enumerate(chunk.prompt_token_ids) if t == self.placeholder_id])
            sel = (pos >= chunk.start) & (pos < chunk.end)
            if bool(sel.any()):
                idx.append(pos[sel] - chunk.start + start)
                embs.append(mm.embeds[sel.to(mm.embeds.device)])
        if not idx:
            return None
        return torch.cat(idx).to(self.device), torch.cat(embs)


class LlavaEncoder(MultimodalEncoder):
    """CLIP-style vision tower + projector, features taken at ``vision_feature_layer`` with
    ``vision_feature_select_strategy`` ("default" drops the CLS position), as LlavaModel does."""

    modalities = ("image",)

    @classmethod
    def load(cls, path: Path, cfg: Any, device: torch.device, dtype: torch.dtype) -> "LlavaEncoder":
        from transformers import AutoModel, AutoProcessor
        from transformers.models.llava.modeling_llava import LlavaMultiModalProjector

        proc = AutoProcessor.from_pretrained(str(path))
        token = getattr(proc, "image_token", "<image>")
        enc = cls(proc, token, int(cfg.image_token_id), device, dtype)
        enc.vision_tower = AutoModel.from_config(cfg.vision_config)
        enc.multi_modal_projector = LlavaMultiModalProjector(cfg)
        _load_prefixed(Path(path), {("model.vision_tower.", "vision_tower."): enc.vision_tower,
                                    ("model.multi_modal_projector.", "multi_modal_projector."):
                                        enc.multi_modal_projector})
        enc.feature_layer = cfg.vision_feature_layer
        enc.strategy = cfg.vision_feature_select_strategy
        return enc.to(device=device, dtype=dtype).eval()

    def _process(self, text: str, media: list[Any]) -> dict[str, Any]:
        return dict(self.processor(text=text, images=media, return_tensors="pt", add_special_tokens=False))

    def encode(self, mm: MultimodalInputs) -> torch.Tensor:
        pixels = mm.tensors["pixel_values"].to(self.device, self.dtype)
        hidden = self.vision_tower(pixels, output_hidden_states=True, return_dict=True).hidden_states
        layers = [self.feature_layer] if isinstance(self.feature_layer, int) else list(self.feature_layer)
        feats = [hidden[i][:, 1:] if self.strategy == "default" else hidden[i] for i in layers]
        out = self.multi_modal_projector(torch.cat(feats, dim=-1))
        return out.reshape(-1, out.shape[-1])


class Qwen2AudioEncoder(MultimodalEncoder):
    """Whisper-style audio tower + linear projector, padded frames masked as Qwen2AudioModel does."""

    modalities = ("audio",)

    @classmethod
    def load(cls, path: Path, cfg: Any, device: torch.device, dtype: torch.dtype) -> "Qwen2AudioEncoder":
        from transformers import AutoModel, AutoProcessor
        from transformers.models.qwen2_audio.modeling_qwen2_audio import Qwen2AudioMultiModalProjector

        proc = AutoProcessor.from_pretrained(str(path))
        enc = cls(proc, proc.audio_token, int(cfg.audio_token_id), device, dtype)
        enc.audio_tower = AutoModel.from_config(cfg.audio_config)
        enc.multi_modal_projector = Qwen2AudioMultiModalProjector(cfg)
        _load_prefixed(Path(path), {("model.audio_tower.", "audio_tower."): enc.audio_tower,
                                    ("model.multi_modal_projector.", "multi_modal_projector."):
                                        enc.multi_modal_projector})
        return enc.to(device=device, dtype=dtype).eval()

    @property
    def sampling_rate(self) -> int:
        return int(self.processor.feature_extractor.sampling_rate)

    def _audio(self, wav: Any, rate: int | None) -> np.ndarray:
        x = np.asarray(wav, dtype=np.float32)
        check(x.ndim == 1 and x.size > 0, "audio", "non-empty mono samples", x.shape)
        if rate is not None and int(rate) != self.sampling_rate:  # linear resampling; the media layer usually
            n = max(1, round(x.size * self.sampling_rate / int(rate)))  # decodes at the model's rate already
            x = np.interp(np.linspace(0, x.size - 1, n), np.arange(x.size), x).astype(np.float32)
        return x

    def _process(self, text: str, media: list[Any]) -> dict[str, Any]:
        out = dict(self.processor(text=text, audio=media, sampling_rate=self.sampling_rate, return_tensors="pt",
                                  add_special_tokens=False))
        out.pop("num_audio_tokens", None)
        return out

    def encode(self, mm: MultimodalInputs) -> torch.Tensor:
        from transformers.masking_utils import create_bidirectional_mask

        feats = mm.tensors["input_features"].to(self.device, self.dtype)
        fmask = mm.tensors["feature_attention_mask"].to(self.device)
        feat_lens, out_lens = self.audio_tower._get_feat_extract_output_lengths(fmask.sum(-1))
        batch, _, mel_len = feats.shape
        max_len = (mel_len - 2) // 2 + 1
        mask2d = (torch.arange(max_len, device=self.device)[None, :] < feat_lens[:, None]).long()
        attn = create_bidirectional_mask(config=self.audio_tower.config,
                                         inputs_embeds=torch.zeros(batch, max_len, 1, dtype=self.dtype,
                                                                   device=self.device),
                                         attention_mask=mask2d)
        out = self.multi_modal_projector(self.audio_tower(feats, attention_mask=attn).last_hidden_state)
        keep = torch.arange(out.shape[1], device=self.device)[None, :] < out_lens.to(self.device)[:, None]
        return out[keep]
