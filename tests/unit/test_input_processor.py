"""The input processor: the one path from a prompt to an EngineRequest (tokenize, media, truncate, the
length rule, vocabulary, placeholders, adapters), on the tiny demo model's tokenizer and a stand-in
media encoder (the real encoders are held to transformers in test_multimodal_models)."""
from __future__ import annotations

import asyncio
import base64
import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from transformers import AutoTokenizer

from mindie_service.devkit import synth
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.errors import ValidationError
from mindie_service.inputs import (InputLimits, InputProcessor, PartsPrompt, TextPrompt, TokensPrompt, fit_prompt,
                                   hf_tokenize)
from mindie_service.sampling_params import SamplingParams, unknown_adapter_message
from multimodal import MediaItem, MediaPolicy, TextPart

GREEDY = SamplingParams(max_tokens=4, temperature=0.0)
PLACEHOLDER = 7  # the stand-in encoder's media token: 3 per image


@pytest.fixture(scope="module")
def tok(tiny_model):
    return hf_tokenize(AutoTokenizer.from_pretrained(str(tiny_model)))


def proc(tok, max_input_len: int = 32, truncation: bool = False, **kw: Any) -> InputProcessor:
    return InputProcessor(tok, InputLimits(max_input_len, truncation, 2048), **kw)


@dataclass
class _Prompt:
    prompt_token_ids: list[int]
    mm_inputs: Any
    mm_hashes: tuple[str, ...]


class FakeImageEncoder:
    """A media encoder in the MediaEncoder shape: text parts -> 20 + character count, image -> 3 placeholders."""

    modalities = ("image",)
    sampling_rate = None

    def __init__(self) -> None:
        self.prepared: list[list[Any]] = []

    def prepare(self, parts: list[Any]) -> _Prompt:
        self.prepared.append(list(parts))
        ids, n, hashes = [1], 0, []
        for p in parts:
            kind = p["type"] if isinstance(p, dict) else p.kind
            if kind == "text":
                ids.append(20 + len(p["text"] if isinstance(p, dict) else p.payload))
            else:
                ids += [PLACEHOLDER] * 3
                n += 3
                hashes.append(p.get("hash", "h") if isinstance(p, dict) else p.sha256)
        return _Prompt(ids, {"num_embeds": n} if n else None, tuple(hashes))

    def check_prompt(self, ids: list[int], mm: Any) -> None:
        got, want = ids.count(PLACEHOLDER), (mm or {}).get("num_embeds", 0)
        if got != want:
            raise ValidationError(f"placeholder count {got} != {want}")


# -- text and token ids ----------------------------------------------------------------------------
def test_text_is_tokenized_into_a_frozen_engine_request(tok):
    req = proc(tok).process(TextPrompt("River mountain"), GREEDY, request_id="r1")
    assert req.request_id == "r1" and req.prompt_token_ids == tuple(tok("River mountain"))
    assert req.params is GREEDY and req.mm_inputs is None and req.mm_hashes == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.prompt_token_ids = ()  # type: ignore[misc]


def test_truncate_keeps_the_last_tokens(tok):
    ids = tok("one two three four five six")
    p = proc(tok)
    assert p.process(TextPrompt("one two three four five six"), GREEDY, request_id="r", truncate=3
                     ).prompt_token_ids == tuple(ids[-3:])
    assert p.process(TokensPrompt(tuple(ids)), GREEDY, request_id="r", truncate=100).prompt_token_ids == tuple(ids)


def test_the_length_rule_refuses_or_cuts_with_truncation_on(tok):
    text = "one two three four five six seven"
    n = len(tok(text))
    with pytest.raises(ValidationError) as e:
        proc(tok, max_input_len=4).process(TextPrompt(text), GREEDY, request_id="r")
    assert "at most 4 tokens" in str(e.value) and f"got {n} tokens" in str(e.value)
    cut = proc(tok, max_input_len=4, truncation=True).process(TextPrompt(text), GREEDY, request_id="r")
    assert cut.prompt_token_ids == tuple(tok(text)[-4:])


def test_the_limit_is_the_smaller_of_the_config_and_the_kv_pool():
    cfg = EngineConfig(model="x", max_seq_len=512, max_input_token_len=400)
    assert InputLimits.of(effective_max_input_len=cfg.effective_max_input_len, pool_tokens=4096, truncation=False,
                          vocab_size=10).max_input_len == 400
    assert InputLimits.of(effective_max_input_len=cfg.effective_max_input_len, pool_tokens=64, truncation=False,
                          vocab_size=10).max_input_len == 63
    assert fit_prompt([1, 2, 3], None, InputLimits(3, False, 10)) == (1, 2, 3)


@pytest.mark.parametrize("ids, needle", [
    ((5, 2048), "got [2048]"), ((-1,), "got [-1]"), ((True, 5), "got [True]"), ((), "at least one token"),
])
def test_token_ids_must_be_in_the_vocabulary(tok, ids, needle):
    with pytest.raises(ValidationError) as e:
        proc(tok).process(TokensPrompt(ids), GREEDY, request_id="r")
    assert needle in str(e.value)


