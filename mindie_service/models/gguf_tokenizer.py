"""A llama GGUF's byte-level BPE tokenizer built from its ``tokenizer.ggml.*`` metadata with the ``tokenizers`` library.

transformers' GGUF tokenizer path (``TokenizersBackend.from_pretrained(dir, gguf_file=...)``) imports its GGUF
integration (with the tokenizer classes of six model families) and reads the file a second time; with the config
read from our parse too (gguf_config.raw_config) a llama load imports none of it (issue 44: RSS after load and at the
end of a run, a few MiB). This builds the same object from our one parse (models/gguf_reader.py): the backend
transformers' ``GPT2Tokenizer`` and its GGUF helpers make (the vocabulary respelt in the byte alphabet, the merges,
``<|endoftext|>`` as GPT2Tokenizer's default special token, control tokens as special and user-defined ones as plain
added tokens, the split regex ``tokenizer.ggml.pre`` names), wrapped in ``TokenizersBackend`` with the special
tokens, add_bos/add_eos and chat template as that path passes them. Only what it covers (``tokenizer.ggml.model``
gpt2, a ``pre`` in ``SPLITS``); anything else returns None and goes through transformers
(tests/unit/test_gguf_tokenizer.py: equal to it)."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from mindie_service.models.gguf_reader import numbers, strings

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# ``tokenizer.ggml.pre`` -> the split regex transformers (5.x, gguf_tokenizer_mapping.GGUF_PRE_TOKENIZER_SPLITS) puts
# before the byte-level step; None: it puts none, ByteLevel's own GPT-2 regex splits (SmolLM2's "smollm", a file
# with no ``pre``). Any other name is not built here.
SPLITS: dict[str | None, str | None] = {
    None: None, "default": None, "gpt2": None, "smollm": None,
    **{name: _LLAMA3_SPLIT for name in ("llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx")},
}
_ENDOFTEXT = "<|endoftext|>"  # GPT2Tokenizer's default unk/bos/eos, which it adds to any vocabulary
_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values
_SPECIAL_IDS = (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("unk_token", "unknown_token_id"),
                ("pad_token", "padding_token_id"))  # wrapper argument, tokenizer.ggml.<key>
_FLAGS = (("tokenizer.chat_template", "chat_template"), ("tokenizer.ggml.add_bos_token", "add_bos_token"),
          ("tokenizer.ggml.add_eos_token", "add_eos_token"))  # passed where the file has them


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table (transformers' ``bytes_to_unicode``)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _meta(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def light_tokenizer(path: Path, reader: Any) -> Any | None:
    """The tokenizer of the GGUF file ``path`` (parsed as ``reader``) as transformers builds it, or None where this
    module does not cover the file (then transformers must build it)."""
    f = reader.fields
    if _meta(reader, "tokenizer.ggml.model") != "gpt2" or "tokenizer.ggml.merges" not in f or \
            "tokenizer.ggml.tokens" not in f or _meta(reader, "tokenizer.ggml.pre") not in SPLITS:
        return None
    n = len(f["tokenizer.ggml.tokens"].data)
    ids = {name: _meta(reader, f"tokenizer.ggml.{key}") for name, key in _SPECIAL_IDS}
    if n == 0 or any(i is not None and not 0 <= i < n for i in ids.values()):
        return None  # transformers' own error is the one to raise
    backend = _backend(reader, SPLITS[_meta(reader, "tokenizer.ggml.pre")])
    # Built once the vocabulary's strings are gone: what the wrapper keeps is not allocated among them (the arenas
    # one kept object would pin in the RSS).
    config = {name: _meta(reader, key) for key, name in _FLAGS if key in f}
    config.update({name: None if i is None else f["tokenizer.ggml.tokens"].contents(i) for name, i in ids.items()})
    from huggingface_hub import is_offline_mode  # imported by transformers already
    from transformers.tokenization_utils_tokenizers import TokenizersBackend
    # ``tokenizer_object=`` would deep-copy the backend (~30 MB on SmolLM2's vocabulary that the heap keeps after the
    # original is dropped); from_pretrained hands its GGUF backend over as it is, and so does this: __init__ keeps a
    # ``_tokenizer`` already set when it is given no other source.
    tok = TokenizersBackend.__new__(TokenizersBackend)
    tok._tokenizer = backend
    # what from_pretrained records for a file in a local folder (its init_kwargs: what save_pretrained writes)
    tok.__init__(vocab_file=None, name_or_path=str(path.parent), is_local=True, local_files_only=is_offline_mode(),
                 added_tokens_decoder={}, **config)
    return tok


def _backend(reader: Any, split: str | None) -> Any:
    """The ``tokenizers.Tokenizer`` transformers' GGUF path hands its wrapper, built by the same steps in order."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE
    tokens, merges = strings(reader.fields["tokenizer.ggml.tokens"]), strings(reader.fields["tokenizer.ggml.merges"])
    types = numbers(reader.fields["tokenizer.ggml.token_type"]) if "tokenizer.ggml.token_type" in reader.fields else []
    spelling = byte_alphabet()
    alphabet = set(spelling.values())
    vocab = {t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i
             for i, t in enumerate(tokens)}
    tok = Tokenizer(BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges], dropout=None,
                        continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
    del vocab, merges
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1", special_tokens=[])
    tok.add_tokens([AddedToken(_ENDOFTEXT, special=True)])
    control = [AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, types)
               if k == _CONTROL and set(t) <= alphabet]  # another character: a llama.cpp mislabel, as transformers
    if control:
        tok.add_special_tokens(control)
    known = tok.get_vocab()
    user = [AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, types)
            if k == _USER_DEFINED and t in known]
    if user:
        tok.add_tokens(user)
    if split is not None:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                              use_regex=False)])
    return tok
