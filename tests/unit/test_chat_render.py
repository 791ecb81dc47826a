"""Chat rendering: the tokenizer's chat template (as transformers renders it), Jan's role prefixes for a
checkpoint without one, media parts refused by text models, and multimodal chat through the processor."""
from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from mindie_service.errors import ValidationError
from mindie_service.inputs import ChatMessage, ChatPrompt, InputLimits, InputProcessor, hf_tokenize
from mindie_service.inputs.chat import ChatPrefixes, ChatRenderer
from mindie_service.sampling_params import SamplingParams
from multimodal import MediaItem

MSGS = (ChatMessage("system", "Be brief."), ChatMessage("user", "Hello there"),
        ChatMessage("assistant", "Hi."), ChatMessage("user", ("What is", "the time?")))
GREEDY = SamplingParams(max_tokens=4, temperature=0.0)


@pytest.fixture(scope="module")
def hf_tok(tiny_model):
    return AutoTokenizer.from_pretrained(str(tiny_model))


def test_template_matches_transformers(hf_tok) -> None:
    """Same ids as transformers' apply_chat_template(tokenize=True), one BOS, ending in the assistant prompt."""
    proc = InputProcessor(hf_tokenize(hf_tok), InputLimits(256, False, 2048), chat=ChatRenderer(hf_tok))
    ereq = proc.process(ChatPrompt(MSGS), GREEDY, request_id="c")
    plain = [{"role": m.role, "content": m.content if isinstance(m.content, str) else "\n".join(m.content)}
             for m in MSGS]
    want = hf_tok.apply_chat_template(plain, add_generation_prompt=True, tokenize=True)
    if isinstance(want, dict) or hasattr(want, "input_ids"):
        want = want["input_ids"]
    assert list(ereq.prompt_token_ids) == list(want)
    assert list(ereq.prompt_token_ids).count(hf_tok.bos_token_id) == 1
    assert hf_tok.decode(ereq.prompt_token_ids).endswith("<|assistant|>\n")


def test_prefixes_without_template() -> None:
    r = ChatRenderer(None)
    assert r.render(MSGS[:2]) == "SYSTEM: Be brief.\nUSER: Hello there\nASSISTANT: "
    custom = ChatRenderer(None, ChatPrefixes("<sys>", "<u>", "<a>"))
    assert custom.render(MSGS[1:2]) == "<u>Hello there\n<a>"
    seen: list[str] = []
    assert r.encode(MSGS[1:2], lambda t: seen.append(t) or [1, 2]) == [1, 2]
    assert seen == ["USER: Hello there\nASSISTANT: "]


def test_text_model_refuses_media_parts(hf_tok) -> None:
    proc = InputProcessor(hf_tokenize(hf_tok), InputLimits(256, False, 2048), chat=ChatRenderer(hf_tok))
    prompt = ChatPrompt((ChatMessage("user", ("look", MediaItem(0, "image", "data:image/png;base64,AA"))),))
    with pytest.raises(ValidationError, match="takes no image"):
        proc.validate(prompt, GREEDY)
    with pytest.raises(ValidationError, match="non-empty"):
        ChatRenderer(hf_tok).render(())


def test_bad_template_input_is_a_validation_error() -> None:
    class Raising:
        chat_template = "x"

        def apply_chat_template(self, *a, **k):
            raise RuntimeError("Conversation roles must alternate")

    with pytest.raises(ValidationError, match="alternate"):
        ChatRenderer(Raising()).render(MSGS)