# -- adapters --------------------------------------------------------------------------------------
def test_adapter_names_are_resolved_live(tok):
    loaded: set[str] = set()
    p = proc(tok, adapter_names=lambda: loaded)
    assert p.process(TextPrompt("hi"), dataclasses.replace(GREEDY, adapter_id="None"),
                     request_id="r").params.adapter_id is None
    with pytest.raises(ValidationError) as e:
        p.process(TextPrompt("hi"), dataclasses.replace(GREEDY, adapter_id="lora-a"), request_id="r")
    assert str(e.value) == unknown_adapter_message("lora-a")
    loaded.add("lora-a")  # loaded at run time: known from now on
    assert p.process(TextPrompt("hi"), dataclasses.replace(GREEDY, adapter_id="lora-a"),
                     request_id="r").params.adapter_id == "lora-a"


# -- media -----------------------------------------------------------------------------------------
def test_media_on_a_text_model_names_the_part_and_its_kind(tok):
    prompt = PartsPrompt((TextPart(0, "hi"), MediaItem(1, "image", "/x.png")), "hi")
    with pytest.raises(ValidationError, match=r"inputs\[1\].*takes no image input, got image_url"):
        proc(tok).process(prompt, GREEDY, request_id="r")
    with pytest.raises(ValidationError, match="takes no media"):
        proc(tok).process(PartsPrompt(({"type": "text", "text": "hi"},)), GREEDY, request_id="r")


def test_media_prompt_is_built_by_the_model_encoder(tok):
    enc = FakeImageEncoder()
    p = proc(tok, mm_encoder=enc)
    parts = ({"type": "text", "text": "abc"}, {"type": "image", "image": object(), "hash": "cafe"})
    req = p.process(PartsPrompt(parts), GREEDY, request_id="r")
    assert req.prompt_token_ids == (1, 23, 7, 7, 7) and req.mm_inputs == {"num_embeds": 3}
    assert req.mm_hashes == ("cafe",) and p.modalities == frozenset({"image"})
    # a video is images: an image model takes it; audio it does not
    assert p.process(PartsPrompt(({"type": "video", "video": [object()]},)), GREEDY, request_id="v").mm_inputs
    with pytest.raises(ValidationError, match=r"inputs\[0\].*takes no audio"):
        p.process(PartsPrompt(({"type": "audio", "audio": [0.0]},)), GREEDY, request_id="r")


def test_placeholders_typed_as_text_or_cut_are_refused(tok):
    p = proc(tok, max_input_len=4, truncation=True, mm_encoder=FakeImageEncoder())
    with pytest.raises(ValidationError, match="placeholder"):
        p.process(TokensPrompt((1, PLACEHOLDER, 9)), GREEDY, request_id="r")
    # 1 + 3 placeholders + 1 text token = 5 > 4: never cut (it would drop placeholders), even with truncation on
    parts = ({"type": "image", "image": object()}, {"type": "text", "text": "x"})
    with pytest.raises(ValidationError, match="at most 4 tokens.*media placeholders expanded"):
        p.process(PartsPrompt(parts), GREEDY, request_id="r")
    with pytest.raises(ValidationError, match="truncate"):
        p.process(PartsPrompt(parts[:1]), GREEDY, request_id="r", truncate=2)


def test_http_media_are_fetched_and_decoded_then_processed_off_the_loop(tok):
    enc = FakeImageEncoder()
    threads: list[str] = []

    def tracking(text: str) -> list[int]:
        threads.append(threading.current_thread().name)
        return tok(text)

    p = InputProcessor(tracking, InputLimits(32, False, 2048), mm_encoder=enc)
    uri = "data:image/png;base64," + base64.b64encode(synth.image_bytes(8, 8, "PNG")).decode()
    prompt = PartsPrompt((TextPart(0, "what"), MediaItem(1, "image", uri)), "what")

    async def main():
        with ThreadPoolExecutor(1, thread_name_prefix="tokenize") as pool:
            media = await p.process_async(prompt, GREEDY, request_id="m", truncate=None, executor=pool,
                                          media_policy=MediaPolicy())
            text = await p.process_async(TextPrompt("River"), GREEDY, request_id="t", truncate=None, executor=pool)
        return media, text

    media, text = asyncio.run(main())
    [loaded] = enc.prepared
    assert [part.kind for part in loaded] == ["text", "image"] and loaded[1].payload.size == (8, 8)
    assert media.prompt_token_ids == (1, 24, 7, 7, 7) and media.mm_hashes == (loaded[1].sha256,)
    assert text.prompt_token_ids == tuple(tok("River")) and threads == ["tokenize_0"]


def test_media_are_refused_before_anything_is_fetched(tok):
    fetched = MediaItem(0, "image", "http://10.0.0.1/never.png")  # a refused source would be a 403

    async def main():
        with ThreadPoolExecutor(1) as pool:
            await proc(tok).process_async(PartsPrompt((fetched,)), GREEDY, request_id="r", truncate=None,
                                          executor=pool, media_policy=MediaPolicy())

    with pytest.raises(ValidationError) as e:
        asyncio.run(main())
    assert e.value.status == 422 and "takes no image" in str(e.value)
