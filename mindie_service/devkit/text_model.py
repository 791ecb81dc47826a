"""Random-weight Llama demo checkpoints with a locally trained byte-level BPE tokenizer.

``write_text_checkpoint(shape, seed, folder)`` writes a Hugging Face style checkpoint (config.json,
model.safetensors, tokenizer files, generation_config.json) that both this project's engine and
``transformers`` load unchanged. Nothing is downloaded. The build is deterministic: the same shape
and seed give byte-identical files. Callers go through ``devkit.presets.build_demo_model``.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file

from mindie_service.devkit.corpus import corpus_lines

if TYPE_CHECKING:
    from tokenizers import Tokenizer

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")  # ids 0..3, in this order
UNK_ID, BOS_ID, EOS_ID, PAD_ID = range(4)

# Role-tagged turns, each closed by eos so a model that learned the format stops by itself. Tools render
# Hermes / Qwen2.5 style: their schemas in a system turn, an assistant's calls as <tool_call> JSON, a tool's
# answer as a <|tool|> turn in <tool_response>. bos comes from the template (HF convention:
# apply_chat_template(tokenize=True) encodes with add_special_tokens=False); encode rendered text with
# add_special_tokens=False to avoid a double bos. Undefined names are tested with `is defined`: clients such as
# lm-eval render the served template with jinja2's StrictUndefined.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% set tools = tools if tools is defined else none %}"
    "{% if tools %}<|system|>\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>{{ eos_token }}\n{% endif %}"
    "{% for message in messages %}"
    "{% if not (tools and loop.first and message['role'] == 'system') %}"
    "{% if message['content'] is string %}{% set content = message['content'] %}"
    "{% elif message['content'] is none %}{% set content = '' %}"
    "{% else %}{% set content = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('\\n') %}{% endif %}"
    "{% if message['role'] == 'tool' %}<|tool|>\n<tool_response>\n{{ content }}\n</tool_response>{{ eos_token }}\n"
    "{% else %}<|{{ message['role'] }}|>\n{{ content }}"
    "{% for call in (message['tool_calls'] if message['tool_calls'] is defined else none) or [] %}{% set f = call['function'] if call['function'] is defined else call %}"
    "<tool_call>\n{\"name\": \"{{ f['name'] }}\", \"arguments\": "
    "{{ f['arguments'] if f['arguments'] is string else f['arguments'] | tojson }}}\n</tool_call>"
    "{% endfor %}{{ eos_token }}\n{% endif %}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@dataclass(frozen=True)
class TextShape:
    """Shape and init scales of a demo Llama model (a preset of devkit/presets.py names one)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    # Init scales (std of normal draws); see make_weights. Chosen by measurement so that
    # greedy argmax has clear margins AND depends on attention/RoPE (so engine bugs show).
    embed_std: float = 1.0
    attn_score_std: float = 2.0  # q/k std = sqrt(attn_score_std / hidden): q.k/sqrt(d) ~ this
    proj_gain: float = 0.5  # v/o/gate/up/down std = gain / sqrt(fan_in)
    lm_head_gain: float = 4.0  # lm_head std = gain / sqrt(hidden): logit std ~4 after final norm

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


# Shapes of the text presets (the registry in devkit/presets.py names them).
TINY = TextShape(vocab_size=2048, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=352)
SMALL = TextShape(vocab_size=8192, hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                  num_key_value_heads=4, intermediate_size=1408)


