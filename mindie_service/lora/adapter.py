"""Read and validate one PEFT LoRA adapter folder against the loaded base model.

A PEFT folder holds ``adapter_config.json`` and ``adapter_model.safetensors`` with keys like
``base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight`` (A: [r, in], B: [out, r]).
The result keeps, per (layer, checkpoint module), A and B with PEFT's scaling folded into B:
``delta(x) = x @ A.T @ B_scaled.T``. Every problem raises a ValidationError (a ValueError, 422
when it comes from a request) that names the adapter."""
from __future__ import annotations

import json
import math
import re
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from mindie_service.errors import ValidationError
from npu_ops.platform import host_device

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

# checkpoint module -> (parent in a decoder layer, our module, shard index within it)
TARGETS: dict[str, tuple[str, str, int]] = {
    "q_proj": ("self_attn", "qkv_proj", 0), "k_proj": ("self_attn", "qkv_proj", 1),
    "v_proj": ("self_attn", "qkv_proj", 2), "o_proj": ("self_attn", "o_proj", 0),
    "gate_proj": ("mlp", "gate_up_proj", 0), "up_proj": ("mlp", "gate_up_proj", 1),
    "down_proj": ("mlp", "down_proj", 0),
}
NAME_RE = re.compile(r"^[A-Za-z0-9_./-]{1,256}$")
# Plain LMs: base_model.model.model.layers.N...; multimodal wrappers put the LM under language_model.
_KEY_RE = re.compile(r"^(?:base_model\.model\.)?(?:model\.)?(?:language_model\.)?(?:model\.)?"
                     r"layers\.(\d+)\.(self_attn|mlp)\.(\w+)"
                     r"\.lora_([AB])(?:\.[A-Za-z0-9_-]+)?\.weight$")


@dataclass(frozen=True)
class TargetShape:
    module: str  # our (possibly packed) module
    shard: int
    offset: int  # start of this shard in the module's output
    in_features: int
    out_features: int


def target_shapes(model: nn.Module) -> dict[str, TargetShape]:
    """in/out features of every LoRA-able checkpoint module of the base model."""
    layer = model.layers[0]
    out: dict[str, TargetShape] = {}
    for sub, (parent, module, shard) in TARGETS.items():
        linear = getattr(getattr(layer, parent), module)
        sizes = model.shard_sizes(module) if module in ("qkv_proj", "gate_up_proj") else [linear.out_features]
        out[sub] = TargetShape(module, shard, sum(sizes[:shard]), linear.in_features, sizes[shard])
    return out


@dataclass
class LoraAdapter:
    """One loaded adapter. ``identity`` is new on every load: a reload under the same name is a new
    adapter for the prefix cache."""

    name: str
    path: str
    rank: int  # largest rank over its modules
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]  # (layer, ckpt module) -> (A, B*scale)
    identity: bytes = field(default_factory=lambda: uuid.uuid4().bytes)
    refs: int = 0  # live requests naming it (waiting or running): unload is refused while > 0
    slot: int = 0  # pool slot while resident, 0 when not

    @property
    def cache_key(self) -> bytes:
        return b"lora:" + self.identity

    @property
    def targets(self) -> list[str]:
        return sorted({m for _, m in self.weights}, key=list(TARGETS).index)

    def info(self) -> dict[str, Any]:
        """What clients may see: never the server's filesystem path."""
        return {"name": self.name, "rank": self.rank, "targets": self.targets,
                "id": self.identity.hex(), "resident": self.slot > 0, "in_use": self.refs}


def _fail(name: str, why: str) -> ValidationError:
    return ValidationError(f"LoRA adapter {name!r}: {why}")


def _pattern_value(patterns: dict[re.Pattern[str], Any], key: str, default: Any) -> Any:
    """PEFT's rank_pattern / alpha_pattern lookup (peft.utils.other.get_pattern_key): first pattern
    matching the end of the module's dotted name. The patterns were checked by ``_compile_patterns``."""
    for rx, value in patterns.items():
        if rx.match(key):
            return value
    return default


MAX_PATTERN_LEN = 256
MAX_PATTERN_QUANTIFIERS = 2
MAX_RANK = 65536
MAX_ALPHA = 1e6
# Shapes that make a backtracking matcher exponential or slow: a quantified group ("(a|.)*", "(.*)*"),
# backreferences, lookarounds, possessive/atomic forms; counted quantifiers outside a class.
_UNSAFE = re.compile(r"\)\s*[*+?{]|\\[1-9]|\(\?[=!<>P]")
_QUANTIFIER = re.compile(r"(?<!\\)[*+{]")


