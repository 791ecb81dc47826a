"""Issue #16, item 2: the input processor never tokenizes more than the length rule can keep. A text that
cannot fit is refused before the tokenizer sees it; with truncation only a tail is tokenized, and what it
gives equals full tokenization."""
from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from mindie_service.errors import ValidationError
from mindie_service.inputs import TextPrompt
from mindie_service.inputs.limits import InputLimits
from mindie_service.inputs.processor import InputProcessor, hf_tokenize
from mindie_service.inputs.text_bound import TextBound
from mindie_service.sampling_params import SamplingParams

LIMIT = 64


class Counting:
    """A tokenizer that counts the characters it was given."""

    def __init__(self, tokenize) -> None:  # noqa: ANN001
        self.inner, self.chars = tokenize, 0

    def __call__(self, text: str) -> list[int]:
        self.chars += len(text)
        return self.inner(text)


@pytest.fixture(scope="module")
def hf(tiny_model):
    return AutoTokenizer.from_pretrained(str(tiny_model))


def _processor(hf, truncation: bool) -> tuple[InputProcessor, Counting]:
    tok = Counting(hf_tokenize(hf))
    proc = InputProcessor(tok, InputLimits(LIMIT, truncation, len(hf)))
    proc.text_bound = TextBound.of(hf, tok)  # what for_engine sets
    tok.chars = 0
    return proc, tok


def _text(n_words: int, seed: int = 0) -> str:
    rnd = random.Random(seed)
    words = ["river", "mountain", "tokenization", "the", "quick,", "fox!", "  ", "\n", "中文", "emoji😀", "12345"]
    return "".join(rnd.choice(words) + rnd.choice([" ", "", "  ", "\n"]) for _ in range(n_words))


def test_a_prompt_that_cannot_fit_is_refused_before_tokenizing(hf):
    proc, tok = _processor(hf, truncation=False)
    big = _text(200_000)  # ~1.4 MB of text for a 64-token limit
    with pytest.raises(ValidationError, match=f"at most {LIMIT} tokens"):
        proc.process(TextPrompt(big), SamplingParams(max_tokens=1), request_id="big")
    assert tok.chars == 0  # old code tokenized all of it first


def test_truncation_tokenizes_only_a_tail_equal_to_full_tokenization(hf):
    full_tok = hf_tokenize(hf)
    for seed in range(40):
        text = _text(random.Random(seed).randint(200, 3000), seed)
        for truncation, truncate in ((True, None), (False, 17), (True, 40)):
            proc, tok = _processor(hf, truncation)
            got = proc.process(TextPrompt(text), SamplingParams(max_tokens=1), request_id="t", truncate=truncate)
            keep = min(truncate or LIMIT, LIMIT)
            assert list(got.prompt_token_ids) == full_tok(text)[-keep:], (seed, truncate)
            bound = proc.text_bound
            assert tok.chars <= 2 * (keep * bound.max_token_chars + 256) + 1, (seed, truncate)  # a tail only


# -- chat messages (the OpenAI chat route): the same bound, before the chat template renders them ---------
class CountingTemplate:
    """The Hugging Face tokenizer, counting chat-template renders and the characters it tokenized."""

    def __init__(self, hf) -> None:  # noqa: ANN001
        self.hf, self.renders, self.chars = hf, 0, 0
        self.chat_template = hf.chat_template

    def apply_chat_template(self, *args, **kwargs):  # noqa: ANN002, ANN003
        self.renders += 1
        return self.hf.apply_chat_template(*args, **kwargs)

    def __call__(self, text: str, **kwargs):  # noqa: ANN003
        self.chars += len(text)
        return self.hf(text, **kwargs)


def _chat_processor(hf, truncation: bool) -> tuple[InputProcessor, CountingTemplate]:
    from mindie_service.inputs.chat import ChatRenderer
    spy = CountingTemplate(hf)
    proc = InputProcessor(hf_tokenize(hf), InputLimits(LIMIT, truncation, len(hf)), chat=ChatRenderer(spy))
    proc.text_bound = TextBound.of(hf, proc.tokenize)
    return proc, spy


def _chat(*texts: str):
    from mindie_service.inputs.types import ChatMessage, ChatPrompt
    roles = ["system"] + ["user", "assistant"] * len(texts)
    return ChatPrompt(tuple(ChatMessage(roles[i], t) for i, t in enumerate(texts)))


def test_chat_messages_that_cannot_fit_are_refused_before_rendering(hf):
    proc, spy = _chat_processor(hf, truncation=False)
    over = proc.text_bound.refuse_over(LIMIT)
    # Spread over several messages: no one of them is over the bound, all of them together are.
    chat = _chat("sys " * (over // 12), _text(over // 8), "ok " * (over // 9), "user again " * (over // 30))
    with pytest.raises(ValidationError, match=f"messages must be at most {LIMIT} tokens") as err:
        proc.process(chat, SamplingParams(max_tokens=1), request_id="chat-big")
    assert err.value.status == 422
    assert spy.renders == 0 and spy.chars == 0  # neither rendered nor tokenized
    # A chat within the bound still renders (and is then held to the token limit as before).
    small = proc.process(_chat("You are terse.", "Name a river."), SamplingParams(max_tokens=1), request_id="ok")
    assert spy.renders == 1 and 0 < len(small.prompt_token_ids) <= LIMIT


def test_a_chat_under_truncation_tokenizes_a_tail_equal_to_full_tokenization(hf):
    for seed in range(10):
        text = _text(random.Random(seed).randint(300, 3000), seed)
        proc, spy = _chat_processor(hf, truncation=True)
        got = proc.process(_chat("Be brief.", text), SamplingParams(max_tokens=1), request_id="t")
        rendered = hf.apply_chat_template([{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": text}], tokenize=False,
                                          add_generation_prompt=True)
        full = list(hf(rendered, add_special_tokens=False).input_ids)
        assert list(got.prompt_token_ids) == full[-LIMIT:], seed
        if len(rendered) > 2 * (LIMIT * proc.text_bound.max_token_chars + 256):
            assert spy.chars < len(rendered), seed  # only a tail was tokenized