def config_dict(p: TextShape) -> dict[str, Any]:
    """config.json contents: legacy keys (torch_dtype, rope_theta) plus transformers 5 ones."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "head_dim": p.head_dim,
        "hidden_act": "silu",
        "hidden_size": p.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": p.intermediate_size,
        "max_position_embeddings": p.max_position_embeddings,
        "mlp_bias": False,
        "num_attention_heads": p.num_attention_heads,
        "num_hidden_layers": p.num_hidden_layers,
        "num_key_value_heads": p.num_key_value_heads,
        "rms_norm_eps": p.rms_norm_eps,
        "rope_theta": p.rope_theta,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": p.rope_theta},
        "tie_word_embeddings": p.tie_word_embeddings,
        "torch_dtype": "float32",
        "dtype": "float32",
        "use_cache": True,
        "vocab_size": p.vocab_size,
    }


def make_weights(p: TextShape, seed: int) -> dict[str, torch.Tensor]:
    """Random fp32 weights in HF Llama naming, drawn on CPU in a fixed order from one generator."""
    g = torch.Generator().manual_seed(seed)  # host generator: same draws on every machine

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.empty(*shape, dtype=torch.float32).normal_(0.0, std, generator=g)

    h, q, kv, inter = (p.hidden_size, p.num_attention_heads * p.head_dim,
                       p.num_key_value_heads * p.head_dim, p.intermediate_size)
    qk_std = (p.attn_score_std / h) ** 0.5  # inputs are RMS-normed: q_i, k_i ~ qk_std * sqrt(h)
    w: dict[str, torch.Tensor] = {"model.embed_tokens.weight": normal(p.vocab_size, h, std=p.embed_std)}
    for i in range(p.num_hidden_layers):
        pre = f"model.layers.{i}."
        w[pre + "input_layernorm.weight"] = torch.ones(h)
        w[pre + "self_attn.q_proj.weight"] = normal(q, h, std=qk_std)
        w[pre + "self_attn.k_proj.weight"] = normal(kv, h, std=qk_std)
        w[pre + "self_attn.v_proj.weight"] = normal(kv, h, std=p.proj_gain / h ** 0.5)
        w[pre + "self_attn.o_proj.weight"] = normal(h, q, std=p.proj_gain / q ** 0.5)
        w[pre + "post_attention_layernorm.weight"] = torch.ones(h)
        w[pre + "mlp.gate_proj.weight"] = normal(inter, h, std=p.proj_gain / h ** 0.5)
        w[pre + "mlp.up_proj.weight"] = normal(inter, h, std=p.proj_gain / h ** 0.5)
        w[pre + "mlp.down_proj.weight"] = normal(h, inter, std=p.proj_gain / inter ** 0.5)
    w["model.norm.weight"] = torch.ones(h)
    if not p.tie_word_embeddings:
        w["lm_head.weight"] = normal(p.vocab_size, h, std=p.lm_head_gain / h ** 0.5)
    return w


def train_tokenizer(vocab_size: int) -> Tokenizer:
    """Byte-level BPE on the built-in corpus; prepends <s> on encode.

    The trainer is deterministic (ties broken by pair ids; checked with 1 and 2 rayon threads).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=1, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        # Ids the model can emit but the tokenizer can't decode would break detokenization.
        raise RuntimeError(f"corpus too small: tokenizer has {tok.get_vocab_size()} tokens, "
                           f"preset wants {vocab_size}; extend mindie_service/devkit/corpus.py")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)])
    return tok


def _json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_text_checkpoint(p: TextShape, seed: int, d: Path) -> None:
    """Write the whole checkpoint for shape ``p`` into the (empty) folder ``d``; config.json last."""
    tok = train_tokenizer(p.vocab_size)
    tok.save(str(d / "tokenizer.json"), pretty=True)
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    (d / "special_tokens_map.json").write_text(_json(special), encoding="utf-8")
    (d / "tokenizer_config.json").write_text(_json({
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": p.max_position_embeddings,
        "padding_side": "left",
        "chat_template": CHAT_TEMPLATE,
    }), encoding="utf-8")
    save_file(make_weights(p, seed), str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "model.safetensors").chmod(0o644)  # safetensors creates it 0600
    (d / "generation_config.json").write_text(_json({
        "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "do_sample": False,
    }), encoding="utf-8")
    # config.json last: its presence marks a complete checkpoint (see presets.build_demo_model).
    (d / "config.json").write_text(_json(config_dict(p)), encoding="utf-8")


def param_count(p: TextShape) -> int:
    """Number of parameters make_weights produces, without drawing them."""
    h, q, kv = p.hidden_size, p.num_attention_heads * p.head_dim, p.num_key_value_heads * p.head_dim
    layer = 2 * h + 2 * q * h + 2 * kv * h + 3 * h * p.intermediate_size
    return p.vocab_size * h * (1 if p.tie_word_embeddings else 2) + p.num_hidden_layers * layer + h

