"""A llama GGUF's tokenizer and config built from our own parse (models/gguf_tokenizer.py, gguf_config.raw_config)
equal what transformers' GGUF path builds (issue 44: that path's imports and second parse stay out of a serve's RSS):
on the shipped SmolLM2 file and on variants of its vocabulary written here (llama-bpe's split, add_bos/add_eos,
user-defined and mislabelled control tokens, a token outside the byte alphabet, no ``<|endoftext|>``, no chat
template). Same backend (its JSON), same wrapper arguments, and the same answers to what the engine asks: encode with
and without special tokens, decode skipping special tokens or not, ids to tokens, special ids and strings, chat
templates. A file it does not cover goes to transformers, and so does a config it does not cover."""
from __future__ import annotations

import json
import random
import weakref
from pathlib import Path
from typing import Any

import pytest

from mindie_service.models import gguf_checkpoint
from mindie_service.models.gguf_config import raw_config
from mindie_service.models.gguf_reader import read_gguf
from mindie_service.models.gguf_tokenizer import SPLITS, byte_alphabet, light_tokenizer
from mindie_service.models.packaged_models import packaged_file

SHIPPED = Path(packaged_file("SmolLM2-135M-Instruct"))
# appended to the vocabulary: (token, token_type); 1 normal, 3 control, 4 user-defined
EXTRA = [("<think>", 4), ("<|tool|>", 3), ("ctl with space", 3), ("two words", 1), ("naïve ☃", 1), ("12", 1),
         ("123", 1)]
# SmolLM2's vocabulary has no multi-digit token: with these, where llama-bpe's split cuts a number shows
DIGIT_MERGES = ["1 2", "12 3"]
PIECES = ["Hello", " world", "  ", "\t\t", "\n\n\n", "   leading", "trailing   ", "café", "naïve",
          "日本語のテキスト", "Привет", "😀🎉", "👩‍👩‍👧", "def f(x):\n    return x**2", "{\"a\": [1, 2.5e-3]}",
          "3.14159", "1234567", "4123", " 4123 ",
          "$100,000", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "<|tool|>", "two words", "naïve ☃",
          "<|im_start", "don't", "WE'LL", "x=1;y=2", "\u00a0nbsp", "\r\n", "ﬁ", "a" * 40, "\x00\x01", "مرحبا"]