def _compile_patterns(name: str, field_name: str, raw: Any, check_value: Any) -> dict[re.Pattern[str], Any]:
    r"""rank_pattern / alpha_pattern: matched the way PEFT does (``(.*\.)?(<key>)$``), but only keys a
    backtracking matcher runs in bounded time on: a key like ``(\w|.)*Z`` would hold the GIL for minutes."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _fail(name, f"{field_name} must be an object of pattern -> value, got {type(raw).__name__}")
    out: dict[re.Pattern[str], Any] = {}
    for pat, value in raw.items():
        shown = pat if len(pat) <= 40 else pat[:40] + "..."
        if not (0 < len(pat) <= MAX_PATTERN_LEN):
            raise _fail(name, f"{field_name} keys must be 1 to {MAX_PATTERN_LEN} characters, got {shown!r}")
        if _UNSAFE.search(pat) or len(_QUANTIFIER.findall(pat)) > MAX_PATTERN_QUANTIFIERS:
            raise _fail(name, f"{field_name} key {shown!r} is refused: quantified groups, backreferences, "
                              f"lookarounds and more than {MAX_PATTERN_QUANTIFIERS} quantifiers risk unbounded "
                              f"matching time")
        try:
            rx = re.compile(rf"(.*\.)?({pat})$")
        except re.error as exc:
            raise _fail(name, f"{field_name} key {shown!r} is not a valid pattern ({exc})") from None
        out[rx] = check_value(f"{field_name}[{shown!r}]", value)
    return out


def _rank(name: str, what: str, v: Any) -> int:
    if not (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_RANK):
        raise _fail(name, f"{what} must be an integer in [1, {MAX_RANK}], got {v!r}")
    return v


def _alpha(name: str, what: str, v: Any) -> float:
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and 0 < v <= MAX_ALPHA):
        raise _fail(name, f"{what} must be a number in (0, {MAX_ALPHA:g}], got {v!r}")
    return float(v)


def read_config(name: str, folder: Path) -> dict[str, Any]:
    try:
        cfg = json.loads((folder / CONFIG_FILE).read_text())
    except FileNotFoundError:
        raise _fail(name, f"{CONFIG_FILE} not found in {str(folder)!r}") from None
    except (OSError, ValueError) as exc:
        raise _fail(name, f"unreadable {CONFIG_FILE} ({exc})") from None
    if not isinstance(cfg, dict):
        raise _fail(name, f"{CONFIG_FILE} must hold a JSON object")
    peft_type = str(cfg.get("peft_type", "LORA")).upper()
    refuse = [(peft_type != "LORA", f"peft_type must be LORA, got {peft_type!r}"),
              (bool(cfg.get("use_dora")), "DoRA (use_dora) is not supported"),
              (cfg.get("bias", "none") != "none", f"bias must be 'none', got {cfg.get('bias')!r}"),
              (bool(cfg.get("lora_bias")), "lora_bias is not supported"),
              (bool(cfg.get("modules_to_save")), "modules_to_save is not supported"),
              (bool(cfg.get("fan_in_fan_out")), "fan_in_fan_out is not supported"),
              (bool(cfg.get("use_rslora")) and bool(cfg.get("rank_pattern") or cfg.get("alpha_pattern")),
               "use_rslora together with rank_pattern/alpha_pattern is not supported")]
    for bad, why in refuse:
        if bad:
            raise _fail(name, why)
    cfg["r"] = _rank(name, "r", cfg.get("r", 8))
    cfg["lora_alpha"] = _alpha(name, "lora_alpha", cfg.get("lora_alpha", 8))
    if not isinstance(cfg.get("use_rslora", False), bool):
        raise _fail(name, f"use_rslora must be a boolean, got {cfg.get('use_rslora')!r}")
    cfg["rank_pattern"] = _compile_patterns(name, "rank_pattern", cfg.get("rank_pattern"),
                                            lambda what, v: _rank(name, what, v))
    cfg["alpha_pattern"] = _compile_patterns(name, "alpha_pattern", cfg.get("alpha_pattern"),
                                             lambda what, v: _alpha(name, what, v))
    targets = cfg.get("target_modules")
    if targets is not None and not (isinstance(targets, str) or
                                    (isinstance(targets, list) and all(isinstance(t, str) for t in targets))):
        raise _fail(name, f"target_modules must be a string or a list of strings, got {targets!r}")
    if isinstance(targets, list):
        unsupported = sorted({str(t) for t in targets if str(t).rsplit(".", 1)[-1] not in TARGETS})
        if unsupported:
            raise _fail(name, f"unsupported target modules {unsupported} (supported: {', '.join(TARGETS)})")
    return cfg


def read_adapter(name: str, path: str | Path, model: nn.Module, max_rank: int,
                 dtype: torch.dtype, device: torch.device | None = None) -> LoraAdapter:
    """Load and validate a PEFT adapter for ``model``; tensors land on ``device`` (default: host memory)
    in ``dtype``."""
    device = device if device is not None else host_device()
    if not isinstance(name, str) or not NAME_RE.match(name) or name == "None":
        raise ValidationError(f"Parameter lora_name must match ^[A-Za-z0-9_./-]{{1,256}}$ and not be 'None', "
                              f"got {name!r}")
    folder = Path(path)
    wfile = folder / WEIGHTS_FILE
    if not (folder.is_dir() and (folder / CONFIG_FILE).is_file() and wfile.is_file()):
        # One message whichever part is missing: a client must not learn which server folders exist.
        raise _fail(name, f"path {str(path)!r} is not an existing folder holding both adapter files "
                          f"({CONFIG_FILE} not found or {WEIGHTS_FILE} not found)")
    cfg = read_config(name, folder)
    shapes = target_shapes(model)
    # A tensor-parallel rank (models/shard.py) checks the adapter against the whole model, then keeps its shard.
    plan = getattr(model, "tp_plan", None)
    if plan is not None:
        shapes = {s: replace(sh, in_features=i, out_features=o) for s, sh in shapes.items()
                  for i, o in [plan.lora_full_features()[s]]}
    pairs = _read_pairs(name, wfile, len(model.layers))
    # delta(x) = x A^T B^T: |delta| <= r * in * max|A| * max|B| * max|x|; over this the model's own dtype
    # overflows on ordinary activations and the logits turn NaN (lora_alpha 3e38 did).
    bound = min(1e12, torch.finfo(dtype).max / 1e4) if dtype.is_floating_point else 1e12
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for (layer, sub), ab in sorted(pairs.items()):
        where = f"layers.{layer}.{TARGETS[sub][0]}.{sub}"
        a32, b32 = _scaled_pair(name, where, ab, shapes[sub], cfg, max_rank, dtype, bound)
        if plan is not None:
            a32, b32 = plan.shard_lora(sub, a32, b32)
        weights[(layer, sub)] = (a32.to(device, dtype).contiguous(), b32.to(device, dtype).contiguous())
    rank = max(a.shape[0] for a, _ in weights.values())
    return LoraAdapter(name=name, path=str(path), rank=rank, weights=weights)


def _read_pairs(name: str, wfile: Path, layers: int) -> dict[tuple[int, str], dict[str, torch.Tensor]]:
    """The adapter file's tensors by (layer, target) and "A"/"B"; any other tensor is refused."""
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    try:
        with safe_open(str(wfile), framework="pt") as f:
            for key in f.keys():
                m = _KEY_RE.match(key)
                if m is None or m.group(3) not in TARGETS or TARGETS[m.group(3)][0] != m.group(2):
                    raise _fail(name, f"unsupported tensor {key!r} (only lora_A/lora_B of "
                                      f"{', '.join(TARGETS)} in decoder layers are supported)")
                layer = int(m.group(1))
                if layer >= layers:
                    raise _fail(name, f"tensor {key!r} names layer {layer}, the base model has {layers} layers")
                pairs.setdefault((layer, m.group(3)), {})[m.group(4)] = f.get_tensor(key)
    except SafetensorError as exc:
        raise _fail(name, f"unreadable {WEIGHTS_FILE} ({exc})") from None
    if not pairs:
        raise _fail(name, "holds no LoRA weights")
    return pairs


