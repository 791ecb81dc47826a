"""GGUF checkpoints (ggml's single-file format, the one Jan's catalog uses): found, checked, read.

The file is read with the ``gguf`` package (ggml's own Python reader); its metadata becomes a
model config (a llama file's read from that parse into our own ``gguf_config.GgufConfig``, any other through
transformers' GGUF helpers and config class: models/gguf_config.py), and so does its tokenizer and chat template
(``tokenizer.ggml.*``, ``tokenizer.chat_template``: a llama file's byte-level BPE built from the parse by
models/gguf_tokenizer.py, any other by transformers). Tensors are renamed to Hugging Face's names, so the safetensors
loader's copy (models/loader.py: packing q/k/v and gate/up) takes them as they are. F32, F16 and
BF16 tensors are kept (converted to the model's dtype like any checkpoint). A quantized linear or embedding
weight is kept as the file stores it (``tensors(packed=True)``: an ``npu_ops.quant_gguf.GgufWeight``, installed by
models/gguf_packed.py) where its block type has CPU kernels (npu_ops.quant_gguf's table); any other quantized
tensor is dequantized at load with ``gguf.quants.dequantize``, with a WARNING where packing was wanted. ``report``
says what was done per type and per quantized tensor.
llama.cpp's converter permutes q/k rows of Llama checkpoints for its rotary layout; they are
permuted back here, as transformers' GGUF loader does."""
from __future__ import annotations

import logging
import re
import threading
import warnings
import weakref
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from mindie_service.errors import ValidationError
from mindie_service.models.demo_marker import gguf_beside_demo
from mindie_service.models.gguf_config import LIGHT_TYPES, light_config, raw_config
from mindie_service.models.gguf_reader import read_gguf, shared_reader
from mindie_service.models.gguf_tokenizer import light_tokenizer
from npu_ops import gguf_cpu
from npu_ops.quant_gguf import GgufWeight

logger = logging.getLogger(__name__)

# GGUF ``general.architecture`` -> (Hugging Face architecture, q/k rows permuted by llama.cpp's converter).
# llama.cpp writes Mistral checkpoints as "llama"; transformers tells them apart by ``general.name``.
ARCHITECTURES: dict[str, tuple[str, bool]] = {
    "llama": ("LlamaForCausalLM", True),
    "qwen2": ("Qwen2ForCausalLM", False),
}
_MISTRAL = ("MistralForCausalLM", True)
PLAIN_TYPES = ("F32", "F16", "BF16")  # kept as they are (then cast to the model's dtype)

_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_IGNORED = ("rope_freqs.weight",)  # llama3 rope factors: the config's rope scaling is what our RoPE tables use


def find_gguf(path: str | Path) -> Path | None:
    """The GGUF file ``path`` names: the file itself (``*.gguf``), or the one ``.gguf`` in a folder that holds no
    config.json (a Hugging Face folder is read as one) or whose config.json is a demo build's (models.demo_marker).
    None for anything else."""
    p = Path(path)
    if p.is_file() and p.suffix == ".gguf":
        return p
    if not p.is_dir() or ((p / "config.json").is_file() and not gguf_beside_demo(p)):
        return None
    files = sorted(p.glob("*.gguf"))
    if len(files) > 1:
        raise ValidationError(f"Parameter model must name one .gguf file; folder {p} holds {len(files)}: "
                              f"{[f.name for f in files]} (name the file itself)")
    return files[0] if files else None