CHATS = [[{"role": "user", "content": "Hi there!"}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
          {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 😀 × 3?"}]]


def _write(path: Path, src: Any, **kw: Any) -> Path:
    """A tokenizer-only llama GGUF with ``src``'s vocabulary and merges, changed as ``kw`` says."""
    import gguf
    tokens = [t for t in src.fields["tokenizer.ggml.tokens"].contents()]
    types = list(src.fields["tokenizer.ggml.token_type"].contents())
    if kw.get("rename0"):
        tokens[0] = kw["rename0"]
    if kw.get("extra"):
        tokens += [t for t, _ in EXTRA]
        types += [k for _, k in EXTRA]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(kw.get("name", "variant"))
    w.add_tokenizer_model("gpt2")
    if kw.get("pre"):
        w.add_tokenizer_pre(kw["pre"])
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(src.fields["tokenizer.ggml.merges"].contents() + (DIGIT_MERGES if kw.get("extra") else []))
    for key, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("unk", w.add_unk_token_id),
                     ("pad", w.add_pad_token_id)):
        if kw.get(key) is not None:
            add(kw[key])
    if "add_bos" in kw:
        w.add_add_bos_token(kw["add_bos"])
    if "add_eos" in kw:
        w.add_add_eos_token(kw["add_eos"])
    if kw.get("template"):
        w.add_chat_template(src.fields["tokenizer.chat_template"].contents())
    w.add_uint32("llama.block_count", 2)
    if kw.get("foreign"):
        w.add_uint32("qwen2.context_length", 64)  # another architecture's key: transformers' mapping reads it
    w.add_tensor("token_embd.weight", __import__("numpy").zeros((len(tokens), 8), "float32"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


VARIANTS = {
    "llama-bpe": dict(pre="llama-bpe", extra=True, bos=1, eos=2, unk=0, add_bos=True, add_eos=True, template=True),
    "no-endoftext": dict(rename0="<|eot|>", extra=True, eos=2, add_eos=False),
}


@pytest.fixture(scope="module", params=["shipped", *VARIANTS])
def pair(request, tmp_path_factory) -> tuple[Any, Any]:
    """(ours, transformers') for one file."""
    from transformers.tokenization_utils_tokenizers import TokenizersBackend
    path = SHIPPED
    if request.param != "shipped":
        path = _write(tmp_path_factory.mktemp(request.param) / "t.gguf", read_gguf(SHIPPED), **VARIANTS[request.param])
    ours = light_tokenizer(path, read_gguf(path))
    assert ours is not None
    return ours, TokenizersBackend.from_pretrained(str(path.parent), gguf_file=path.name)


def _texts(n: int) -> list[str]:
    rng = random.Random(44)
    return PIECES + ["".join(rng.choice(PIECES) for _ in range(rng.randint(2, 8))) for _ in range(n)]


def test_the_backend_and_the_wrapper_arguments_are_transformers(pair):
    ours, ref = pair
    assert type(ours) is type(ref)
    assert json.loads(ours.backend_tokenizer.to_str()) == json.loads(ref.backend_tokenizer.to_str())
    assert ours.init_kwargs == ref.init_kwargs
    mine, theirs = vars(ours), vars(ref)  # every attribute from_pretrained leaves, the backend apart (compared above)
    assert sorted(mine) == sorted(theirs)
    assert {k: repr(v) for k, v in mine.items() if k != "_tokenizer"} == \
        {k: repr(v) for k, v in theirs.items() if k != "_tokenizer"}
    assert ours.get_vocab() == ref.get_vocab() and len(ours) == len(ref) and ours.vocab_size == ref.vocab_size
    assert ours.added_tokens_decoder == ref.added_tokens_decoder


def test_special_tokens_ids_and_flags_are_transformers(pair):
    ours, ref = pair
    for name in ("bos", "eos", "unk", "pad"):
        assert getattr(ours, f"{name}_token") == getattr(ref, f"{name}_token"), name
        assert getattr(ours, f"{name}_token_id") == getattr(ref, f"{name}_token_id"), name
    assert (ours.all_special_ids, ours.all_special_tokens) == (ref.all_special_ids, ref.all_special_tokens)
    assert (ours.add_bos_token, ours.add_eos_token) == (ref.add_bos_token, ref.add_eos_token)
    assert ours.special_tokens_map == ref.special_tokens_map


@pytest.mark.parametrize("special", [True, False])
def test_encodes_are_transformers(pair, special):
    ours, ref = pair
    texts = _texts(300)
    got, want = ours(texts, add_special_tokens=special).input_ids, ref(texts, add_special_tokens=special).input_ids
    assert got == want
    assert ours.encode(texts[-1], add_special_tokens=special) == ref.encode(texts[-1], add_special_tokens=special)


def test_decodes_and_ids_to_tokens_are_transformers(pair):
    ours, ref = pair
    rng = random.Random(7)
    n = len(ref)
    for _ in range(200):
        # any id, the specials at the front and the added tokens at the end (<think>: user-defined, kept by a skip)
        ids = [rng.choice((rng.randrange(n), rng.randrange(24), rng.randrange(n - 10, n)))
               for _ in range(rng.randint(1, 30))]
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), ids
        assert ours.convert_ids_to_tokens(ids) == ref.convert_ids_to_tokens(ids)
    assert ours.convert_tokens_to_ids(["<think>", "<|im_end|>", "Hello"]) == \
        ref.convert_tokens_to_ids(["<think>", "<|im_end|>", "Hello"])


@pytest.mark.parametrize("gen", [True, False])
def test_chat_templates_are_transformers(pair, gen):
    ours, ref = pair
    assert ours.chat_template == ref.chat_template
    if ref.chat_template is None:
        return
    for chat in CHATS:
        got = ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
        assert got == ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
        assert ours(got, add_special_tokens=False).input_ids == ref(got, add_special_tokens=False).input_ids


def test_the_engine_gets_it_for_a_covered_file_and_transformers_for_any_other(tmp_path, monkeypatch):
    src = read_gguf(SHIPPED)
    built: list[Path] = []
    real = gguf_checkpoint.light_tokenizer
    monkeypatch.setattr(gguf_checkpoint, "light_tokenizer", lambda p, r: built.append(p) or real(p, r))
    # not the one another test of this worker still holds (load_tokenizer shares one object per file)
    monkeypatch.setattr(gguf_checkpoint, "_shared_tokenizers", weakref.WeakValueDictionary())
    tok = gguf_checkpoint.load_tokenizer(SHIPPED)
    assert built == [SHIPPED] and tok("Hello <|im_end|>").input_ids == [19556, 216, 2]
    for name, kw in {"qwen2-split": dict(pre="qwen2", eos=2), "eos-outside": dict(eos=10 ** 6)}.items():
        path = _write(tmp_path / f"{name}.gguf", src, **kw)
        assert light_tokenizer(path, read_gguf(path)) is None, name
    from transformers.tokenization_utils_tokenizers import TokenizersBackend
    path = tmp_path / "qwen2-split.gguf"
    ref = TokenizersBackend.from_pretrained(str(tmp_path), gguf_file=path.name)
    assert gguf_checkpoint.load_tokenizer(path)(_texts(20)).input_ids == ref(_texts(20)).input_ids


def test_our_tables_are_transformers():
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS
    assert byte_alphabet() == bytes_to_unicode()
    assert {name: GGUF_PRE_TOKENIZER_SPLITS.get(name) for name in SPLITS} == SPLITS


def test_a_llama_files_config_is_transformers_and_any_other_goes_to_it(tmp_path):
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    paths = [SHIPPED, _write(tmp_path / "v.gguf", read_gguf(SHIPPED), extra=True, eos=5, pad=3)]
    for path in paths:
        got, want = raw_config(read_gguf(path)), load_gguf_checkpoint(str(path), return_tensors=False)["config"]
        assert got == want and [type(v) for v in got.values()] == [type(want[k]) for k in got], path.name
    assert raw_config(read_gguf(_write(tmp_path / "m.gguf", read_gguf(SHIPPED), name="mistral"))) is None
    assert raw_config(read_gguf(_write(tmp_path / "f.gguf", read_gguf(SHIPPED), foreign=True))) is None