def _scaled_pair(name: str, where: str, ab: dict[str, torch.Tensor], shape: TargetShape, cfg: dict[str, Any],
                 max_rank: int, dtype: torch.dtype, bound: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``where``'s lora_A and lora_B checked against the base model's ``shape`` and the config's rank, in fp32,
    B scaled by lora_alpha / r (or / sqrt(r) with rsLoRA); refused when their product could overflow ``dtype``
    (its gain over ``bound``)."""
    if set(ab) != {"A", "B"}:
        raise _fail(name, f"{where} lacks lora_{'B' if 'A' in ab else 'A'}")
    a, b = ab["A"], ab["B"]
    r = a.shape[0] if a.dim() == 2 else -1
    if r == 0:
        raise _fail(name, f"{where} has rank 0")
    if r > max_rank:
        raise _fail(name, f"rank {r} of {where} exceeds maxLoraRank ({max_rank})")
    if a.dim() != 2 or b.dim() != 2 or tuple(a.shape) != (r, shape.in_features) \
            or tuple(b.shape) != (shape.out_features, r):
        raise _fail(name, f"{where} has lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)}; the base model "
                          f"needs ({r}, {shape.in_features}) and ({shape.out_features}, {r}) "
                          f"(adapter built for a different base model?)")
    module_key = f"model.{where}"
    r_cfg = _pattern_value(cfg["rank_pattern"], module_key, cfg.get("r", 8))
    if r_cfg != r:
        raise _fail(name, f"{where} has rank {r} but adapter_config.json says {r_cfg}")
    alpha = float(_pattern_value(cfg["alpha_pattern"], module_key, cfg["lora_alpha"]))
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    a32, b32 = a.float(), b.float() * scale
    if not (torch.isfinite(a32).all() and torch.isfinite(b32).all()):
        raise _fail(name, f"{where} holds non-finite values (after scaling by lora_alpha / r = {scale:g})")
    gain = r * shape.in_features * float(a32.abs().max()) * float(b32.abs().max())
    if not gain <= bound:
        raise _fail(name, f"{where}: its scaled weights (lora_alpha / r = {scale:g}) could overflow "
                          f"{str(dtype).removeprefix('torch.')} (r x in_features x max|A| x max|B| = {gain:g}, "
                          f"limit {bound:g})")
    return a32, b32