@dataclass
class GgufCheckpoint:
    """One opened GGUF file: its reader, architecture and config; ``report`` says what loading did to each
    tensor type (filled by ``tensors``)."""
    path: Path
    reader: Any  # gguf.GGUFReader
    gguf_architecture: str
    architecture: str  # the Hugging Face name our registry knows
    permute_qk: bool
    hf_config: Any = None
    report: dict[str, str] = field(default_factory=dict)

    def tensors(self, quantization: str | None = None,
                packed: bool = False) -> Iterator[tuple[str, torch.Tensor | GgufWeight]]:
        """(Hugging Face name, fp32 tensor) for every tensor of the file, dequantized where it is quantized; with
        ``packed``, a quantized linear or embedding weight whose type the CPU kernels run as a GgufWeight instead."""
        heads = self.hf_config.num_attention_heads
        kv_heads = getattr(self.hf_config, "num_key_value_heads", None) or heads
        kinds: Counter[str] = Counter()
        kept: Counter[str] = Counter()
        per_tensor: dict[str, str] = {}
        held_back = self._mixed_projections() if packed else {}
        for t in self.reader.tensors:
            if t.name in _IGNORED:
                logger.info("%s: tensor %s not used", self.path.name, t.name)
                continue
            name = hf_name(t.name)
            if name is None:
                raise ValidationError(f"GGUF file {self.path}: tensor {t.name!r} is not one of a "
                                      f"{self.gguf_architecture} model's tensors")
            kind = t.tensor_type.name
            kinds[kind] += 1
            why = self._why(t, name, held_back) if packed and kind not in PLAIN_TYPES else ""
            w: torch.Tensor | GgufWeight
            if packed and kind not in PLAIN_TYPES and why is None:
                w, kept[kind] = self._raw(t), kept[kind] + 1
                per_tensor[t.name] = f"{kind}: kept packed"
            else:
                w = self._dequantize(t)
                if why:
                    logger.warning("%s: tensor %s (%s) dequantized to fp32 at load: %s", self.path.name, t.name, kind,
                                   why)
                    per_tensor[t.name] = f"{kind}: dequantized at load ({why})"
            if self.permute_qk and name.endswith(("q_proj.weight", "k_proj.weight")):
                w = unpermute(w, heads if "q_proj" in name else kv_heads)
            yield name, w
        self.report = {kind: f"{n} tensors: {action(kind, quantization, kept[kind], n)}"
                       for kind, n in sorted(kinds.items())}
        self.report.update(sorted(per_tensor.items()))

    @staticmethod
    def _why(t: Any, name: str, held_back: dict[str, str]) -> str | None:
        """None: keep ``t`` packed; '': dequantize it silently (not a linear or embedding weight); else why not."""
        own = why_not_packed(t, name)
        return own if own is not None else held_back.get(_projection(name))

    def _mixed_projections(self) -> dict[str, str]:
        """Packed projections (q/k/v, gate/up) one of whose parts cannot stay packed -> why: all of such a
        projection's parts are dequantized (one projection is packed or dense as a whole)."""
        why: dict[str, str] = {}
        for t in self.reader.tensors:
            name = hf_name(t.name)
            proj = _projection(name or "")
            if proj and proj not in why:
                kind = t.tensor_type.name
                reason = f"{t.name} is {kind}" if kind in PLAIN_TYPES else why_not_packed(t, name or "")
                if reason:
                    why[proj] = f"its projection's part {t.name} cannot stay packed ({reason})"
        return why

    def _raw(self, t: Any) -> GgufWeight:
        """The tensor's blocks as stored: uint8 [rows, row bytes], a view of the mapped file (read-only: the load's
        huge-page arena, models/packed_arena.py, copies it once; a copy here would be a second one in flight)."""
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        with warnings.catch_warnings():  # torch warns that the mapping is not writable: nothing writes to it
            warnings.simplefilter("ignore", UserWarning)
            data = torch.from_numpy(np.asarray(t.data, dtype=np.uint8).reshape(shape[0], -1))
        return GgufWeight(data, t.tensor_type.name, (shape[0], shape[1]))

    def _dequantize(self, t: Any) -> torch.Tensor:
        from gguf.quants import dequantize
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # ggml lists dims fastest-first
        try:
            arr = dequantize(t.data, t.tensor_type)
        except NotImplementedError as exc:
            raise ValidationError(f"GGUF file {self.path}: tensor {t.name} has type {t.tensor_type.name}, which "
                                  f"cannot be dequantized here ({exc})") from exc
        except ValueError as exc:
            raise ValidationError(f"GGUF file {self.path}: tensor {t.name} ({t.tensor_type.name}) is malformed "
                                  f"({exc})") from exc
        arr = np.asarray(arr, dtype=np.float32)
        if arr.size != int(np.prod(shape)):
            raise ValidationError(f"GGUF file {self.path}: tensor {t.name} holds {arr.size} values, its shape "
                                  f"{shape} needs {int(np.prod(shape))} (a truncated file?)")
        return torch.from_numpy(arr.reshape(shape).copy())


_SHARDED = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}


