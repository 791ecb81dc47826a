"""`mindie-service serve MODEL --flags` (mindie_service/vllm_cli.py): each vLLM flag taken sets its config keys,
a bad value is refused naming the flag, and any other vLLM flag is refused by name (apart from unknown flags)."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from mindie_service.cli import _parser, main
from mindie_service.config import load_config
from mindie_service.errors import ConfigError
from mindie_service.vllm_cli import config_overrides, refusal
from mindie_service.vllm_flag_names import VLLM_FLAGS
from tests.server_utils import write_config


def loaded(tmp_path: Path, *flags: str):
    cfg = write_config(tmp_path / "config.json", tmp_path / "unused", model_name="tiny")
    args, extra = _parser().parse_known_args(["serve", "--config", str(cfg), *flags])
    assert extra == []
    return load_config(cfg, overrides=config_overrides(args))


def test_the_flags_set_their_keys(tmp_path: Path):
    model = tmp_path / "ckpt"
    c = loaded(tmp_path, str(model), "--host", "0.0.0.0", "--port", "8123", "--api-key", "key-one-1",
               "--served-model-name", "qwen", "--max-model-len", "1k", "--max-num-seqs", "3",
               "--max-num-batched-tokens", "300", "--tensor-parallel-size", "2", "--dtype", "half",
               "--quantization", "w8a8", "--no-enable-prefix-caching", "--kv-cache-dtype", "int8",
               "--otlp-traces-endpoint", "http://collector:4318/v1/traces")
    s, m, e = c.server, c.models[0], c.engine_config()
    assert (s.ip_address, s.management_ip_address, s.allow_all_zero_ip) == ("0.0.0.0", "0.0.0.0", True)
    assert s.port == s.metrics_port == 8123 and s.listeners()[("0.0.0.0", 8123)] == ("business", "metrics")
    assert s.api_key_hashes == (("business", hashlib.sha256(b"key-one-1").hexdigest()),)
    assert (m.name, m.weight_path) == ("qwen", str(model))
    assert e.max_seq_len == e.max_input_token_len == e.max_iter_times == 1000
    assert (e.max_batch_size, e.max_prefill_tokens) == (3, 300) and e.max_prefill_batch_size <= 3
    assert e.world_size == 2 and c.backend.npu_device_ids == ((0, 1),) and c.backend.model_instance_number == 1
    assert (e.dtype, e.quantization, e.kv_cache_dtype, e.enable_prefix_caching) == ("float16", "w8a8", "int8", False)
    assert s.otlp_traces_endpoint == "http://collector:4318/v1/traces"
    assert e.max_loras == 0 and e.lora_modules == ()  # no --enable-lora: no adapters, as vLLM


def test_model_alone_names_the_model_by_its_argument_and_lora_flags_need_enable_lora(tmp_path: Path):
    c = loaded(tmp_path, "models/x")
    assert c.models[0].name == "x" and c.models[0].weight_path == os.path.abspath("models/x")
    lo = tmp_path / "ad"
    c = loaded(tmp_path, "m", "--enable-lora", "--max-loras", "3", "--max-lora-rank", "16", "--lora-modules",
               f"a={lo}", json.dumps({"name": "b", "path": str(lo)}))
    e = c.engine_config()
    assert (e.max_loras, e.max_lora_rank) == (3, 16) and [x.name for x in e.lora_modules] == ["a", "b"]
    assert main(["serve", "m", "--lora-modules", f"a={lo}"]) == 2


def test_speculative_config_becomes_plugin_params(tmp_path: Path):
    spec = loaded(tmp_path, "m", "--speculative-config",
                  '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5}').models[0].speculative
    assert (spec.method, spec.num_speculative_tokens, spec.prompt_lookup_max) == ("ngram", 3, 5)
    assert main(["serve", "m", "--speculative-config", '{"nope": 1}']) == 2


@pytest.mark.parametrize("flags, words", [
    (["--max-num-seqs", "0"], "(set by --max-num-seqs)"),
    (["--quantization", "awq"], "(set by --quantization)"),
    (["--kv-cache-dtype", "fp8"], "(set by --kv-cache-dtype)"),
    (["--otlp-traces-endpoint", "collector:4317"], "(set by --otlp-traces-endpoint)"),
])
def test_a_bad_value_is_refused_naming_its_flag(tmp_path: Path, flags: list[str], words: str):
    with pytest.raises(ConfigError, match=__import__("re").escape(words)):
        loaded(tmp_path, "m", *flags)


def test_a_vllm_flag_not_taken_is_refused_by_name_and_an_unknown_one_as_unknown(capsys):
    assert {"gpu-memory-utilization", "enable-chunked-prefill", "max-model-len", "chat-template"} <= VLLM_FLAGS
    assert "vLLM flag" in refusal(["--gpu-memory-utilization", "0.9"]) and "--gpu-memory-utilization" in refusal(
        ["--gpu-memory-utilization=0.9"])
    assert "vLLM flag" in refusal(["--no-enable-chunked-prefill"])
    assert refusal(["--frobnicate"]) == "unrecognized argument: --frobnicate"
    assert main(["serve", "m", "--gpu-memory-utilization", "0.9"]) == 2
    err = capsys.readouterr().err
    assert "--gpu-memory-utilization is a vLLM flag mindie-service does not take" in err
    assert main(["serve", "m", "--max-model", "9"]) == 2  # no abbreviations: vLLM's flags are matched whole
    assert "--max-model is" not in capsys.readouterr().err


def test_chat_template_from_a_file_or_inline_replaces_the_checkpoints(tmp_path: Path, tiny_model: Path):
    from mindie_service.models.gguf_checkpoint import load_tokenizer

    f = tmp_path / "t.jinja"
    f.write_text("<<{{ messages[0]['content'] }}>>")
    assert loaded(tmp_path, "m", "--chat-template", str(f)).engine_config().chat_template == f.read_text()
    inline = "[{{ messages[0]['content'] }}]"
    tmpl = loaded(tmp_path, "m", "--chat-template", inline).engine_config().chat_template
    tok = load_tokenizer(tiny_model, chat_template=tmpl)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "[hi]"
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "m", "--chat-template", str(tmp_path / "missing.jinja")])
    assert exit_.value.code == 2


def test_generation_config_vllm_auto_and_a_folder(tmp_path: Path):
    """vLLM's --generation-config: vllm (its own defaults), auto (the model folder's generation_config.json), or a
    folder; what differs from transformers' defaults becomes the OpenAI routes' defaults (get_diff_sampling_param),
    a folder's max_new_tokens also caps the output (vLLM's override_max_tokens)."""
    from transformers import GenerationConfig

    from mindie_service.catalog.generation_defaults import generation_defaults
    from mindie_service.params.defaults import RequestDefaults
    from mindie_service.protocol.openai import parse_openai
    from mindie_service.protocol.request import ProtocolLimits

    ckpt, other = tmp_path / "ckpt", tmp_path / "gen"
    gen = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20, "max_new_tokens": 50,
           "repetition_penalty": 1.1, "min_p": 0.05}
    for folder in (ckpt, other):
        folder.mkdir()
        GenerationConfig(**gen).save_pretrained(folder)
    assert loaded(tmp_path, str(ckpt), "--generation-config", "auto").models[0].generation_config == "auto"
    assert loaded(tmp_path, str(ckpt), "--generation-config", str(other)).models[0].generation_config == str(other)
    assert loaded(tmp_path, str(ckpt)).models[0].generation_config == "vllm"  # today's default kept
    with pytest.raises(ConfigError, match="generationConfig"):
        loaded(tmp_path, str(ckpt), "--generation-config", str(tmp_path))  # no generation_config.json there
    auto = generation_defaults("auto", ckpt)
    assert (auto.temperature, auto.top_p, auto.top_k, auto.max_tokens, auto.repetition_penalty, auto.min_p,
            auto.max_tokens_cap) == (0.6, 0.9, 20, 50, 1.1, 0.05, None)
    assert generation_defaults("auto", tmp_path) == generation_defaults("vllm", ckpt) == RequestDefaults()
    assert generation_defaults(str(other), ckpt).max_tokens_cap == 50

    def chat(defaults, **body):
        return parse_openai({"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}, "chat",
                            limits=ProtocolLimits(vocab_size=100), model="m", request_id="r", defaults=defaults).params
    p = chat(auto)
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens, p.repetition_penalty, p.min_p) == \
        (0.6, 0.9, 20, 50, 1.1, 0.05)
    p = chat(auto, temperature=0.2, max_tokens=80, repetition_penalty=1.0, min_p=0.0)  # the request's own win
    assert (p.temperature, p.max_tokens, p.min_p) == (0.2, 80, 0.0)
    assert chat(generation_defaults(str(other), ckpt), max_tokens=80).max_tokens == 50  # a folder's cap
    assert chat(RequestDefaults()).temperature == 1.0
    from mindie_service.catalog.catalog import Catalog

    cfg = loaded(tmp_path, str(ckpt), "--generation-config", "auto")
    cat = Catalog(cfg, tmp_path / "models", build=None)
    entry = cat.entries["ckpt"]
    entry.state, entry.engine = "running", SimpleNamespace(healthy=lambda: True, adapter_names=lambda: ())
    target = cat.resolve("ckpt")
    assert target.defaults == auto  # what the OpenAI routes' parser is handed (model.json's values over them)
    cat.release(target)