def _projection(name: str) -> str:
    """``model.layers.3.self_attn.k_proj.weight`` -> ``model.layers.3.qkv``: the packed projection a tensor is a
    part of ('' for any other)."""
    parts = name.split(".")
    ok = len(parts) > 2 and parts[-1] == "weight" and parts[-2] in _SHARDED
    return ".".join(parts[:3] + [_SHARDED[parts[-2]]]) if ok else ""


def why_not_packed(t: Any, name: str) -> str | None:
    """None where tensor ``t`` (Hugging Face name ``name``) can stay packed; else why it cannot."""
    if not name.endswith(("_proj.weight", "lm_head.weight", "embed_tokens.weight")) or len(t.shape) != 2:
        return ""  # not a linear or embedding weight: dequantized as any other tensor, without a warning
    return gguf_cpu.runnable(t.tensor_type.name)


def unpermute(w: torch.Tensor | GgufWeight, n_head: int) -> torch.Tensor | GgufWeight:
    """unpermute_qk on a dense tensor, or on a packed weight's rows (each row is whole blocks)."""
    if isinstance(w, GgufWeight):
        return GgufWeight(unpermute_qk(w.data, n_head).contiguous(), w.kind, w.shape)
    return unpermute_qk(w, n_head)


def action(kind: str, quantization: str | None, kept: int = 0, n: int = 0) -> str:
    """What loading does to the ``n`` tensors of ggml type ``kind`` (the log line and the loader's report), ``kept``
    of them staying packed."""
    done = "kept" if kind == "F32" else f"converted from {kind}" if kind in PLAIN_TYPES else \
        f"dequantized from {kind} at load" if not kept else "kept packed" if kept == n else \
        f"{kept} kept packed, the others dequantized from {kind} at load"
    if not quantization:
        return done
    note = (" (the int8 kernels take one scale per output channel, not Q8_0's per-32-value blocks)"
            if kind == "Q8_0" else "")
    return f"{done}; linear weights then requantized to int8 per output channel for {quantization}{note}"


def hf_name(gguf_name: str) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``; None for a name we do not map."""
    stem, _, kind = gguf_name.rpartition(".")
    if stem in _GLOBAL_NAMES and kind in ("weight", "bias"):
        return f"{_GLOBAL_NAMES[stem]}.{kind}"
    m = _BLOCK_RE.match(gguf_name)
    if m is None or m.group(2) not in _BLOCK_NAMES:
        return None
    return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"


def unpermute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's ``permute`` of q/k rows (convert_hf_to_gguf.py: LlamaModel.permute)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def open_checkpoint(path: Path) -> GgufCheckpoint:
    """Open and check a GGUF file: readable, every tensor's data inside the file, an architecture we run.
    Each failure is a ValidationError naming the file and what is wrong."""
    reader = read_gguf(path)
    for t in reader.tensors:
        if t.data.nbytes < t.n_bytes:
            raise ValidationError(f"GGUF file {path} is truncated: tensor {t.name} needs {t.n_bytes} bytes, "
                                  f"the file holds {t.data.nbytes} of them")
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValidationError(f"GGUF file {path}: architecture {arch!r} is not one this service runs "
                              f"(supported: {sorted(ARCHITECTURES)})")
    hf_arch, permute = ARCHITECTURES[arch]
    if arch == "llama" and "mistral" in str(_field(reader, "general.name") or "").lower():
        hf_arch, permute = _MISTRAL
    ckpt = GgufCheckpoint(path, reader, arch, hf_arch, permute)
    ckpt.hf_config = _model_config(path)
    return ckpt


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return None
    try:
        return f.contents()
    except (ValueError, IndexError) as exc:
        raise ValidationError(f"GGUF file {reader.data.filename}: metadata {key} is malformed ({exc})") from exc


def _model_config(path: Path) -> Any:
    """The model config from the file's metadata: our own dataclass where it covers the file (models/gguf_config.py:
    a llama file's metadata read from our parse, no transformers config class or GGUF integration imported), else
    transformers' config class."""
    try:
        raw = raw_config(read_gguf(path))
        if raw is None:
            from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
            with shared_reader(path):
                raw = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    except (ValueError, KeyError, IndexError, OSError) as exc:
        raise ValidationError(f"GGUF file {path}: its metadata does not make a model config ({exc})") from exc
    return light_config(raw) or transformers_config(path)


def transformers_config(path: Path) -> Any:
    """transformers' config class for the file (what ``save_pretrained`` writes, and the config where ours does not
    cover the file)."""
    from transformers import AutoConfig
    try:
        with shared_reader(path):
            return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    except (ValueError, KeyError, OSError) as exc:
        raise ValidationError(f"GGUF file {path}: its metadata does not make a model config ({exc})") from exc


def load_tokenizer(path: str | Path, trust_remote_code: bool = False, chat_template: str | None = None) -> Any:
    """The checkpoint's tokenizer: from a GGUF file's ``tokenizer.ggml.*`` (and chat template; ours or
    transformers' build, ``_gguf_tokenizer``), or ``AutoTokenizer.from_pretrained(path)`` for a Hugging Face folder;
    ``chat_template`` replaces the checkpoint's (vLLM's --chat-template)."""
    file = find_gguf(path)
    if file is None:
        from transformers import AutoTokenizer
        return _with_template(AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code),
                              chat_template)
    # One object per file while anyone holds it (~14 MB on SmolLM2, seconds to parse): callers share it read-only
    # (no caller changes its truncation, padding or tokens, so concurrent encodes and decodes only read it).
    key = (str(file.resolve()), file.stat().st_mtime_ns, chat_template)
    with _shared_lock:
        tok = _shared_tokenizers.get(key)
        if tok is None:
            tok = _shared_tokenizers[key] = _with_template(_gguf_tokenizer(file), chat_template)
    return tok


def _with_template(tok: Any, chat_template: str | None) -> Any:
    """``tok`` with ``chat_template`` in place of the checkpoint's own, when given."""
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


_shared_tokenizers: weakref.WeakValueDictionary[tuple[str, int, str | None], Any] = weakref.WeakValueDictionary()
_shared_lock = threading.Lock()


def _gguf_tokenizer(p: Path) -> Any:
    reader = read_gguf(p)
    if _field(reader, "general.architecture") in LIGHT_TYPES:
        # What AutoTokenizer returns for a llama GGUF (its model type maps to no tokenizer class of its own): built
        # from our parse where models/gguf_tokenizer.py covers the file (no transformers GGUF import), else by
        # transformers without the model config AutoTokenizer builds to find that out (models/gguf_config.py).
        tok = light_tokenizer(p, reader)
        if tok is not None:
            return tok
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
        with shared_reader(p):
            return TokenizersBackend.from_pretrained(str(p.parent), gguf_file=p.name)
    with shared_reader(p):
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)


def export_folder(path: str | Path, dst: str | Path, with_tokenizer: bool = True) -> Path:
    """Write a GGUF checkpoint as a Hugging Face folder (config.json, model.safetensors in fp32 with q/k rows
    in Hugging Face's order, the tokenizer and chat template): what ``mindie-service quantize`` reads, and a
    folder transformers loads without ``gguf_file``. A tied head is written once, as the embeddings.
    ``with_tokenizer=False`` leaves the tokenizer out (weights only, e.g. for a teacher-forced evaluation)."""
    from safetensors.torch import save_file
    file = find_gguf(path)
    if file is None:
        raise ValidationError(f"Parameter model must be a .gguf file or a folder holding one, got {str(path)!r}")
    ckpt = open_checkpoint(file)
    out = Path(dst)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.contiguous() for name, t in ckpt.tensors()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = transformers_config(file)
    cfg.architectures = [ckpt.architecture]
    cfg.torch_dtype = "float32"
    cfg.save_pretrained(str(out))
    raw = (out / "config.json").read_text(encoding="utf-8")
    if '"torch_dtype"' not in raw and '"dtype"' not in raw:  # MindIE requires one of them
        import json
        d = json.loads(raw)
        d["torch_dtype"] = "float32"
        (out / "config.json").write_text(json.dumps(d, indent=2), encoding="utf-8")
    has_tokenizer = "tokenizer.ggml.model" in ckpt.reader.fields
    if with_tokenizer and has_tokenizer:
        load_tokenizer(file).save_pretrained(str(out))
    elif with_tokenizer:
        logger.warning("%s holds no tokenizer (tokenizer.ggml.*): the folder %s has none either", file.name, out)
    logger.info("wrote %s as a Hugging Face folder %s", file.name, out)
    return out
